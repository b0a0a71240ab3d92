"""Which parts get media metadata: energon 7.4.1's three filters, and its rules for naming a media kind.

energon takes exactly one of `--media-metadata-by-extension` (a known image or audio/video extension),
`--media-metadata-by-header` (every part, its kind sniffed from its first bytes by the `filetype`
library, else its extension) and `--media-metadata-by-glob PATTERNS` (comma-separated `fnmatch`
patterns, which must match both the lower-cased and the original name). The filter is stored in the
index as its strategy and its patterns joined by commas.

    >>> media = parse_media_filter(glob=None, header=False, extension=True)
    >>> media.considers("0001.JPG"), media.considers("0001.json")
    (True, False)
    >>> media.kind("0001.JPG", b"")
    'image'
    >>> parse_media_filter(glob="*.jpg,*.png", header=False, extension=False).patterns
    ('*.jpg', '*.png')
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from prep.errors import PrepError

#: The kinds of media energon records, as stored in `media_metadata.metadata_type`.
IMAGE = "image"
AV = "av"
#: The strategies, as stored in `media_filters.strategy`.
EXTENSION = "EXTENSION"
HEADER = "HEADER"
GLOB = "GLOB"
#: How many leading bytes header sniffing looks at (the `filetype` library's signature length).
PROBE_BYTES = 8192

#: energon's extensions for each kind (lower case, without the dot).
IMAGE_EXTENSIONS = frozenset(
    {"bmp", "gif", "ico", "j2k", "jp2", "jpx", "jpeg", "jpg", "png", "tif", "tiff", "webp"}
)
AV_EXTENSIONS = frozenset(
    {"aac", "avi", "flac", "m4a", "m4v", "mkv", "mov", "mp3", "mp4", "ogg", "wav", "webm"}
)

ONE_FILTER = (
    "Give exactly one of --media-metadata-by-glob, --media-metadata-by-header and"
    " --media-metadata-by-extension (several glob patterns go in one, separated by commas)."
)


@dataclass(frozen=True)
class MediaFilter:
    """One of energon's media filters: `strategy` (EXTENSION, HEADER or GLOB) and, for GLOB, its patterns."""

    strategy: str
    patterns: tuple[str, ...] = ()

    def considers(self, name: str) -> bool:
        """Whether a part called `name` (`<sample key>.<part>`) is looked at at all; cheap, by name only."""
        if self.strategy == HEADER:
            return True
        if self.strategy == EXTENSION:
            return kind_by_extension(name) is not None
        lower = name.lower()
        return any(fnmatch(lower, pattern) for pattern in self.patterns)

    @property
    def sniffs(self) -> bool:
        """Whether `kind` needs the part's first PROBE_BYTES bytes (else its name is enough)."""
        return self.strategy != EXTENSION

    def kind(self, name: str, probe: bytes) -> str | None:
        """IMAGE, AV or None (not media) for a part `considers` accepted; `probe` is its first bytes
        when `sniffs`.

        energon 7.4.1 fails the whole prepare on any part a glob selects (an assertion in its media
        detection); shardprep does what its code sets out to do there: sniff the header, then the
        extension.
        """
        if self.strategy == GLOB and not any(fnmatch(name, pattern) for pattern in self.patterns):
            return None
        if self.strategy == EXTENSION:
            return kind_by_extension(name)
        return kind_by_header(probe) or kind_by_extension(name)

    @property
    def stored_patterns(self) -> str:
        """The patterns as `media_filters.patterns` holds them."""
        return ",".join(self.patterns)

    @classmethod
    def stored(cls, strategy: str, patterns: str | None) -> MediaFilter:
        """The filter a `media_filters` row (strategy, patterns) records."""
        return cls(strategy, tuple(patterns.split(",")) if patterns else ())

    @property
    def option(self) -> str:
        """The command-line option that selects this filter, quoted for a shell.

        >>> MediaFilter(GLOB, ("*.jpg", "*.png")).option, MediaFilter(EXTENSION).option
        ("--media-metadata-by-glob '*.jpg,*.png'", '--media-metadata-by-extension')
        """
        if self.strategy == GLOB:
            return f"--media-metadata-by-glob {shlex.quote(self.stored_patterns)}"
        return f"--media-metadata-by-{self.strategy.lower()}"


def describe_again(root: str | Path, filters: list[MediaFilter]) -> str:
    """The commands that describe the media of the dataset at `root` as `filters` did, to quote.

    >>> print(describe_again(Path("d"), [MediaFilter(EXTENSION), MediaFilter(GLOB, ("*.x",))]))
    `shardprep prepare-media d --media-metadata-by-extension` and `shardprep prepare-media d --media-metadata-by-glob '*.x'`
    """
    where = shlex.quote(str(root))
    return " and ".join(f"`shardprep prepare-media {where} {media.option}`" for media in filters)


def parse_media_filter(glob: str | None, header: bool, extension: bool) -> MediaFilter:
    """The filter the three options name; a PrepError unless exactly one is given."""
    if sum((bool(glob), header, extension)) != 1:
        raise PrepError(ONE_FILTER)
    if glob:
        return MediaFilter(GLOB, tuple(glob.split(",")))
    return MediaFilter(HEADER if header else EXTENSION)


def media_filter_from_options(glob: str | None, header: bool, extension: bool) -> MediaFilter | None:
    """The filter of a command's three options, or None when none is given."""
    if glob is None and not header and not extension:
        return None
    return parse_media_filter(glob, header, extension)


def kind_by_extension(name: str) -> str | None:
    """The kind energon names by a file name's last suffix, any case."""
    suffix = PurePosixPath(name).suffix.lstrip(".").lower()
    if suffix in IMAGE_EXTENSIONS:
        return IMAGE
    if suffix in AV_EXTENSIONS:
        return AV
    return None


def kind_by_header(probe: bytes) -> str | None:
    """The kind the `filetype` library (energon's sniffer, same rules and order) sees in `probe`."""
    try:
        import filetype
    except ImportError:
        raise PrepError(
            "--media-metadata-by-header sniffs each part with the `filetype` library, as energon does; it is"
            " not installed. Install it (pip install 'shardprep[media]'), or use"
            " --media-metadata-by-extension."
        ) from None
    found = filetype.guess(probe)
    mime = None if found is None else found.mime
    if not mime:
        return None
    if mime.startswith("image/"):
        return IMAGE
    if mime.startswith(("video/", "audio/")):
        return AV
    return None
