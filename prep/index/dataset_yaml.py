"""What `dataset.yaml` (and the optional `sample_loader.py`) says: which energon sample type to build and how.

Three kinds, as energon's prepare writes them: crude (`CrudeWebdataset`, the samples go to a cooker as
dicts), a sample type with a `field_map` from fields to parts, or a sample type with a user-written
`sample_loader.py`. `define_dataset` chooses among them for `prepare` and `write` alike; the prepare
wizard asks its questions around the same pieces.

>>> definition = define_dataset(find_sample_type("TextSample"), {"text": "txt"})
>>> print(definition.yaml, end="")
sample_type:
  __module__: megatron.energon
  __class__: TextSample
field_map:
  text: txt
>>> definition.sample_loader is None
True
"""

from __future__ import annotations

import posixpath
from typing import NamedTuple

from prep.errors import PrepError
from prep.index.format import (
    INDEX_SQLITE,
    INDEX_UUID,
    INFO_JSON,
    INFO_YAML,
    META_DIR,
    SAMPLE_LOADER_PY,
    SPLIT_YAML,
)
from prep.index.sample_types import PROMPT_TYPES, SAMPLE_TYPES

CRUDE_CLASS = "CrudeWebdataset"
CRUDE_LABEL = "Crude sample (plain dict for cooking)"


class SampleField(NamedTuple):
    name: str
    #: The type as a sample loader's comment names it: `str`, `torch.Tensor`, `typing.Optional[int]`.
    type: str
    has_default: bool
    default: object
    #: The type as energon's wizard words it in its field questions: `<class 'str'>`, `typing.Optional[int]`.
    prompt_type: str = ""


class SampleType(NamedTuple):
    """An energon sample class by name, with the fields a field map or sample loader must fill."""

    label: str
    class_name: str
    fields: tuple[SampleField, ...]

    @property
    def crude(self) -> bool:
        return self.class_name == CRUDE_CLASS


def sample_types() -> list[SampleType]:
    """energon's sample types in the order its wizard numbers them, the crude choice last."""
    listed = [
        SampleType(
            name,
            name,
            tuple(
                SampleField(*field, prompt_type)
                for field, prompt_type in zip(fields, PROMPT_TYPES[name], strict=True)
            ),
        )
        for name, fields in SAMPLE_TYPES
    ]
    return [*listed, SampleType(CRUDE_LABEL, CRUDE_CLASS, ())]


def find_sample_type(class_name: str) -> SampleType:
    """The sample type called `class_name` (e.g. `CaptioningSample`, `CrudeWebdataset`), or a PrepError listing them."""
    for sample_type in sample_types():
        if sample_type.class_name == class_name:
            return sample_type
    available = ", ".join(sample_type.class_name for sample_type in sample_types())
    raise PrepError(f"Sample type {class_name!r} not found. Available sample types: {available}.")


def crude_definition() -> dict:
    return {"__module__": "megatron.energon", "__class__": CRUDE_CLASS}


def field_map_definition(sample_type: SampleType, field_map: dict[str, str]) -> dict:
    return {
        "sample_type": {"__module__": "megatron.energon", "__class__": sample_type.class_name},
        "field_map": field_map,
    }


def sample_loader_definition(sample_type: SampleType, loader_file: str) -> dict:
    return {
        "sample_type": {"__module__": "megatron.energon", "__class__": sample_type.class_name},
        "sample_loader": f"{loader_file}:sample_loader",
        "part_filter": f"{loader_file}:part_filter",
    }


def dataset_yaml_text(definition: dict) -> str:
    import yaml

    return yaml.dump(definition, sort_keys=False)


class DatasetDefinition(NamedTuple):
    """The text of `dataset.yaml`, and of the `sample_loader.py` it names (None when it names none)."""

    yaml: str
    sample_loader: str | None = None


#: The index's own files: a dataset.yaml written under one of these names would replace it.
_INDEX_FILES = (INFO_JSON, INFO_YAML, SPLIT_YAML, INDEX_SQLITE, INDEX_UUID, SAMPLE_LOADER_PY)


