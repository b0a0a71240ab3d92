"""`shardprep prepare`: energon prepare's options and questions, over `prep.prepare.run.prepare`."""

from __future__ import annotations

import time
from pathlib import Path

import click

from prep.cli import (
    DatasetLocation,
    Pace,
    ProgressLine,
    engine_option,
    field_map_option,
    media_metadata_options,
    num_workers_option,
    progress_option,
    ray_address_option,
    stop_on_sigterm,
    tmp_path_option,
)
from prep.errors import PrepError
from prep.index.format import DATASET_YAML
from prep.index.media import skipped_av_warning
from prep.index.splits import SHUFFLE_SEED
from prep.media.filter import media_filter_from_options, parse_media_filter
from prep.prepare.media import prepare_media
from prep.prepare.run import IndexProgress, PrepareOptions, prepare
from prep.prepare.wizard import TerminalWizard


@click.command(name="prepare")
@click.argument("path", type=DatasetLocation())
@progress_option
@click.option(
    "--split-parts",
    multiple=True,
    help="Split by shard path pattern, NAME:REGEX, e.g. 'train:train/{000000..009999}.tar' (brace expansion,"
    " then re.match). Repeatable. Overrides --split-ratio.",
)
@click.option("--exclude", help="Leave out shards whose path (relative to PATH) matches this regex anywhere.")
@num_workers_option
@click.option(
    "--tar-index-only", is_flag=True, help="Only re-create the shard indexes (.tar.idx, index.sqlite)."
)
@click.option(
    "--shuffle-tars",
    is_flag=True,
    help=f"Shuffle the shards (seed {SHUFFLE_SEED}) before splitting by ratio.",
)
@click.option("--non-interactive", is_flag=True, help="Never ask; missing answers are errors.")
@click.option("--split-ratio", help="Train/val/test ratio over whole shards, e.g. '8,1,1' or '0.8,0.1,0.1'.")
@click.option(
    "--force-overwrite", is_flag=True, help="Re-prepare an already prepared dataset without asking."
)
@click.option("--skip-dataset-yaml", is_flag=True, help="Write no dataset.yaml (and no sample loader).")
@click.option(
    "--dataset-yaml-name", default=DATASET_YAML, show_default=True, help="File name of the dataset.yaml."
)
@click.option(
    "--sample-type", help="energon sample type for dataset.yaml, e.g. CaptioningSample or CrudeWebdataset."
)
@field_map_option
@click.option("--crude", is_flag=True, help="Write a CrudeWebdataset dataset.yaml (samples go to a cooker).")
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse shards without the end-of-archive marker (by default indexed to their end, with a warning).",
)
@media_metadata_options
@engine_option
@ray_address_option
@click.option(
    "--resume",
    is_flag=True,
    help="Keep each shard's index as it is made (in PATH/.shardprep-resume; for a bucket, in a folder under"
    " --tmp-path), so that a rerun with --resume after an interruption scans only the shards not finished"
    " or changed since.",
)
@tmp_path_option
@click.option(
    "--fix-duplicates",
    is_flag=True,
    help="If a sample key is in more than one shard, first rename every member in place to start with its"
    " shard's path (as energon does), journaled in PATH/.shardprep-fix so that an interruption is finished"
    " by the next run with this flag.",
)
def prepare_command(
    path: Path | str,
    progress: bool,
    split_parts: tuple[str, ...],
    exclude: str | None,
    num_workers: int | None,
    tar_index_only: bool,
    shuffle_tars: bool,
    non_interactive: bool,
    split_ratio: str | None,
    force_overwrite: bool,
    skip_dataset_yaml: bool,
    dataset_yaml_name: str,
    sample_type: str | None,
    field_map: str | None,
    crude: bool,
    strict: bool,
    engine: str,
    ray_address: str | None,
    resume: bool,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
    media_metadata_by_extension: bool,
    tmp_path: Path | None,
    fix_duplicates: bool,
) -> None:
    """Index the WebDataset shards under PATH and write energon's .nv-meta (as `energon prepare` does).

    Nothing is in place until everything is written: a failed or interrupted run leaves the previous index
    as it was, and shards are never modified (but by --fix-duplicates, which renames their members). PATH
    may be s3://BUCKET/PREFIX or msc://PROFILE/PREFIX: the shards' headers are read by ranged GETs and the
    index is built under --tmp-path, then uploaded.
    """
    started = time.perf_counter()
    stop_on_sigterm()
    if crude:
        if sample_type not in (None, "CrudeWebdataset"):
            raise PrepError("--crude and --sample-type name different sample types; give one of them.")
        sample_type = "CrudeWebdataset"
    options = PrepareOptions(
        split_ratio=split_ratio,
        split_parts=split_parts,
        shuffle_seed=SHUFFLE_SEED if shuffle_tars else None,
        exclude=exclude,
        num_workers=num_workers,
        tar_index_only=tar_index_only,
        force_overwrite=force_overwrite,
        sample_type=sample_type,
        field_map=field_map,
        skip_dataset_yaml=skip_dataset_yaml,
        dataset_yaml_name=dataset_yaml_name,
        strict=strict,
        engine=engine,
        ray_address=ray_address,
        resume=resume,
        fix_duplicates=fix_duplicates,
        media_filter=media_filter_from_options(
            media_metadata_by_glob, media_metadata_by_header, media_metadata_by_extension
        ),
    )
    line = ProgressLine(progress)

    pace = Pace()

    def indexed(state: IndexProgress) -> None:
        if state.failed is not None:  # named now; all of them again in the error at the end
            line.note(f"Failed: {str(state.failed).splitlines()[0]}")
        line.show(f"Indexing {pace.text(state.done, state.total, state.samples, reused=state.reused)}")
        if state.done == state.total:
            line.close()  # the wizard speaks next

    def described(done: int, total: int) -> None:
        line.show(f"Reading media headers  {done}/{total} shards")
        if done == total:
            line.close()

    wizard = TerminalWizard(options, interactive=not non_interactive)
    try:
        if isinstance(path, str):  # s3:// or msc://: the index is built under --tmp-path, then uploaded
            from prep.prepare.remote import prepare_remote

            shard_counts = prepare_remote(
                path, options, wizard, indexed, described, tmp_path=tmp_path, note=line.say
            )
        else:
            shard_counts = prepare(path, options, wizard, indexed, described)
    finally:
        line.close()
    if shard_counts is None:  # declined to go over the existing index
        return
    for shard, count in shard_counts.items():
        if count == 0:
            click.echo(f"Note: {shard} holds no samples; it is indexed with a count of 0.", err=True)
    elapsed = time.perf_counter() - started
    click.echo(
        f"Done: indexed {sum(shard_counts.values())} samples in {len(shard_counts)} shards in {elapsed:.2f} s."
    )


