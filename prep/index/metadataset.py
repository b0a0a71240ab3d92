"""An energon metadataset (a MetadatasetV2 YAML, as `shardprep write --media-column` writes) read for the
datasets it names, so the inspecting commands can say which folders to look at and check that each is
where the YAML says.

Every dataset reference is a mapping with a `path` (under `splits`, and inside `blend`, `join` and
`blend_epochized` lists and mappings); its `aux` mapping names auxiliary datasets, `filesystem://PATH`
for a plain folder of files, or a prepared dataset's path. The dataset's split energon loads for a
metadataset split is the nearest `split_part` at or above the reference (its own, or its `join`'s), else
the metadataset split's name, read from the reference's `split_config` (split.yaml unless given). energon
7.4.1 reads no `aux` of an element of a `join` (its join loader gives the joined samples no auxiliary
dataset), so such a reference's `aux` is kept apart as ignored. Relative paths start at the YAML's
folder, as energon resolves them; a `path` that is itself a metadataset YAML is read in turn. Paths in
object storage (`msc://`, `s3://`, `filesystem+msc://`) are left out, or, for a verify that mirrors
them, resolved to their place in the mirror (`read_metadataset`'s `mirror`). The YAML is
read with the safe loader, and refused where energon's reader reads it otherwise (`prep.index.yaml_reader`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from prep.errors import PrepError
from prep.index.epath import resolved_parts
from prep.index.format import DATASET_YAML, META_DIR, METADATASET_YAML, SPLIT_YAML

#: A reference with a scheme (`msc://`, `s3://`, `filesystem://`, `filesystem+s3://`).
_URL = re.compile(r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<path>.*)", re.IGNORECASE)
#: The scheme of an auxiliary folder of plain files (not a prepared dataset).
FILESYSTEM_SCHEME = "filesystem"
#: The file name endings of a metadataset YAML: a dataset reference's `path` ending so is a nested one.
METADATASET_SUFFIXES = (".yaml", ".yml")
#: How deep metadatasets may name metadatasets (a loop ends here).
MAX_NESTING = 16


@dataclass(frozen=True)
class AuxReference:
    """An auxiliary dataset of a dataset reference: its name, the text of the YAML, and where it is."""

    name: str
    written: str
    path: Path
    #: A plain folder of files (`filesystem://`), not a prepared dataset.
    folder: bool


@dataclass(frozen=True)
class DatasetReference:
    """A dataset a metadataset names: the YAML naming it, the split it is under, the text of its `path`,
    where that resolves to, and its auxiliary datasets."""

    metadataset: Path
    split: str
    written: str
    path: Path
    aux: tuple[AuxReference, ...]
    #: The dataset config in the dataset's `.nv-meta` (the reference's `dataset_config`).
    dataset_config: str = DATASET_YAML
    #: The dataset's split energon loads for `split` (a `split_part` of the reference or its `join`, else
    #: `split`), from its `.nv-meta/{split_config}`.
    split_part: str = ""
    split_config: str = SPLIT_YAML
    #: The `aux` of an element of a `join`, which energon ignores (`aux` is then empty).
    ignored_aux: tuple[AuxReference, ...] = ()


def metadataset_file(location: Path) -> Path | None:
    """The metadataset YAML that `location` stands for: the file itself, or `metadataset.yaml` in a folder
    that is not a prepared dataset (what `shardprep write --media-column` writes); None otherwise."""
    if location.is_file() and location.suffix in METADATASET_SUFFIXES:
        return location
    if location.is_dir() and not (location / META_DIR).is_dir() and (location / METADATASET_YAML).is_file():
        return location / METADATASET_YAML
    return None


def read_metadataset(path: Path, mirror: Path | None = None, _depth: int = 0) -> list[DatasetReference]:
    """Every local dataset reference of the metadataset YAML at `path`, nested metadatasets read in turn,
    each whole (energon loads, of a nested one, the split its reference loads: the rest is read as if it
    were loaded on its own). With `mirror`, a reference in object storage is one too, at its place in a
    local mirror of object storage, `mirror/SCHEME/BUCKET_OR_PROFILE/KEY` (`in_mirror`).

    PrepError naming the file when it cannot be read or is not a metadataset.
    """
    import yaml

    from prep.index.yaml_reader import load_yaml

    try:
        document = load_yaml(path.read_text(encoding="utf-8"), path)
    except OSError as error:
        raise PrepError(f"{path} cannot be read ({error.strerror}).") from None
    except (UnicodeDecodeError, yaml.YAMLError) as error:
        raise PrepError(f"{path} is not a valid YAML file ({error}).") from None
    if not isinstance(document, dict) or not isinstance(document.get("splits"), dict):
        raise PrepError(
            f"{path} is not an energon metadataset (a YAML mapping with `splits`), and a prepared dataset is"
            f" a folder: give the folder that holds the shards and {META_DIR}/."
        )
    references: list[DatasetReference] = []
    for split, node in document["splits"].items():
        for reference, split_part, joined in _references(node, str(split)):
            written = reference["path"]
            resolved = _resolve(path, written, mirror)
            if resolved is None:
                continue
            if resolved.suffix in METADATASET_SUFFIXES and resolved.is_file():
                if _depth >= MAX_NESTING:
                    raise PrepError(f"{path} names metadatasets more than {MAX_NESTING} deep (a loop?).")
                references.extend(read_metadataset(resolved, mirror, _depth + 1))
                continue
            aux = reference.get("aux")
            aux = _aux(path, aux if isinstance(aux, dict) else {}, mirror)
            references.append(
                DatasetReference(
                    path,
                    str(split),
                    written,
                    resolved,
                    () if joined else aux,
                    _text(reference, "dataset_config", DATASET_YAML),
                    split_part,
                    _text(reference, "split_config", SPLIT_YAML),
                    aux if joined else (),
                )
            )
    return references


def _references(node: object, split_part: str, joined: bool = False) -> list[tuple[dict, str, bool]]:
    """(mapping, the split it loads, whether it is an element of a `join`) of every mapping with a `path`
    at or below `node`; `split_part` is the split loaded where no mapping on the way names one, `joined`
    whether `node` is inside a `join`."""
    if isinstance(node, list):
        return [found for item in node for found in _references(item, split_part, joined)]
    if not isinstance(node, dict):
        return []
    split_part = _text(node, "split_part", split_part)
    if isinstance(node.get("path"), str):
        return [(node, split_part, joined)]
    return [
        found
        for key, value in node.items()
        for found in _references(value, split_part, joined or key == "join")
    ]


def _text(mapping: dict, name: str, default: str) -> str:
    """`mapping[name]` if it is a text, else `default`."""
    value = mapping.get(name)
    return value if isinstance(value, str) else default


def _resolve(metadataset: Path, written: str, mirror: Path | None) -> Path | None:
    """A reference's local path, relative to the metadataset's folder; for object storage, its place in
    `mirror` (`in_mirror`), or None without one."""
    match = _URL.match(written)
    if match is None:
        return metadataset.parent / written
    kind, _, scheme = match.group("scheme").lower().partition("+")  # filesystem+msc:// is msc:// too
    if kind == FILESYSTEM_SCHEME and not scheme:
        return metadataset.parent / match.group("path")
    return None if mirror is None else in_mirror(mirror, scheme or kind, match.group("path"))


def in_mirror(mirror: Path, scheme: str, rest: str) -> Path:
    """Where `scheme://rest` (`rest`: bucket or profile, then key) is in a local `mirror` of object storage:
    its key read as energon reads it (`prep.index.epath`: `x/../set` is `set`, whether or not `x` is
    there); one climbing above its bucket as written, which is nowhere energon reads.

    >>> in_mirror(Path("/m"), "s3", "bucket/data/set"), in_mirror(Path("/m"), "msc", "p/x/../set")
    (PosixPath('/m/s3/bucket/data/set'), PosixPath('/m/msc/p/set'))
    """
    authority, _, path = rest.partition("/")
    parts = resolved_parts(path)
    return mirror / scheme / rest if parts is None else mirror.joinpath(scheme, authority, *parts)


def _aux(metadataset: Path, aux: dict, mirror: Path | None) -> tuple[AuxReference, ...]:
    found = []
    for name, written in aux.items():
        if not isinstance(written, str):
            continue
        path = _resolve(metadataset, written, mirror)
        if path is None:
            continue
        match = _URL.match(written)
        folder = match is not None and match.group("scheme").lower().partition("+")[0] == FILESYSTEM_SCHEME
        found.append(AuxReference(str(name), written, path, folder))
    return tuple(found)


def metadataset_error(location: Path, metadataset: Path) -> PrepError:
    """The error for a command that reads one prepared dataset and was given a metadataset: it names the
    datasets the metadataset names, for the user to give one of them, and says that `verify` checks a
    metadataset whole."""
    try:
        named = named_datasets(metadataset)
    except PrepError as error:
        return error
    return PrepError(
        f"{location} is an energon metadataset ({metadataset.name}), not a prepared dataset. Give one of the"
        f" datasets it names: {named}; `shardprep verify` checks a metadataset whole."
    )


def named_datasets(metadataset: Path) -> str:
    """The datasets a metadataset names, with their splits, for people: `a/primary (split train)`."""
    references = read_metadataset(metadataset)
    named = dict.fromkeys(f"{reference.path} (split {reference.split})" for reference in references)
    return ", ".join(named) or "none (it names no local dataset)"
