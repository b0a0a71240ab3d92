"""`shardprep info`, `verify` and `preview`: the command-line shells over `prep.inspect`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from prep.cli import ProgressLine, dataset_argument, num_workers_option, progress_option
from prep.codecs import TEXT_LIMIT


@click.command("info")
@dataset_argument
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@click.option(
    "--plot", type=click.Path(dir_okay=False, path_type=Path), help="Draw size histograms into FILE.png."
)
@click.option(
    "--largest", default=5, show_default=True, help="How many of the largest samples to list per split."
)
def info_command(dataset: Path, as_json: bool, plot: Path | None, largest: int) -> None:
    """Show per split the shards, samples, bytes, part types with size percentiles and the largest samples."""
    from prep.index.dataset import PreparedDataset
    from prep.inspect.info import dataset_info, format_info, plot_info

    with PreparedDataset(dataset) as prepared:
        stats = dataset_info(prepared, largest=largest)
        if plot is not None:
            plot_info(prepared, stats, str(plot))
    if as_json:
        click.echo(json.dumps(stats.to_dict(), indent=2))
    else:
        click.echo(format_info(stats))
        if plot is not None:
            click.echo(f"\nplot written to {plot}")


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
def verify_command(
    dataset: Path,
    deep: bool,
    load: bool,
    split: str | None,
    num_workers: int | None,
    progress: bool,
    as_json: bool,
) -> None:
    """Check that .info.json, split files, .tar.idx, sqlite and the tars agree; exit 1 if they do not."""
    from prep.inspect.verify import Problem, format_report, report_json, verify_dataset

    if split is not None and not load:
        raise click.UsageError("--split is for --load.")
    report = verify_dataset(dataset, deep=deep)
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
@click.option("-n", "--count", default=3, show_default=True, help="How many samples to show.")
@click.option("--key", "keys", multiple=True, help="Show the sample with this key (repeatable) instead.")
@click.option("--raw", is_flag=True, help="Show each part's bytes instead of decoding it.")
@click.option(
    "--limit", default=TEXT_LIMIT, show_default=True, help="Characters (or bytes with --raw) shown per part."
)
def preview_command(
    dataset: Path, split: str | None, count: int, keys: tuple[str, ...], raw: bool, limit: int
) -> None:
    """Print the first samples of a split, decoded: JSON, text, image size and mode, array shape and dtype."""
    from prep.index.dataset import PreparedDataset
    from prep.inspect.preview import default_split, first_samples, format_sample, sample_by_key

    with PreparedDataset(dataset) as prepared:
        if keys:
            samples = [sample_by_key(prepared, key) for key in keys]
        else:
            samples = list(
                first_samples(prepared, split if split is not None else default_split(prepared), count)
            )
        if not samples:
            click.echo("The split has no samples.")
        for sample in samples:
            click.echo(format_sample(prepared, sample, raw=raw, limit=limit))
