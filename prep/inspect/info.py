"""What is in a prepared dataset: per split, its shards, samples and bytes, its part types with size
percentiles, and its largest samples.

The statistics come from the index alone (`.info.json`, the split file and two sqlite tables read whole
as columns), so they cost the same for crude and field-map datasets and never open a tar. `dataset_info` returns plain data
(what `--json` prints); `format_info` and `plot_info` render it.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from prep.errors import PrepError
from prep.index.columns import TextColumn
from prep.index.dataset import PreparedDataset
from prep.index.format import DATASET_YAML
from prep.index.sqlite import IndexReader

PERCENTILES = (50, 90, 99)
LARGEST_SAMPLES = 5


@dataclass
class PartStats:
    """Sizes of one part type (part name, e.g. `jpg`, `seg.0.json`) within a split, in bytes."""

    part: str
    count: int
    total_bytes: int
    min: int
    p50: float
    p90: float
    p99: float
    max: int


@dataclass
class LargeSample:
    key: str
    shard: str
    bytes: int


@dataclass
class SplitStats:
    split: str
    shards: int
    #: The samples energon's loader reads: those of the split's shards less those `exclude`d one by one.
    samples: int
    #: Sum of the split's shard file sizes; shards missing on disk (or in a folder that cannot be searched)
    #: count 0 and are listed in `missing_shards`.
    bytes: int
    parts: list[PartStats] = field(default_factory=list)
    largest_samples: list[LargeSample] = field(default_factory=list)
    missing_shards: list[str] = field(default_factory=list)


@dataclass
class DatasetStats:
    path: str
    sample_type: str
    #: "crude" (needs a cooker), "field_map", "sample_loader" or "unknown"
    kind: str
    field_map: dict[str, str] | None
    shards: int
    samples: int
    bytes: int
    splits: list[SplitStats]
    unsplit_shards: list[str]
    #: Shard name -> file size (None when the file is missing), in `.info.json` order.
    shard_bytes: dict[str, int | None]
    #: Shards whose sample count in index.sqlite is not the one `.info.json` gives: the part statistics
    #: and largest samples, read from index.sqlite, are then not those of the shards.
    index_disagrees: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _describe_type(config: dict | None, name: str) -> tuple[str, str, dict[str, str] | None]:
    """(sample type name, kind, field map) from a parsed dataset config (`name`, e.g. dataset.yaml)."""
    if config is None:
        return f"none (no {name})", "unknown", None
    sample_type = config.get("sample_type") if isinstance(config.get("sample_type"), dict) else config
    name = str(sample_type.get("__class__", "unknown"))
    field_map = config.get("field_map")
    if isinstance(field_map, dict):
        return name, "field_map", {str(k): str(v) for k, v in field_map.items()}
    if "sample_loader" in config:
        return name, "sample_loader", None
    if "Crude" in name:
        return name, "crude", None
    return name, "unknown", None


def _file_size(path: os.PathLike[str]) -> int | None:
    try:
        return os.stat(path).st_size
    except (FileNotFoundError, PermissionError):  # `verify` says which and what to do
        return None


def _part_columns(
    dataset: PreparedDataset, *, with_index: bool = False
) -> tuple[dict[str, np.ndarray], TextColumn]:
    """Every part's shard (`tar`) and size, with the part names; `with_index`: its sample index too."""
    wanted = {"tar": "tar_file_id", "size": "content_byte_size"}
    if with_index:
        wanted["index"] = "sample_index"
    columns, names = dataset.index.columns("sample_parts", wanted, text="part_name")
    assert names is not None
    return columns, names