def check_dataset_yaml_name(name: str) -> None:
    """Refuse a --dataset-yaml-name that is not a file inside `.nv-meta` or that is one of the index's own
    files (energon writes there anyway: over its own index.sqlite, or over a shard with `../`).

    >>> check_dataset_yaml_name("configs/captioning.yaml")
    >>> check_dataset_yaml_name("split.yaml")
    Traceback (most recent call last):
    prep.errors.PrepError: --dataset-yaml-name 'split.yaml' names a file of the index itself (.nv-meta/split.yaml), which the dataset.yaml would replace. Give another name, e.g. dataset.yaml.
    """
    inside = posixpath.normpath(name) if name else ""  # `./x.yaml` is x.yaml, as energon writes it
    if inside in ("", ".") or name.startswith("/") or name.endswith("/") or inside.split("/")[0] == "..":
        raise PrepError(
            f"--dataset-yaml-name {name!r} must be a file name inside {META_DIR} (a relative path that"
            " stays inside it), e.g. dataset.yaml or configs/captioning.yaml."
        )
    if inside in _INDEX_FILES:
        raise PrepError(
            f"--dataset-yaml-name {name!r} names a file of the index itself ({META_DIR}/{name}), which the"
            " dataset.yaml would replace. Give another name, e.g. dataset.yaml."
        )


def check_definition(sample_type: SampleType, field_map: dict[str, str] | None) -> None:
    """Refuse a definition energon cannot use (before any work is done, and without writing it)."""
    if sample_type.crude and field_map:
        raise PrepError("--field-map needs a --sample-type other than CrudeWebdataset.")


def define_dataset(
    sample_type: SampleType, field_map: dict[str, str] | None = None, loader_parts: list[str] | None = None
) -> DatasetDefinition:
    """How energon builds samples: crude, by `field_map`, or (with neither) by a `sample_loader.py` whose
    template lists `loader_parts` (default: a TODO) for the user to edit."""
    check_definition(sample_type, field_map)
    if sample_type.crude:
        return DatasetDefinition(dataset_yaml_text(crude_definition()))
    if field_map is not None:  # an empty map too (`field_map: {}`), as energon writes it
        return DatasetDefinition(dataset_yaml_text(field_map_definition(sample_type, field_map)))
    return DatasetDefinition(
        dataset_yaml_text(sample_loader_definition(sample_type, SAMPLE_LOADER_PY)),
        sample_loader_template(sample_type, loader_parts or ["TODO"]),
    )


#: What each field of the `sample_loader.py` template reads (energon's template too): a module that still
#: holds it fails on every sample.
TEMPLATE_FIELD = 'raw["TODO"]'


def sample_loader_template(sample_type: SampleType, parts: list[str]) -> str:
    """A `sample_loader.py` to edit: valid Python that energon imports as written (every field a TODO)."""
    lines = [
        "# This file was automatically generated by `shardprep prepare`.",
        "# TODO: Edit it to return the proper fields.",
        "# import torch",
        "",
        "",
        "def sample_loader(raw: dict) -> dict:",
        "    # Note: images are already decoded to tensors.",
        "    # TODO: Set the correct values for all (required) fields.",
        "    return dict(",
    ]
    for field in sample_type.fields:
        line = f"        {field.name}={TEMPLATE_FIELD},  # expected type: {field.type}"
        if field.has_default:
            line += f", default: {field.default!r}"
        lines.append(line)
    lines += [
        "    )",
        "",
        "",
        "def part_filter(part: str) -> bool:",
        "    # TODO: Keep only the parts sample_loader needs, so the others are not decoded.",
        f"    return part in {tuple(parts)!r}",
        "",
    ]
    return "\n".join(lines)


def field_map_parts(field_map: dict[str, str]) -> dict[str, list[str]]:
    """The parts each field of a field map is read from, as energon reads the map (`a,b`: the first of
    parts a and b that a sample has; `json[text]`: a key inside part json).

    >>> field_map_parts({"text": "txt,json[text]", "image": "jpg"})
    {'text': ['txt', 'json'], 'image': ['jpg']}
    """
    return {
        field: [option.partition("[")[0] for option in str(spec).split(",")]
        for field, spec in field_map.items()
    }


def parse_field_map(text: str) -> dict[str, str]:
    """The --field-map JSON object, e.g. `{"image": "jpg", "caption": "txt"}`."""
    import json

    try:
        field_map = json.loads(text)
    except json.JSONDecodeError as error:
        raise PrepError(f"Invalid JSON in --field-map: {error}.") from None
    if not isinstance(field_map, dict):
        raise PrepError('--field-map must be a JSON object, e.g. \'{"image": "jpg", "caption": "txt"}\'.')
    return field_map
