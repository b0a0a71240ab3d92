"""What a write is told: `WriteOptions`, frozen and checked as it is made.

`WriteOptions.parse` takes the flags as the command line and `write_dataset` give them (strings and
lists of strings) and returns options whose every field is already parsed and valid, so the stages of a
write never see a string to interpret or an option to doubt.

>>> options = WriteOptions.parse(parts=["text=txt", "jpg"], split_ratio="8,1,1", maxcount=100)
>>> options.parts, options.split_names, options.limits.maxcount
((('text', 'txt'), ('jpg', 'jpg')), ('train', 'val', 'test'), 100)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from prep.engines import LOCAL, check_engine
from prep.errors import PrepError
from prep.index.dataset_yaml import (
    CRUDE_CLASS,
    DatasetDefinition,
    check_definition,
    define_dataset,
    find_sample_type,
    parse_field_map,
)
from prep.index.format import RATIO_SPLITS
from prep.index.splits import parse_split_ratio
from prep.media.filter import MediaFilter, media_filter_from_options
from prep.processes import worker_count
from prep.write.keys import path_problem
from prep.write.shards import ShardLimits, shard_name

ON_ERROR = ("stop", "skip")
#: Where `--media-column` media go: files in a folder, or an indexed WebDataset.
AUX_FORMATS = ("folder", "tar")
DEFAULT_SHARD_PATTERN = "shard-%06d.tar"
#: A printf-style conversion that writes a whole number out in full: digits and padding for every shard
#: (not %c, which can give a slash, nor a precision on %s, which cuts numbers to the same name).
NUMBER_CONVERSION = re.compile(r"%[-#0 +]*[0-9]*(?:(?:\.[0-9]+)?[hlL]?[diouxX]|s)")


def formats_one_number(pattern: str) -> bool:
    """Whether `pattern % n` names a shard by one whole number, whatever n is.

    >>> formats_one_number("shard-%06d.tar"), formats_one_number("100%%-%x.tar")
    (True, True)
    >>> formats_one_number("s-%c.tar"), formats_one_number("s-%.1s.tar"), formats_one_number("%d-%d.tar")
    (False, False, False)
    """
    rest = pattern.replace("%%", "")
    return rest.count("%") == 1 and NUMBER_CONVERSION.search(rest) is not None


@dataclass(frozen=True)
class WriteOptions:
    """Every option of a write, parsed. See `shardprep write --help` for what each does."""

    #: (field, part) pairs; None: the source's default parts.
    parts: tuple[tuple[str, str], ...] | None = None
    key_column: str | None = None
    limits: ShardLimits = field(default_factory=ShardLimits)
    shard_pattern: str = DEFAULT_SHARD_PATTERN
    #: (split, weight) pairs; None: everything in `train`, no split folders.
    split_ratio: tuple[tuple[str, float], ...] | None = None
    group_by: str | None = None
    group_contiguous: bool = False
    seed: int = 0
    #: (field, extension or None) of each media field moved to the auxiliary dataset.
    media: tuple[tuple[str, str | None], ...] = ()
    aux_format: str = "folder"
    sample_type: str = CRUDE_CLASS
    field_map: dict[str, str] | None = None
    on_error: str = "stop"
    rejects: Path | None = None
    overwrite: bool = False
    allow_pickle: bool = False
    num_workers: int | None = None
    #: Where a plain JSONL file's shards are written: "local" (worker processes) or "ray" (Ray tasks).
    engine: str = LOCAL
    #: With the "ray" engine, the cluster to use; None starts a local Ray instance for the run.
    ray_address: str | None = None
    #: Describe media parts into index.sqlite as `prepare --media-metadata-by-*` does; None: not.
    media_filter: MediaFilter | None = None
    #: Keep each finished block and shard beside OUT_DIR and reuse those an interrupted run kept (`write.resume`).
    resume: bool = False

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise PrepError(f"--on-error must be stop or skip, not {self.on_error!r}.")
        if self.aux_format not in AUX_FORMATS:
            raise PrepError(f"--aux-format must be folder or tar, not {self.aux_format!r}.")
        if self.limits.maxcount < 1 or self.limits.maxsize < 1:
            raise PrepError("--maxcount and --maxsize must be positive.")
        if not formats_one_number(self.shard_pattern):
            raise PrepError(
                f"--shard-pattern {self.shard_pattern!r} needs one number, written as %d (or i, u, o, x, X, s):"
                " %c can give a slash, and a cut %s one name for many shards. For example shard-%06d.tar."
            )
        problem = path_problem(self.shard_pattern % 0)
        if problem is not None:
            raise PrepError(
                f"--shard-pattern {self.shard_pattern!r} must name shards inside OUT_DIR, but {problem};"
                " give a relative name such as shard-%06d.tar or shards/shard-%06d.tar."
            )
        if not self.shard_pattern.endswith(".tar"):
            raise PrepError(
                f"--shard-pattern {self.shard_pattern!r} must end in .tar (energon finds shards by suffix)."
            )
        shard_name(self.shard_pattern, 0)  # a name too long already; later shards' are checked as made
        if self.group_contiguous and self.group_by is None:
            raise PrepError("--group-contiguous needs --group-by COLUMN.")
        worker_count(self.num_workers, 1)
        check_engine(self.engine, self.ray_address)
        sample_type = find_sample_type(self.sample_type)  # one that cannot be written is refused now
        if self.polylithic and not sample_type.crude:
            raise PrepError(
                "A dataset with --media-column must be crude (energon hands auxiliary datasets only to"
                " cookers); leave out --sample-type."
            )
        check_definition(sample_type, self.field_map)

    @classmethod
    def parse(
        cls,
        *,
        parts: Iterable[str] | None = None,
        key_column: str | None = None,
        maxcount: int = 10_000,
        maxsize: float = 3e9,
        shard_pattern: str = DEFAULT_SHARD_PATTERN,
        split_ratio: str | None = None,
        group_by: str | None = None,
        group_contiguous: bool = False,
        seed: int = 0,
        media_columns: Iterable[str] = (),
        aux_format: str = "folder",
        sample_type: str | None = None,
        field_map: str | None = None,
        on_error: str = "stop",
        rejects: str | Path | None = None,
        overwrite: bool = False,
        allow_pickle: bool = False,
        num_workers: int | None = None,
        engine: str = LOCAL,
        ray_address: str | None = None,
        media_metadata_by_glob: str | None = None,
        media_metadata_by_header: bool = False,
        media_metadata_by_extension: bool = False,
        resume: bool = False,
    ) -> WriteOptions:
        """Options from flags as given: `parts` as FIELD=PART, `split_ratio` as "8,1,1", `media_columns`
        as FIELD[=EXT], `field_map` as JSON, the media filter as prepare's three options; the rest as
        they are."""
        return cls(
            parts=_parse_parts(parts) if parts else None,
            key_column=key_column,
            limits=ShardLimits(maxcount, maxsize),
            shard_pattern=shard_pattern,
            split_ratio=tuple(parse_split_ratio(split_ratio)) if split_ratio is not None else None,
            group_by=group_by,
            group_contiguous=group_contiguous,
            seed=seed,
            media=_parse_media(media_columns or ()),
            aux_format=aux_format,
            sample_type=sample_type or CRUDE_CLASS,
            field_map=parse_field_map(field_map) if field_map else None,
            on_error=on_error,
            rejects=Path(rejects) if rejects is not None else None,
            overwrite=overwrite,
            allow_pickle=allow_pickle,
            num_workers=num_workers,
            engine=engine,
            ray_address=ray_address,
            media_filter=media_filter_from_options(
                media_metadata_by_glob, media_metadata_by_header, media_metadata_by_extension
            ),
            resume=resume,
        )

    @property
    def polylithic(self) -> bool:
        """Whether media go to an auxiliary dataset beside the primary one."""
        return bool(self.media)

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.split_ratio) if self.split_ratio is not None else RATIO_SPLITS

    def split_folder(self, split: str) -> str:
        """The folder a split's shards go to: one per split with a ratio, else the dataset root."""
        return split if self.split_ratio is not None else ""

    def definition(self) -> DatasetDefinition:
        """The dataset.yaml (and sample_loader.py to edit) of the primary dataset."""
        return define_dataset(find_sample_type(self.sample_type), self.field_map)


def _parse_parts(specs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`["text=txt", "meta=json", "caption=caption.txt"]` -> (field, part) pairs; `jpg` alone means jpg=jpg."""
    specs = list(specs)
    parts = []
    for spec in specs:
        column, equals, part = spec.partition("=")
        part = part if equals else column
        if not column or not part or "/" in part:
            raise PrepError(f"Invalid --part {spec!r}: expected FIELD=PART, e.g. text=txt or image=jpg.")
        parts.append((column, part))
    names = [part for _, part in parts]
    if len(set(names)) != len(names):
        raise PrepError(f"Two fields map to the same part name in --part {' '.join(specs)}.")
    return tuple(parts)


def _parse_media(specs: Iterable[str]) -> tuple[tuple[str, str | None], ...]:
    """`["image", "audio=wav"]` -> (field, extension or None) pairs."""
    media = []
    for spec in specs:
        column, equals, ext = spec.partition("=")
        if not column or (equals and not ext) or "/" in ext:
            raise PrepError(f"Invalid --media-column {spec!r}: expected FIELD or FIELD=EXT, e.g. image=jpg.")
        media.append((column, ext.lower().lstrip(".") if equals else None))
    return tuple(media)