def _places(tar: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Each sample's (tar_file_id, sample_index) as one integer, for `np.isin`."""
    return (tar.astype(np.int64) << 32) | index.astype(np.int64)


def _excluded_places(dataset: PreparedDataset) -> np.ndarray:
    """The places (`_places`) of the samples the split file excludes one by one."""
    reader = IndexReader(dataset.sqlite_path, excluded=dataset.excluded_samples())
    try:
        places = np.array(reader.excluded_places(), dtype=np.int64).reshape(-1, 2)
    finally:
        reader.close()
    return _places(places[:, 0], places[:, 1])


def dataset_info(
    dataset: PreparedDataset, largest: int = LARGEST_SAMPLES, dataset_config: str = DATASET_YAML
) -> DatasetStats:
    """Per-split statistics of a prepared dataset, read from its index; the sample type from its
    `.nv-meta/{dataset_config}`."""
    splits = dataset.splits()
    shard_bytes = {name: _file_size(dataset.shard_path(name)) for name in dataset.shards}
    index = dataset.index
    # the samples split.yaml excludes one by one: energon's loader skips them, so their split does not count them
    dropped = _excluded_places(dataset)
    columns = {"rowid": "rowid", "tar": "tar_file_id", "size": "byte_size"}
    if dropped.size:  # the sample indexes are read only to find those (a tenth of the reading)
        columns["index"] = "sample_index"
    samples, _ = index.columns("samples", columns)
    sample_rowid, sample_tar, sample_size = samples["rowid"], samples["tar"], samples["size"]
    parts, names = _part_columns(dataset, with_index=bool(dropped.size))
    part_tar, part_size = parts["tar"], parts["size"]
    part_names, part_code = names.codes()
    sample_kept = np.ones(len(sample_tar), dtype=bool)
    part_kept = np.ones(len(part_tar), dtype=bool)
    if dropped.size:
        sample_kept = ~np.isin(_places(sample_tar, samples["index"]), dropped)
        part_kept = ~np.isin(_places(part_tar, parts["index"]), dropped)

    split_stats = []
    for split, names in splits.items():
        known = [name for name in names if name in shard_bytes]
        ids = np.array([dataset.tar_file_id(name) for name in known], dtype=np.int64)
        stats = SplitStats(
            split=split,
            shards=len(names),
            samples=sum(dataset.shard_counts.get(name, 0) for name in names)
            - int((~sample_kept & np.isin(sample_tar, ids)).sum()),
            bytes=sum(shard_bytes.get(name) or 0 for name in names),
            missing_shards=[name for name in names if shard_bytes.get(name) is None],
        )
        in_split = np.isin(part_tar, ids) & part_kept
        for code, part in enumerate(part_names):
            sizes = part_size[in_split & (part_code == code)]
            if sizes.size == 0:
                continue
            p50, p90, p99 = (float(v) for v in np.percentile(sizes, PERCENTILES))
            stats.parts.append(
                PartStats(
                    part, int(sizes.size), int(sizes.sum()), int(sizes.min()), p50, p90, p99, int(sizes.max())
                )
            )
        stats.parts.sort(key=lambda p: (-p.count, p.part))
        sample_mask = np.isin(sample_tar, ids) & sample_kept
        sizes = sample_size[sample_mask]
        if sizes.size:
            top = np.argsort(-sizes, kind="stable")[:largest]
            rowids = sample_rowid[sample_mask][top]
            for rowid in rowids.tolist():
                sample = index.sample_by_rowid(rowid)
                assert sample is not None  # the rowid was just read from the table
                stats.largest_samples.append(
                    LargeSample(sample.key, dataset.shards[sample.tar_file_id], int(sample.size or 0))
                )
        split_stats.append(stats)

    in_splits = {name for names in splits.values() for name in names}
    placed = in_splits | dataset.excluded_shards()  # an excluded shard is in no split by the user's choice
    known_tar = sample_tar[(sample_tar >= 0) & (sample_tar < len(dataset.shards))]
    indexed = np.bincount(known_tar, minlength=len(dataset.shards)).tolist()
    disagree = [
        name
        for name, count in zip(dataset.shards, indexed, strict=True)
        if count != dataset.shard_counts[name]
    ]
    sample_type, kind, field_map = _describe_type(dataset.dataset_config(dataset_config), dataset_config)
    return DatasetStats(
        path=str(dataset.root),
        sample_type=sample_type,
        kind=kind,
        field_map=field_map,
        shards=len(dataset.shards),
        samples=sum(dataset.shard_counts.values()),
        bytes=sum(size or 0 for size in shard_bytes.values()),
        splits=split_stats,
        unsplit_shards=[name for name in dataset.shards if name not in placed],
        shard_bytes=shard_bytes,
        index_disagrees=disagree,
    )


def human_bytes(size: float) -> str:
    """Bytes for people.

    >>> human_bytes(512), human_bytes(1536), human_bytes(3 * 1024**3)
    ('512 B', '1.5 KiB', '3.0 GiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


KIND_NOTE = {
    "crude": "crude: samples are dicts of raw parts, decoded by a cooker",
    "field_map": "field map",
    "sample_loader": "sample loader in .nv-meta/sample_loader.py",
    "unknown": "sample type not recognised",
}


def format_info(stats: DatasetStats) -> str:
    """The human-readable report."""
    lines = [
        f"Dataset {stats.path}",
        f"  sample type: {stats.sample_type} ({KIND_NOTE[stats.kind]})",
    ]
    if stats.field_map:
        lines.append(
            "  field map: " + ", ".join(f"{name} <- {part}" for name, part in stats.field_map.items())
        )
    lines.append(f"  {stats.shards:,} shards, {stats.samples:,} samples, {human_bytes(stats.bytes)}")
    if stats.index_disagrees:
        lines.append(f"  WARNING: {index_disagreement(stats)}")
    if stats.unsplit_shards:
        lines.append(
            f"  {len(stats.unsplit_shards)} shard(s) in no split: {', '.join(stats.unsplit_shards[:5])}"
        )
    for split in stats.splits:
        lines.append("")
        lines.append(
            f"split {split.split}: {split.shards:,} shards, {split.samples:,} samples, {human_bytes(split.bytes)}"
        )
        if split.missing_shards:
            lines.append(
                f"  missing or unreadable shard files: {', '.join(split.missing_shards[:5])} (run `shardprep"
                " verify`)"
            )
        if not split.parts:
            continue
        header = ("part", "count", "total", "min", "p50", "p90", "p99", "max")
        rows = [header] + [
            (
                part.part,
                f"{part.count:,}",
                human_bytes(part.total_bytes),
                human_bytes(part.min),
                human_bytes(part.p50),
                human_bytes(part.p90),
                human_bytes(part.p99),
                human_bytes(part.max),
            )
            for part in split.parts
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
        for row in rows:
            cells = [row[0].ljust(widths[0])] + [
                cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=False)
            ]
            lines.append("  " + "  ".join(cells))
        if split.largest_samples:
            lines.append("  largest samples:")
            for sample in split.largest_samples:
                lines.append(f"    {human_bytes(sample.bytes):>10}  {sample.key}  ({sample.shard})")
    return "\n".join(lines)


def index_disagreement(stats: DatasetStats) -> str:
    """What it means that index.sqlite counts other samples than `.info.json` for some shards."""
    shown = ", ".join(stats.index_disagrees[:5]) + (", ..." if len(stats.index_disagrees) > 5 else "")
    return (
        f"index.sqlite does not hold the samples .info.json counts for {len(stats.index_disagrees):,} shard(s)"
        f" ({shown}): the parts and largest samples below are not those of the shards. Run `shardprep"
        " verify` on the dataset."
    )


def plot_info(dataset: PreparedDataset, stats: DatasetStats, output: str) -> str:
    """Draw the part-size histogram per part type and the shard-size bars into `output`, a PNG file (`.png`
    added to a name without a suffix) or the format its suffix names (`.pdf`, `.svg`, ...); the file
    written is returned."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise PrepError("--plot needs matplotlib; install it with `pip install matplotlib`.") from None
    suffix = Path(output).suffix.lstrip(".").lower()
    if not suffix:
        output, suffix = f"{output}.png", "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix not in formats:
        raise PrepError(
            f"Cannot write the plot to {output}: matplotlib writes no '.{suffix}' files. Name a file ending in"
            f" .png (or one of {', '.join('.' + name for name in sorted(formats))})."
        )
    parts, names = _part_columns(dataset)
    part_names, part_code = names.codes()
    by_part = {part: parts["size"][part_code == code] for code, part in enumerate(part_names)}
    shown = sorted(by_part, key=lambda part: -len(by_part[part]))[:8]
    figure, axes = plt.subplots(len(shown) + 1, 1, figsize=(9, 2.6 * (len(shown) + 1)), squeeze=False)
    for axis, part in zip(axes[:, 0], shown, strict=False):
        sizes = np.maximum(by_part[part].astype(np.float64), 1)
        bins = np.logspace(np.log10(sizes.min()), np.log10(sizes.max()) + 1e-9, 40)
        axis.hist(sizes, bins=bins, color="tab:blue")
        axis.set_xscale("log")
        axis.set_title(f"part {part}: {len(sizes):,} files")
        axis.set_xlabel("bytes")
        axis.set_ylabel("count")
    axis = axes[-1, 0]
    names = list(stats.shard_bytes)
    axis.bar(range(len(names)), [size or 0 for size in stats.shard_bytes.values()], color="tab:green")
    axis.set_title(f"shard sizes ({len(names)} shards)")
    axis.set_ylabel("bytes")
    if len(names) <= 30:
        axis.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    figure.tight_layout()
    try:
        figure.savefig(output, dpi=100)
    except OSError as error:
        raise PrepError(f"Cannot write the plot to {output}: {error.strerror}.") from None
    finally:
        plt.close(figure)
    return output
