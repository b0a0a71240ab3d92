"""`shardprep write SOURCE... OUT_DIR`: a thin shell over `prep.write.run.write`."""

from __future__ import annotations

from pathlib import Path

import click

from prep.cli import (
    DatasetLocation,
    ProgressLine,
    duration,
    engine_option,
    field_map_option,
    media_metadata_options,
    num_workers_option,
    progress_option,
    ray_address_option,
    stop_on_sigterm,
    tmp_path_option,
)
from prep.index.media import skipped_av_warning
from prep.write.options import AUX_FORMATS, DEFAULT_SHARD_PATTERN, ON_ERROR, WriteOptions
from prep.write.run import REJECTS_FILE, WriteProgress, WriteSummary, write
from prep.write.sources import KINDS, open_sources


def describe_summary(summary: WriteSummary) -> str:
    """The end-of-run summary: samples per split, shards, bytes, rejects."""
    splits = ", ".join(f"{name} {count:,}" for name, count in summary.samples_per_split.items())
    lines = [
        f"Wrote {summary.samples:,} samples ({splits}) in {summary.shards} shards, {summary.bytes / 1e6:,.1f} MB,"
        f" in {summary.seconds:.2f} s: {summary.dataset}",
    ]
    if summary.metadataset is not None:
        lines.append(
            f"Media in the auxiliary dataset {summary.aux}; load {summary.metadataset} with energon."
        )
    if summary.resumed is not None:
        shards, total, blocks, all_blocks = summary.resumed
        lines.append(
            f"Resumed: reused {shards:,} of {total:,} shards and {blocks:,} of {all_blocks:,} input blocks"
            " an earlier run finished."
        )
    if summary.oversize_groups:
        lines.append(
            f"{summary.oversize_groups} groups were larger than --maxcount/--maxsize and got a shard each."
        )
    if summary.media is not None:
        lines.append(f"Media metadata of {summary.media.rows:,} parts stored in index.sqlite.")
        if summary.media.skipped_av:
            lines.append(skipped_av_warning(summary.media.skipped_av))
    if summary.rejects:
        lines.append(
            f"Rejected {summary.rejects:,} inputs; they are listed with their reasons in {summary.rejects_path}."
        )
    else:
        lines.append("Rejected nothing.")
    return "\n".join(lines)


def _progress_text(progress: WriteProgress) -> str:
    seconds = max(progress.seconds, 1e-9)
    stage = ""
    if progress.stage:  # a write in blocks: where it is, and how long the stage has to go
        eta = f", ETA {duration(progress.eta)}" if progress.eta is not None else ""
        stage = f"{progress.stage} {progress.done:,}/{progress.total:,}{eta}; "
    samples, nbytes = progress.samples - progress.reused_samples, progress.bytes - progress.reused_bytes
    return (
        f"{stage}written {progress.samples:,} samples, {progress.bytes / 1e6:,.1f} MB"
        f" ({samples / seconds:,.0f} samples/s, {nbytes / 1e6 / seconds:,.1f} MB/s)"
        + (f", {progress.rejects:,} rejected" if progress.rejects else "")
    )