@click.command(name="prepare-media")
@click.argument("path", type=DatasetLocation())
@progress_option
@num_workers_option
@media_metadata_options
@tmp_path_option
def prepare_media_command(
    path: Path | str,
    progress: bool,
    num_workers: int | None,
    media_metadata_by_glob: str | None,
    media_metadata_by_header: bool,
    media_metadata_by_extension: bool,
    tmp_path: Path | None,
) -> None:
    """Store the media metadata of the dataset at PATH in its .nv-meta/index.sqlite (as `energon
    prepare-media` does): a prepared WebDataset's media parts, or every media file of a folder dataset
    (e.g. the auxiliary side of a polylithic dataset). Give exactly one --media-metadata-by-... option.
    PATH may be s3://BUCKET/PREFIX or msc://PROFILE/PREFIX: the media headers are read by ranged GETs, and
    the index is updated under --tmp-path, then uploaded in place of the old.
    """
    stop_on_sigterm()
    media = parse_media_filter(media_metadata_by_glob, media_metadata_by_header, media_metadata_by_extension)
    line = ProgressLine(progress)

    def described(done: int, total: int) -> None:
        line.show(f"Reading media headers  {done}/{total}")

    try:
        if isinstance(path, str):  # s3:// or msc://: the index is updated under --tmp-path, then uploaded
            from prep.prepare.remote_media import prepare_media_remote

            prepared = prepare_media_remote(path, media, progress=described, tmp_path=tmp_path, note=line.say)
        else:
            prepared = prepare_media(path, media, num_workers=num_workers, progress=described)
    finally:
        line.close()
    if prepared.summary.skipped_av:
        click.echo(f"Note: {skipped_av_warning(prepared.summary.skipped_av)}", err=True)
    click.echo(f"Done. Stored metadata for {prepared.summary.rows} files ({prepared.kind} dataset).")
