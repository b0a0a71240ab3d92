"""`shardprep prepare`: energon prepare's options and questions, over `prep.prepare`.

Asks what `energon prepare` 7.4.1 asks, in its order: continue over an existing index? which split?
(indexes, then shows the first samples) create a dataset.yaml? which sample type? field map or sample
loader? one question per field. Answers may come from flags instead; --non-interactive never asks.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from prep.dataset_yaml import (
    SampleType,
    crude_definition,
    dataset_yaml_text,
    field_map_definition,
    find_sample_type,
    parse_field_map,
    sample_loader_definition,
    sample_loader_template,
    sample_types,
)
from prep.errors import PrepError
from prep.index_format import META_DIR, SAMPLE_LOADER_PY
from prep.prepare import (
    SplitSpec,
    StagedIndex,
    check_dataset_root,
    is_prepared,
    list_dataset_shards,
    reindexed_shards,
    stage_index,
)
from prep.split import parse_split_parts, parse_split_ratio

#: With more part types than this, energon offers no interactive field map (a sample loader instead).
MAX_FIELD_MAP_PARTS = 10


def _progress_bar(enabled: bool) -> Callable[[Iterator, int], Iterator] | None:
    """A per-shard progress bar on a terminal; None when disabled or when stdout is not a terminal."""
    if not enabled or not sys.stdout.isatty():
        return None

    def progress(results: Iterator, total: int) -> Iterator:
        with click.progressbar(results, length=total, label="Indexing shards", show_pos=True) as bar:
            yield from bar

    return progress


def _choose_split(split_ratio: str | None, split_parts: tuple[str, ...], non_interactive: bool, shuffle: bool) -> SplitSpec:
    if split_parts:
        return SplitSpec(patterns=parse_split_parts(split_parts))
    if split_ratio is None:
        if non_interactive:
            raise PrepError(
                "--split-ratio is required with --non-interactive (unless --split-parts or --tar-index-only"
                " is given), e.g. --split-ratio 8,1,1."
            )
        split_ratio = click.prompt('Please enter a desired train/val/test split like "0.5, 0.2, 0.3" or "8,1,1"', type=str)
    return SplitSpec(ratio=parse_split_ratio(split_ratio), shuffle_seed=42 if shuffle else None)


def _show_first_samples(staged: StagedIndex) -> None:
    """Print the parts of the first samples and their JSON, shortened, as energon does after indexing."""
    first_shard = staged.shards[0]
    for number, (_, parts) in enumerate(staged.first_samples):
        click.echo(f"Sample {number}, keys:")
        for part, _, _ in parts:
            click.echo(f" - {part}")
        for part, offset, size in parts:
            if part == "json":
                try:
                    content = json.loads(staged.read_part(first_shard, offset, size))
                except ValueError:
                    continue
                click.echo(f"Json content of sample {number} of {first_shard}:")
                click.echo(json.dumps(_shorten(content), indent=2))


def _shorten(data: object) -> object:
    if isinstance(data, dict):
        return {key: _shorten(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_shorten(value) for value in data[:3]] + (["..."] if len(data) > 3 else [])
    if isinstance(data, str):
        return data[:25] + ("..." if len(data) > 25 else "")
    return data


def _ask_sample_type() -> SampleType:
    choices = sample_types()
    click.echo("The following sample types are available:")
    for number, sample_type in enumerate(choices):
        click.echo(f"{number}. {sample_type.label}")
    while True:
        choice = click.prompt("Please enter a number to choose a class", type=int)
        if 0 <= choice < len(choices):
            return choices[choice]
        click.echo("Invalid choice. Please try again.")


def _describe(sample_type: SampleType) -> str:
    lines = [f"class {sample_type.class_name}(Sample):"]
    for field in sample_type.fields:
        default = f" = {field.default!r}" if field.has_default else ""
        lines.append(f"    {field.name}: {field.type}{default}")
    return "\n".join(lines) + "\n"


def _ask_field_map(sample_type: SampleType, part_names: list[str]) -> dict[str, str]:
    click.echo("\nFor each field, please specify the corresponding name in the WebDataset.")
    click.echo(f"Available types in WebDataset: {', '.join(part_names)}")
    click.echo("Leave empty for skipping optional field")
    click.echo("You may also access json fields e.g. by setting the field to: json[field][field]")
    click.echo("You may also specify alternative fields e.g. by setting to: jpg,png")
    click.echo(f"Please enter the field_map for {sample_type.class_name}:")
    field_map: dict[str, str] = {}
    for field in sample_type.fields:
        default = f", default: {field.default}" if field.has_default else ""
        while True:
            answer = click.prompt(
                f"Please enter a webdataset field name for '{field.name}' ({field.type}{default})",
                default="",
                show_default=False,
            ).strip()
            if not answer and field.has_default:
                break
            unknown = [option for option in answer.split(",") if option.split("[", 1)[0] not in part_names]
            if answer and not unknown:
                field_map[field.name] = answer
                break
            click.echo("That type doesn't exist in the WebDataset. Please try again.")
    return field_map


def _dataset_definition(
    staged: StagedIndex,
    sample_type: SampleType,
    field_map: str | None,
    non_interactive: bool,
) -> dict:
    """The dataset.yaml contents for the chosen sample type, asking what flags did not say."""
    if sample_type.crude:
        click.echo(
            "CrudeWebdataset does not need a field map. You will need to provide a `Cooker` for your dataset"
            " samples in your `TaskEncoder`."
        )
        click.echo("Furthermore, you might want to add `subflavors` in your meta dataset specification.")
        return crude_definition()
    part_names = staged.part_names
    allow_field_map = len(part_names) <= MAX_FIELD_MAP_PARTS
    if not non_interactive:
        click.echo("The sample type you selected:\n")
        click.echo(_describe(sample_type))
        if not allow_field_map:
            click.echo("You cannot set a field_map for this dataset. You will need a sample_loader.")
    if field_map is not None:
        return field_map_definition(sample_type, parse_field_map(field_map))
    if (
        not non_interactive
        and allow_field_map
        and click.confirm(
            "Do you want to set a simple field_map[Y] (or write your own sample_loader [n])?", default=True
        )
    ):
        return field_map_definition(sample_type, _ask_field_map(sample_type, part_names))
    write_loader = not staged.meta_exists(SAMPLE_LOADER_PY) or (
        not non_interactive and click.confirm("Do you want to override the existing sample loader?")
    )
    if write_loader:
        parts = part_names if allow_field_map else ["TODO"]
        staged.write_meta(SAMPLE_LOADER_PY, sample_loader_template(sample_type, parts))
        click.echo(
            f"\nCreated {staged.root / META_DIR / SAMPLE_LOADER_PY}. Please edit it to return the proper values."
        )
    return sample_loader_definition(sample_type, SAMPLE_LOADER_PY)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@click.command(name="prepare")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--progress/--no-progress", default=True, help="Show a progress bar (only on a terminal).")
@click.option(
    "--split-parts",
    multiple=True,
    help="Split by shard path pattern, NAME:REGEX, e.g. 'train:train/{000000..009999}.tar' (brace expansion,"
    " then re.match). Repeatable. Overrides --split-ratio.",
)
@click.option("--exclude", help="Leave out shards whose path (relative to PATH) matches this regex anywhere.")
@click.option("--num-workers", type=int, default=None, help="Processes scanning shards [default: CPU count].")
@click.option("--tar-index-only", is_flag=True, help="Only re-create the shard indexes (.tar.idx, index.sqlite).")
@click.option("--shuffle-tars", is_flag=True, help="Shuffle the shards (seed 42) before splitting by ratio.")
@click.option("--non-interactive", is_flag=True, help="Never ask; missing answers are errors.")
@click.option("--split-ratio", help="Train/val/test ratio over whole shards, e.g. '8,1,1' or '0.8,0.1,0.1'.")
@click.option("--force-overwrite", is_flag=True, help="Re-prepare an already prepared dataset without asking.")
@click.option("--skip-dataset-yaml", is_flag=True, help="Write no dataset.yaml (and no sample loader).")
@click.option("--dataset-yaml-name", default="dataset.yaml", show_default=True, help="File name of the dataset.yaml.")
@click.option("--sample-type", help="energon sample type for dataset.yaml, e.g. CaptioningSample or CrudeWebdataset.")
@click.option("--field-map", help='Fields to parts as JSON, e.g. \'{"image": "jpg", "caption": "txt"}\'.')
@click.option("--crude", is_flag=True, help="Write a CrudeWebdataset dataset.yaml (samples go to a cooker).")
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
) -> None:
    """Index the WebDataset shards under PATH and write energon's .nv-meta (as `energon prepare` does).

    Nothing is in place until everything is written: a failed or interrupted run leaves the previous index
    as it was, and shards are never modified.
    """
    started = time.perf_counter()
    # `kill` (SIGTERM) unwinds like Ctrl-C, so the staged files are removed and the old index stays.
    signal.signal(signal.SIGTERM, _interrupt)
    if crude:
        if sample_type not in (None, "CrudeWebdataset"):
            raise PrepError("--crude and --sample-type name different sample types; give one of them.")
        sample_type = "CrudeWebdataset"
    chosen_type = find_sample_type(sample_type) if sample_type is not None else None
    if num_workers is not None and num_workers < 1:
        raise PrepError("--num-workers must be at least 1.")

    if tar_index_only:
        shards = reindexed_shards(path, exclude)
        split = None
    else:
        check_dataset_root(path)
        if is_prepared(path) and not force_overwrite:
            if non_interactive:
                raise PrepError(
                    f"{path} has already been prepared. Use --force-overwrite to prepare it again."
                )
            if not click.confirm("It seems the dataset had already been prepared. Do you want to continue?"):
                return
        shards = list_dataset_shards(path, exclude)
        click.echo(f"Found {len(shards)} tar files in total. The first and last ones are:")
        click.echo(f"- {shards[0]}")
        click.echo(f"- {shards[-1]}")
        click.echo(
            "If you want to exclude some of them, cancel with ctrl+c and specify an exclude filter in the"
            " command line."
        )
        split = _choose_split(split_ratio, split_parts, non_interactive, shuffle_tars)

    staged = stage_index(path, shards, split=split, num_workers=num_workers, progress=_progress_bar(progress))
    try:
        if split is not None:
            _finish_dataset_yaml(
                staged, chosen_type, field_map, non_interactive, skip_dataset_yaml, dataset_yaml_name
            )
        staged.commit()
    except BaseException:
        staged.abort()
        raise
    for shard, count in staged.shard_counts.items():
        if count == 0:
            click.echo(f"Note: {shard} holds no samples; it is indexed with a count of 0.", err=True)
    total = sum(staged.shard_counts.values())
    elapsed = time.perf_counter() - started
    click.echo(f"Done: indexed {total} samples in {len(shards)} shards in {elapsed:.2f} s.")


def _finish_dataset_yaml(
    staged: StagedIndex,
    chosen_type: SampleType | None,
    field_map: str | None,
    non_interactive: bool,
    skip_dataset_yaml: bool,
    dataset_yaml_name: str,
) -> None:
    _show_first_samples(staged)
    part_names = staged.part_names
    if len(part_names) > MAX_FIELD_MAP_PARTS:
        click.echo(f"Found the following part types in the dataset: {', '.join(part_names[:10])} and more..")
    else:
        click.echo(f"Found the following part types in the dataset: {', '.join(part_names)}")
    if skip_dataset_yaml:
        create = False
    elif chosen_type is not None:
        create = True
    elif non_interactive:
        click.echo("Skipping dataset.yaml creation (use --sample-type or --crude to create it).")
        create = False
    else:
        create = click.confirm("Do you want to create a dataset.yaml interactively?", default=True)
    if not create:
        click.echo("You will have to add a dataset.yaml manually.")
        return
    sample_type = chosen_type if chosen_type is not None else _ask_sample_type()
    definition = _dataset_definition(staged, sample_type, field_map, non_interactive)
    staged.write_meta(dataset_yaml_name, dataset_yaml_text(definition))
