"""The prepare wizard on a terminal: what `energon prepare` 7.4.1 says and asks, in its order.

Continue over an existing index? Which split? (indexes, then shows the first samples) Create a
dataset.yaml? Which sample type? Field map or sample loader? One question per field. Answers may come
from flags instead; with `--non-interactive` nothing is asked and the rules of `Unattended` decide, but
the same things are said.
"""

from __future__ import annotations

import json

import click

from prep.index.dataset_yaml import (
    DatasetDefinition,
    SampleType,
    define_dataset,
    find_sample_type,
    parse_field_map,
    sample_types,
)
from prep.index.format import META_DIR, SAMPLE_LOADER_PY
from prep.index.media import skipped_av_warning
from prep.prepare.run import (
    MAX_FIELD_MAP_PARTS,
    PrepareOptions,
    StagedIndex,
    Unattended,
    data_after_end_warning,
    loader_parts,
    without_end_marker_warning,
)


class TerminalWizard(Unattended):
    """Says what energon's prepare says; asks its questions unless `interactive` is off."""

    def __init__(self, options: PrepareOptions, interactive: bool) -> None:
        super().__init__(options)
        self.interactive = interactive

    def go_over_existing(self, name: str) -> bool:
        if self.options.force_overwrite or not self.interactive:
            return super().go_over_existing(name)
        return click.confirm("It seems the dataset had already been prepared. Do you want to continue?")

    def shards_found(self, shards: list[str]) -> None:
        click.echo(f"Found {len(shards)} tar files in total. The first and last ones are:")
        click.echo(f"- {shards[0]}")
        click.echo(f"- {shards[-1]}")
        click.echo(
            "If you want to exclude some of them, cancel with ctrl+c and specify an exclude filter in the"
            " command line."
        )

    def shards_reused(self, reused: int, total: int) -> None:
        click.echo(f"Resuming: {reused} of {total} shards were indexed by an earlier run and are reused.")

    def shards_without_end_marker(self, shards: list[str]) -> None:
        click.echo(f"Warning: {without_end_marker_warning(shards)}", err=True)

    def shards_with_data_after_end(self, shards: list[tuple[str, int]]) -> None:
        click.echo(f"Warning: {data_after_end_warning(shards)}", err=True)

    def fixing_duplicates(self, line: str) -> None:
        click.echo(line)

    def media_not_described(self, count: int) -> None:
        click.echo(f"Note: {skipped_av_warning(count)}", err=True)

    def media_lost(self, warning: str) -> None:
        click.echo(f"Warning: {warning}", err=True)

    def split_ratio(self) -> str:
        if not self.interactive:
            return super().split_ratio()
        return click.prompt(
            'Please enter a desired train/val/test split like "0.5, 0.2, 0.3" or "8,1,1"', type=str
        )

    def dataset_definition(self, staged: StagedIndex) -> DatasetDefinition | None:
        _show_first_samples(staged)
        part_names = staged.part_names
        if len(part_names) > MAX_FIELD_MAP_PARTS:
            click.echo(
                f"Found the following part types in the dataset: {', '.join(part_names[:10])} and more.."
            )
        else:
            click.echo(f"Found the following part types in the dataset: {', '.join(part_names)}")
        options = self.options
        if options.skip_dataset_yaml:
            create = False
        elif options.sample_type is not None:
            create = True
        elif not self.interactive:
            click.echo("Skipping dataset.yaml creation (use --sample-type or --crude to create it).")
            create = False
        else:
            create = click.confirm("Do you want to create a dataset.yaml interactively?", default=True)
        if not create:
            click.echo("You will have to add a dataset.yaml manually.")
            return None
        sample_type = find_sample_type(options.sample_type) if options.sample_type else _ask_sample_type()
        return self._definition(staged, sample_type)

    def _definition(self, staged: StagedIndex, sample_type: SampleType) -> DatasetDefinition:
        """The definition for the chosen sample type, asking what flags did not say."""
        if sample_type.crude:
            click.echo(
                "CrudeWebdataset does not need a field map. You will need to provide a `Cooker` for your"
                " dataset samples in your `TaskEncoder`."
            )
            click.echo("Furthermore, you might want to add `subflavors` in your meta dataset specification.")
            return define_dataset(sample_type)
        part_names = staged.part_names
        allow_field_map = len(part_names) <= MAX_FIELD_MAP_PARTS
        if self.interactive:
            click.echo("The sample type you selected:\n")
            click.echo(_describe(sample_type))
            if not allow_field_map:
                click.echo("You cannot set a field_map for this dataset. You will need a sample_loader.")
        if self.options.field_map is not None:
            return define_dataset(sample_type, parse_field_map(self.options.field_map))
        if (
            self.interactive
            and allow_field_map
            and click.confirm(
                "Do you want to set a simple field_map[Y] (or write your own sample_loader [n])?",
                default=True,
            )
        ):
            return define_dataset(sample_type, _ask_field_map(sample_type, part_names))
        definition = define_dataset(sample_type, None, loader_parts(staged))
        write_loader = not staged.meta_exists(SAMPLE_LOADER_PY) or (
            self.interactive and click.confirm("Do you want to override the existing sample loader?")
        )
        if not write_loader:
            return DatasetDefinition(definition.yaml)
        click.echo(
            f"\nCreated {staged.name}/{META_DIR}/{SAMPLE_LOADER_PY}. Please edit it to return the proper values."
        )
        return definition


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
        if -len(choices) <= choice < len(choices):  # energon takes -1 for the last, as a list index does
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
                f"Please enter a webdataset field name for '{field.name}' ({field.prompt_type}{default})",
                default="",
                show_default=False,
            )  # not stripped: energon checks the answer as typed, so " txt" is asked again
            if not answer and field.has_default:
                break
            unknown = [option for option in answer.split(",") if option.split("[", 1)[0] not in part_names]
            if not unknown:
                field_map[field.name] = answer
                break
            click.echo("That type doesn't exist in the WebDataset. Please try again.")
    return field_map
