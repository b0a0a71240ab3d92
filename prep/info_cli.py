"""`shardprep info`: the command-line shell over prep.info."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.command("info")
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON.")
@click.option(
    "--plot", type=click.Path(dir_okay=False, path_type=Path), help="Draw size histograms into FILE.png."
)
@click.option(
    "--largest", default=5, show_default=True, help="How many of the largest samples to list per split."
)
def info_command(dataset: Path, as_json: bool, plot: Path | None, largest: int) -> None:
    """Show per split the shards, samples, bytes, part types with size percentiles and the largest samples."""
    from prep.dataset_reader import PreparedDataset
    from prep.info import dataset_info, format_info, plot_info

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
