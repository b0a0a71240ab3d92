"""`shardprep info`, `verify` and `preview`: the command-line shells over `prep.inspect`."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from prep.cli import (
    DatasetLocation,
    ProgressLine,
    num_workers_option,
    progress_option,
    tmp_path_option,
)
from prep.codecs import TEXT_LIMIT
from prep.errors import PrepError
from prep.index.format import DATASET_YAML

if TYPE_CHECKING:
    from prep.index.dataset import PreparedDataset

#: The dataset: a prepared folder, or `s3://BUCKET/PATH` / `msc://PROFILE/PATH` (`prep.inspect.remote`).
dataset_argument = click.argument("dataset", type=DatasetLocation())
#: energon lint's `--dataset-config`: a dataset config written under another name (`--dataset-yaml-name`).
dataset_config_option = click.option(
    "--dataset-config",
    default=DATASET_YAML,
    show_default=True,
    help="The dataset config in .nv-meta (one prepared with --dataset-yaml-name).",
)


@click.command("info")
@dataset_argument
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw size histograms into FILE: a PNG (.png added to a name without a suffix), or the format its"
    " suffix names (.pdf, .svg, ...).",
)
@click.option(
    "--largest",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many of the largest samples to list per split.",
)
@dataset_config_option
@tmp_path_option
def info_command(
    dataset: Path | str,
    as_json: bool,
    plot: Path | None,
    largest: int,
    dataset_config: str,
    tmp_path: Path | None,
) -> None:
    """Show per split the shards, samples, bytes, part types with size percentiles and the largest samples."""
    from prep.inspect.info import dataset_info, format_info, index_disagreement, plot_info

    with _opened(dataset, tmp_path) as prepared:
        stats = dataset_info(prepared, largest=largest, dataset_config=dataset_config)
        plotted = None if plot is None else plot_info(prepared, stats, str(plot))
    stats.path = str(dataset)  # not the local mirror of a bucket dataset
    if as_json:
        click.echo(json.dumps(stats.to_dict(), indent=2))
    else:
        click.echo(format_info(stats))
        if plotted is not None:
            click.echo(f"\nplot written to {plotted}")
    if stats.index_disagrees:
        raise PrepError(index_disagreement(stats))


@click.command("verify")
@dataset_argument
@click.option("--deep", is_flag=True, help="Also re-read every header and decode every member.")
@click.option(
    "--load",
    is_flag=True,
    help="Also load every sample through dataset.yaml as energon's loader does (what `energon lint` checks).",
)
@click.option("--split", default=None, help="With --load: the split to load [default: every split].")
@num_workers_option
@progress_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@dataset_config_option
@tmp_path_option
def verify_command(
    dataset: Path | str,
    deep: bool,
    load: bool,
    split: str | None,
    num_workers: int | None,
    progress: bool,
    as_json: bool,
    dataset_config: str,
    tmp_path: Path | None,
) -> None:
    """Check that .info.json, split files, .tar.idx, sqlite and the tars agree; exit 1 if they do not.

    Given a metadataset YAML (or the folder holding `metadataset.yaml`), every dataset it names."""
    from prep.index.metadataset import metadataset_file, named_datasets
    from prep.inspect.verify import Problem, format_report, report_json, verify_dataset

    if split is not None and not load:
        raise click.UsageError("--split is for --load.")
    if isinstance(dataset, str):  # s3:// or msc://: verified on a local mirror of what verify reads
        from prep.inspect.remote import verify_remote

        if load:
            raise click.UsageError("--load reads every sample; run it on a local copy of a bucket dataset.")
        report = verify_remote(dataset, deep=deep, tmp_path=tmp_path, dataset_config=dataset_config)
    elif (metadataset := metadataset_file(dataset)) is not None:
        if load:
            raise click.UsageError(
                "--load loads one prepared dataset through its dataset.yaml; run it on each dataset the"
                f" metadataset names: {named_datasets(metadataset)}."
            )
        from prep.inspect.remote import verify_local_metadataset  # what it names in object storage, mirrored

        report = verify_local_metadataset(metadataset, deep=deep, tmp_path=tmp_path)
    else:
        report = verify_dataset(dataset, deep=deep, dataset_config=dataset_config)
    if load and report.healthy:
        from prep.inspect.load import load_samples

        line = ProgressLine(progress)
        try:
            load_samples(
                report,
                split=split,
                workers=num_workers,
                progress=lambda done, total: line.show(f"loading samples: {done:,}/{total:,}"),
            )
        finally:
            line.close()
    elif load:
        report.warnings.append(
            Problem(
                report.root, "samples were not loaded: the index has problems.", "fix them, then run --load"
            )
        )
    click.echo(report_json(report) if as_json else format_report(report))
    if not report.healthy:
        sys.exit(1)  # prep.cli.main drops the code of click.exceptions.Exit in non-standalone mode


@click.command("preview")
@dataset_argument
@click.option("--split", default=None, help="Split to show (default: train if present, else all shards).")
@click.option(
    "-n",
    "--count",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="How many samples to show.",
)
@click.option("--key", "keys", multiple=True, help="Show the sample with this key (repeatable) instead.")
@click.option("--raw", is_flag=True, help="Show each part's bytes instead of decoding it.")
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=TEXT_LIMIT,
    show_default=True,
    help="Characters (or bytes with --raw) shown per part.",
)
@tmp_path_option
def preview_command(
    dataset: Path | str,
    split: str | None,
    count: int,
    keys: tuple[str, ...],
    raw: bool,
    limit: int,
    tmp_path: Path | None,
) -> None:
    """Print the first samples of a split, decoded: JSON, text, image size and mode, array shape and dtype."""
    from prep.inspect.preview import default_split, first_samples, format_sample, sample_by_key

    with _opened(dataset, tmp_path) as prepared:
        if keys:
            samples = [sample_by_key(prepared, key) for key in keys]
        else:
            samples = list(
                first_samples(prepared, split if split is not None else default_split(prepared), count)
            )
        if not samples:
            click.echo("The split has no samples.")
        unreadable = 0
        for sample in samples:
            shown = format_sample(prepared, sample, raw=raw, limit=limit)
            click.echo(shown.text)
            unreadable += shown.unreadable
    if unreadable:
        raise PrepError(
            f"{unreadable:,} of the parts above could not be read or are not where the index says."
            f" `shardprep verify {shlex.quote(str(dataset))}` names each"
            " damaged shard and what to do about it."
        )


@contextmanager
def _opened(dataset: Path | str, tmp_path: Path | None) -> Iterator[PreparedDataset]:
    """The dataset opened for reading: a local folder, or a bucket dataset through a local mirror of its
    index whose parts are read from the bucket (`prep.inspect.remote`)."""
    from prep.index.dataset import PreparedDataset

    if not isinstance(dataset, str):
        with PreparedDataset(dataset) as prepared:
            yield prepared
        return
    from prep.inspect.remote import RemoteDataset, remote_mirror

    with (
        remote_mirror(dataset, tmp_path=tmp_path) as (mirror, store),
        RemoteDataset(mirror, store) as prepared,
    ):
        yield prepared
