"""The files a polylithic dataset's samples read from its auxiliary dataset, checked to be there.

`shardprep write --media-column` gives each primary sample an `aux.json` part: {field: file name in
the auxiliary dataset}. energon's loader skips, without a word, every sample one of whose files the
auxiliary dataset does not have, so `verify` names them. The references are read in one pass (the
`aux.json` parts only) and looked up in a set: the auxiliary dataset's index (`KEY.PART`, as energon
looks a name up), or the listing of the folders the names are in, for a `filesystem://` folder. No media
byte is read.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from prep.index.dataset import PreparedDataset
from prep.index.format import AUX_PART


@dataclass(frozen=True)
class Reference:
    """One file a sample reads from the auxiliary dataset, or (`name` None) an `aux.json` that names
    none because it is not a JSON object of file names (`problem` says why)."""

    shard: str
    key: str
    #: The byte offset of the sample's `aux.json` part in its shard.
    offset: int
    field: str = ""
    name: str | None = None
    problem: str = ""


def loaded_references(primary: PreparedDataset, splits: Collection[str], split_file: str) -> list[Reference]:
    """Every reference of the samples energon loads from `splits` of the split file (their shards' samples,
    less those `exclude`d one by one), in shard order. A shard that cannot be read is left out: verifying
    the primary dataset says what is wrong with it."""
    in_splits = {
        name for split, names in primary.splits(split_file).items() if split in splits for name in names
    }
    excluded = primary.excluded_samples(split_file)
    references: list[Reference] = []
    unreadable: set[int] = set()
    for key, location in primary.index.parts_named(AUX_PART):
        shard = primary.shards[location.tar_file_id] if location.tar_file_id < len(primary.shards) else None
        if shard not in in_splits or location.tar_file_id in unreadable:
            continue
        if key in excluded.get(location.tar_file_id, ()):
            continue
        try:
            text = primary.read_part(location)
        except OSError:
            unreadable.add(location.tar_file_id)
            continue
        references.extend(_references(shard, key, location.offset, text))
    return references


def _references(shard: str, key: str, offset: int, text: bytes) -> list[Reference]:
    try:
        names = json.loads(text)
    except ValueError as error:
        return [Reference(shard, key, offset, problem=f"is not JSON ({error})")]
    if not isinstance(names, dict) or not all(isinstance(name, str) for name in names.values()):
        return [Reference(shard, key, offset, problem="is not a JSON object of file names")]
    return [Reference(shard, key, offset, str(field), name) for field, name in names.items()]


def folder_files(folder: Path, names: Iterable[str]) -> set[str]:
    """Those of `names` (relative to `folder`, as energon joins them) that are files: each folder they
    are in listed once."""
    by_folder: dict[str, list[str]] = defaultdict(list)
    for name in names:
        path = os.path.join(folder, name)
        by_folder[os.path.dirname(path)].append(name)
    present = set()
    for parent, wanted in by_folder.items():
        try:
            with os.scandir(parent) as entries:
                files = {entry.name for entry in entries if entry.is_file()}
        except OSError:  # not a folder, or gone: none of its names is there
            continue
        present.update(name for name in wanted if os.path.basename(name) in files)
    return present


def dataset_files(auxiliary: Path) -> set[str]:
    """The names a prepared auxiliary dataset has, as energon looks them up (`KEY.PART`)."""
    with PreparedDataset(auxiliary) as dataset:
        return dataset.index.entry_names()
