"""`shardprep prepare`: energon prepare's options and questions, over `prep.prepare.run.prepare`."""

from __future__ import annotations

import time
from pathlib import Path

import click

from prep.cli import ProgressLine, field_map_option, num_workers_option, progress_option, stop_on_sigterm
from prep.errors import PrepError
from prep.index.format import DATASET_YAML
from prep.index.splits import SHUFFLE_SEED
from prep.prepare.run import PrepareOptions, prepare
from prep.prepare.wizard import TerminalWizard


@click.command(name="prepare")
@click.argument("path", type=click.Path(path_type=Path))
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
def prepare_command(
    path: Path,
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
) -> None:
    """Index the WebDataset shards under PATH and write energon's .nv-meta (as `energon prepare` does).

    Nothing is in place until everything is written: a failed or interrupted run leaves the previous index
    as it was, and shards are never modified.
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
    )
    line = ProgressLine(progress)

    def indexed(done: int, total: int) -> None:
        line.show(f"Indexing shards  {done}/{total}")
        if done == total:
            line.close()  # the wizard speaks next

    try:
        shard_counts = prepare(
            path, options, TerminalWizard(options, interactive=not non_interactive), indexed
        )
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
