"""`shardprep preview`: the command-line shell over prep.preview."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("preview")
@click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))
@click.option("--split", default=None, help="Split to show (default: train if present, else all shards).")
@click.option("-n", "--count", default=3, show_default=True, help="How many samples to show.")
@click.option("--key", "keys", multiple=True, help="Show the sample with this key (repeatable) instead.")
@click.option("--raw", is_flag=True, help="Show each part's bytes instead of decoding it.")
@click.option(
    "--limit", default=600, show_default=True, help="Characters (or bytes with --raw) shown per part."
)
def preview_command(
    dataset: Path, split: str | None, count: int, keys: tuple[str, ...], raw: bool, limit: int
) -> None:
    """Print the first samples of a split, decoded: JSON, text, image size and mode, array shape and dtype."""
    from prep.dataset_reader import PreparedDataset
    from prep.preview import default_split, first_samples, format_sample, sample_by_key

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
