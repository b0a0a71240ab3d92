"""One part described as energon's `media_metadata` row: `(entry_key, metadata_type, metadata_json)`.

The entry key is the part's name in the dataset, `<sample key>.<part>`. Only the bytes a decision needs
are read: none for a name the filter refuses, the first PROBE_BYTES when the filter sniffs, then the
image header (`prep.media.images`) or the audio/video header (`prep.media.av`, with PyAV for the
formats it does not read).

An audio/video part may get no row, as in energon: PyAV cannot read it, or it needs PyAV and PyAV is
not installed. The kind is still returned, so a run can count such parts and say so.

    >>> from prep.media.filter import parse_media_filter
    >>> from prep.media.images import from_bytes
    >>> media = parse_media_filter(glob=None, header=False, extension=True)
    >>> describe_part("0001.txt", from_bytes(b"hi"), 2, media)
    (None, None)
"""

from __future__ import annotations

from typing import NamedTuple

from prep.media.av import av_metadata
from prep.media.filter import AV, IMAGE, PROBE_BYTES, MediaFilter
from prep.media.images import ReadAt, image_metadata


class MediaRow(NamedTuple):
    """A row of `media_metadata`."""

    entry_key: str
    metadata_type: str
    metadata_json: str


def describe_part(
    entry_key: str, read: ReadAt, size: int, media: MediaFilter, *, name: str | None = None
) -> tuple[str | None, MediaRow | None]:
    """(kind, row) of one part: kind IMAGE, AV or None (not media); the row, or None when there is none
    to write (not media, not an image by its bytes, or audio/video energon writes no row for). The
    filter judges `name` (default: the entry key; a folder dataset's file is judged by its own name).
    Raises MediaError for a broken image header."""
    name = entry_key if name is None else name
    if not media.considers(name):
        return None, None
    probe = read(0, min(size, PROBE_BYTES)) if media.sniffs else b""
    kind = media.kind(name, probe)
    if kind == AV:
        av = av_metadata(read, size)
        return AV, None if av is None else MediaRow(entry_key, AV, av.json())
    if kind != IMAGE:
        return None, None
    metadata = image_metadata(read, size)
    if metadata is None:
        return IMAGE, None
    return IMAGE, MediaRow(entry_key, IMAGE, metadata.json())