@click.command(name="write")
@click.argument("paths", nargs=-1, required=True, type=DatasetLocation(), metavar="SOURCE... OUT_DIR")
@click.option(
    "--format",
    "kind",
    type=click.Choice(KINDS),
    help="Source kind [default: from the suffix; folders by stem].",
)
@click.option(
    "--part", "parts", multiple=True, help="FIELD=PART, e.g. text=txt, meta=json, image=jpg. Repeatable."
)
@click.option("--key-column", help="Field holding each sample's key [default: generated, zero-padded].")
@click.option(
    "--maxcount",
    type=int,
    default=10_000,
    show_default=True,
    help="Samples per shard at most (but for a --group-contiguous group larger than this: a shard of its own).",
)
@click.option(
    "--maxsize",
    type=float,
    default=3e9,
    show_default=True,
    help="Bytes per shard at most (but for one sample, or a --group-contiguous group, larger than this: a"
    " shard of its own).",
)
@click.option("--shard-pattern", default=DEFAULT_SHARD_PATTERN, show_default=True, help="Shard file names.")
@click.option(
    "--split-ratio",
    help="Train/val/test ratio over samples (or groups), e.g. 8,1,1; one sub-folder per split.",
)
@click.option("--group-by", help="Field whose value keeps samples together in one split.")
@click.option("--group-contiguous", is_flag=True, help="Also keep each group contiguous in one shard.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split assignment.")
@click.option(
    "--media-column",
    "media_columns",
    multiple=True,
    help="FIELD[=EXT]: write this media to an auxiliary dataset.",
)
@click.option(
    "--aux-format",
    type=click.Choice(AUX_FORMATS),
    default=AUX_FORMATS[0],
    show_default=True,
    help="With --media-column: the auxiliary dataset as a folder of files, or as an indexed WebDataset.",
)
@click.option("--sample-type", help="energon sample type for dataset.yaml [default: CrudeWebdataset].")
@field_map_option
@click.option(
    "--on-error",
    type=click.Choice(ON_ERROR),
    default=ON_ERROR[0],
    show_default=True,
    help="stop: the first bad record stops the run, naming its file:line, and nothing is written; skip: bad"
    " records are left out and listed in the rejects file.",
)
@click.option(
    "--rejects",
    type=click.Path(path_type=Path),
    help=f"Where --on-error skip lists rejects [OUT_DIR/{REJECTS_FILE}].",
)
@click.option("--overwrite", is_flag=True, help="Replace the contents of a non-empty OUT_DIR.")
@click.option(
    "--allow-pickle", is_flag=True, help="Allow .pickle/.pyd/.pkl parts (they run code when loaded)."
)
@num_workers_option
@progress_option
@engine_option
@ray_address_option
@media_metadata_options
@click.option(
    "--resume",
    is_flag=True,
    help="Keep each finished block and shard (in OUT_DIR/.shardprep-resume; for a bucket, in a folder under"
    " --tmp-path named by the address), so that a rerun with the same arguments and --resume after an"
    " interruption redoes only what was not finished or changed since.",
)
@tmp_path_option
def write_command(
    paths: tuple[Path | str, ...],
    kind: str | None,
    parts: tuple[str, ...],
    key_column: str | None,
    maxcount: int,
    maxsize: float,
    shard_pattern: str,
    split_ratio: str | None,
    group_by: str | None,
    group_contiguous: bool,
    seed: int,
    media_columns: tuple[str, ...],
    aux_format: str,
    sample_type: str | None,
    field_map: str | None,
    on_error: str,
    rejects: Path | None,
    overwrite: bool,
    allow_pickle: bool,
    num_workers: int | None,
    progress: bool,
    engine: str,
    ray_address: str | None,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
    media_metadata_by_extension: bool,
    resume: bool,
    tmp_path: Path | None,
) -> None:
    """Write SOURCE... (JSONL, CSV, Parquet, folders, parallel text) into a prepared dataset at OUT_DIR.

    The last path is OUT_DIR. The result loads in energon with no further step: shards, .tar.idx and
    .nv-meta are written in one pass, under temporary names until everything is done.
    """
    stop_on_sigterm()
    if len(paths) < 2:
        raise click.UsageError("Give at least one SOURCE and the OUT_DIR.")
    *source_paths, out_dir = paths
    options = WriteOptions.parse(
        parts=parts, key_column=key_column, maxcount=maxcount, maxsize=maxsize, shard_pattern=shard_pattern,
        split_ratio=split_ratio, group_by=group_by, group_contiguous=group_contiguous, seed=seed,
        media_columns=media_columns, aux_format=aux_format, sample_type=sample_type, field_map=field_map,
        on_error=on_error, rejects=rejects, overwrite=overwrite, allow_pickle=allow_pickle, num_workers=num_workers,
        engine=engine, ray_address=ray_address, media_metadata_by_glob=media_metadata_by_glob,
        media_metadata_by_header=media_metadata_by_header, media_metadata_by_extension=media_metadata_by_extension,
        resume=resume,
    )  # fmt: skip
    columns = None
    if options.parts is not None:  # a columnar source reads only the fields the write uses
        columns = [column for column, _ in options.parts] + [column for column, _ in options.media]
        columns += [column for column in (key_column, group_by) if column]
    if any(isinstance(path, str) for path in source_paths):
        raise click.UsageError("SOURCE must be a local path; only OUT_DIR may be an s3:// or msc:// address.")
    sources = open_sources(list(source_paths), kind, columns)  # type: ignore[arg-type]
    line = ProgressLine(progress)
    try:
        if isinstance(out_dir, str):  # s3:// or msc://: written under --tmp-path, then uploaded
            from prep.write.remote import write_remote

            summary = write_remote(
                sources,
                out_dir,
                options,
                lambda state: line.show(_progress_text(state)),
                tmp_path=tmp_path,
                note=line.say,
            )
        else:
            summary = write(sources, out_dir, options, lambda state: line.show(_progress_text(state)))
    finally:
        line.close()
    click.echo(describe_summary(summary))
