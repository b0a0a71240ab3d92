"""`shardprep write SOURCE... OUT_DIR`: a thin shell over `prep.write.write_dataset`."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from prep.sources import KINDS, open_sources
from prep.write import WriteProgress, WriteSummary, write_dataset


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _progress_printer(enabled: bool):  # noqa: ANN202 (a callback or None)
    """Samples/s and MB/s on one terminal line, at most a few times a second; None off a terminal."""
    if not enabled or not sys.stderr.isatty():
        return None
    last = [0.0]

    def show(progress: WriteProgress) -> None:
        if progress.seconds - last[0] < 0.25:
            return
        last[0] = progress.seconds
        seconds = max(progress.seconds, 1e-9)
        sys.stderr.write(
            f"\rwritten {progress.samples:,} samples, {progress.bytes / 1e6:,.1f} MB"
            f" ({progress.samples / seconds:,.0f} samples/s, {progress.bytes / 1e6 / seconds:,.1f} MB/s)"
            + (f", {progress.rejects:,} rejected" if progress.rejects else "")
        )
        sys.stderr.flush()

    return show


def describe_summary(summary: WriteSummary) -> str:
    """The end-of-run summary: samples per split, shards, bytes, rejects."""
    splits = ", ".join(f"{name} {count:,}" for name, count in summary.samples_per_split.items())
    lines = [
        f"Wrote {summary.samples:,} samples ({splits}) in {summary.shards} shards, {summary.bytes / 1e6:,.1f} MB,"
        f" in {summary.seconds:.2f} s: {summary.dataset}",
    ]
    if summary.metadataset is not None:
        lines.append(f"Media in the auxiliary dataset {summary.aux}; load {summary.metadataset} with energon.")
    if summary.oversize_groups:
        lines.append(f"{summary.oversize_groups} groups were larger than --maxcount/--maxsize and got a shard each.")
    if summary.rejects:
        lines.append(f"Rejected {summary.rejects:,} inputs; they are listed with their reasons in {summary.rejects_path}.")
    else:
        lines.append("Rejected nothing.")
    return "\n".join(lines)


@click.command(name="write")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "kind", type=click.Choice(KINDS), help="Source kind [default: from the suffix; folders by stem].")
@click.option("--part", "parts", multiple=True, help="FIELD=PART, e.g. text=txt, meta=json, image=jpg. Repeatable.")
@click.option("--key-column", help="Field holding each sample's key [default: generated, zero-padded].")
@click.option("--maxcount", type=int, default=10_000, show_default=True, help="Samples per shard at most.")
@click.option("--maxsize", type=float, default=3e9, show_default=True, help="Bytes per shard at most.")
@click.option("--shard-pattern", default="shard-%06d.tar", show_default=True, help="Shard file names.")
@click.option("--split-ratio", help="Train/val/test ratio over samples (or groups), e.g. 8,1,1; one sub-folder per split.")
@click.option("--group-by", help="Field whose value keeps samples together in one split.")
@click.option("--group-contiguous", is_flag=True, help="Also keep each group contiguous in one shard.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split assignment.")
@click.option("--media-column", "media_columns", multiple=True, help="FIELD[=EXT]: write this media to an auxiliary dataset.")
@click.option("--aux-format", type=click.Choice(["folder", "tar"]), default="folder", show_default=True)
@click.option("--sample-type", help="energon sample type for dataset.yaml [default: CrudeWebdataset].")
@click.option("--field-map", help='Fields to parts as JSON, e.g. \'{"image": "jpg", "caption": "txt"}\'.')
@click.option("--on-error", type=click.Choice(["stop", "skip"]), default="stop", show_default=True)
@click.option("--rejects", type=click.Path(path_type=Path), help="Where --on-error skip lists rejects [OUT_DIR/rejects.jsonl].")
@click.option("--overwrite", is_flag=True, help="Replace the contents of a non-empty OUT_DIR.")
@click.option("--allow-pickle", is_flag=True, help="Allow .pickle/.pyd parts (they run code when loaded).")
@click.option("--progress/--no-progress", default=True, help="Show progress (only on a terminal).")
def write_command(paths: tuple[Path, ...], kind: str | None, parts: tuple[str, ...], key_column: str | None,
                  maxcount: int, maxsize: float, shard_pattern: str, split_ratio: str | None, group_by: str | None,
                  group_contiguous: bool, seed: int, media_columns: tuple[str, ...], aux_format: str,
                  sample_type: str | None, field_map: str | None, on_error: str, rejects: Path | None,
                  overwrite: bool, allow_pickle: bool, progress: bool) -> None:
    """Write SOURCE... (JSONL, CSV, Parquet, folders, parallel text) into a prepared dataset at OUT_DIR.

    The last path is OUT_DIR. The result loads in energon with no further step: shards, .tar.idx and
    .nv-meta are written in one pass, under temporary names until everything is done.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    if len(paths) < 2:
        raise click.UsageError("Give at least one SOURCE and the OUT_DIR.")
    *source_paths, out_dir = paths
    columns = None
    if parts:
        columns = [spec.partition("=")[0] for spec in parts]
        columns += [column for column in (key_column, group_by) if column]
        columns += [spec.partition("=")[0] for spec in media_columns]
    sources = open_sources(list(source_paths), kind, columns)
    printer = _progress_printer(progress)
    summary = write_dataset(
        sources, out_dir, parts=list(parts) or None, key_column=key_column, maxcount=maxcount, maxsize=maxsize,
        shard_pattern=shard_pattern, split_ratio=split_ratio, group_by=group_by, group_contiguous=group_contiguous,
        seed=seed, media_columns=list(media_columns), aux_format=aux_format, sample_type=sample_type,
        field_map=field_map, on_error=on_error, rejects=rejects, overwrite=overwrite, allow_pickle=allow_pickle,
        progress=printer,
    )
    if printer is not None:
        sys.stderr.write("\n")
    click.echo(describe_summary(summary))
