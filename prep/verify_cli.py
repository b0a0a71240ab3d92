"""`shardprep verify`: the command-line shell over prep.verify; the exit status says healthy or not."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.command("verify")
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.option("--deep", is_flag=True, help="Also re-read every header and decode every member.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify_command(dataset: Path, deep: bool, as_json: bool) -> None:
    """Check that .info.json, split files, .tar.idx, sqlite and the tars agree; exit 1 if they do not."""
    from prep.verify import format_report, report_json, verify_dataset

    report = verify_dataset(dataset, deep=deep)
    click.echo(report_json(report) if as_json else format_report(report))
    if not report.healthy:
        sys.exit(1)  # prep.cli.main drops the code of click.exceptions.Exit in non-standalone mode
