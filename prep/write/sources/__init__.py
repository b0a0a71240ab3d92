"""Sources of records for `write`, one module per kind, found through one registry.

A source is anything with `records()` yielding `Record` or `Reject` and a `default_parts` saying which
parts a record becomes when the user maps none:

- `"json-line"`: the record's raw line as a `json` part, byte for byte (JSONL);
- `"json-row"`: the whole row as a `json` part (CSV, Parquet);
- `"by-name"`: every field as the part of that name, e.g. `{"jpg": ..., "txt": ...}` (folders, dicts);
- a list of (field, part) pairs (parallel text).

`SOURCE_KINDS` registers each kind with its module and the file suffixes it is chosen by; `open_sources`
opens what the command line names. `DictSource` wraps any iterable of dicts (the Python API).

>>> [r.fields for r in DictSource([{"txt": "hi"}]).records()]
[{'txt': 'hi'}]
"""

from __future__ import annotations

import codecs
import importlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prep.errors import PrepError

#: A field of this name (webdataset's convention) holds the sample key.
KEY_FIELD = "__key__"
#: The byte order mark that Excel and some editors put before a UTF-8 file's first line: not part of it.
UTF8_BOM = codecs.BOM_UTF8


def text_start(path: Path) -> int:
    """The byte offset of a text file's first line: after its UTF-8 byte order mark, if it has one."""
    with open(path, "rb") as file:
        return len(UTF8_BOM) if file.read(len(UTF8_BOM)) == UTF8_BOM else 0


@dataclass(slots=True)
class Record:
    """One input sample: its fields, where it came from (`file:line`), and what else the source knows."""

    fields: dict
    where: str
    key: str | None = None
    #: The record's bytes as read (a JSONL line), kept so a `json` part can be written unchanged.
    raw: bytes | None = None
    #: The folder relative media paths in the record are read from.
    base: Path | None = None


@dataclass(slots=True)
class Reject:
    """Input that is not a valid record: where, why, and the offending text."""

    where: str
    reason: str
    input: str = ""


class Source(Protocol):
    name: str
    default_parts: str | list[tuple[str, str]]
    #: The files and folders it reads (none for an iterable): `write` keeps OUT_DIR apart from them.
    paths: list[Path]

    def records(self) -> Iterator[Record | Reject]: ...


class DictSource:
    """Any iterable of dicts, webdataset style: `__key__` (optional) and parts named by extension."""

    default_parts = "by-name"
    paths: list[Path] = []

    def __init__(self, items: Iterable[dict], name: str = "<iterable>") -> None:
        self.items = items
        self.name = name

    def records(self) -> Iterator[Record | Reject]:
        for number, item in enumerate(self.items, 1):
            where = f"{self.name}:{number}"
            if not isinstance(item, dict):
                yield Reject(where, f"item is a {type(item).__name__}, not a dict", repr(item)[:1000])
                continue
            key = item.get(KEY_FIELD)
            fields = {name: value for name, value in item.items() if name != KEY_FIELD}
            yield Record(fields, where, key=None if key is None else str(key))


@dataclass(frozen=True)
class SourceKind:
    """A kind of source: the class that reads it (`module:Class`, imported when used) and the file
    suffixes it is chosen by. The class's `open(paths, columns)` makes its sources from the paths."""

    target: str
    suffixes: tuple[str, ...] = ()

    def open(self, paths: list[Path], columns: list[str] | None) -> list[Source]:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(f"prep.write.sources.{module}"), name).open(paths, columns)


# kind -> how to read it. Source kinds register here, one line each; folders are chosen by being folders.
SOURCE_KINDS: dict[str, SourceKind] = {
    "jsonl": SourceKind("jsonl:JsonlSource", (".jsonl", ".ndjson")),
    "csv": SourceKind("csv:CsvSource", (".csv", ".tsv")),
    "parquet": SourceKind("parquet:ParquetSource", (".parquet", ".pq")),
    "folder": SourceKind("folder:FolderSource"),
    "parallel": SourceKind("parallel_text:ParallelTextSource"),
}
KINDS = tuple(SOURCE_KINDS)


class FileSource:
    """What the sources of one file or folder each share: the path, its name in messages, and an `open`
    that makes one source per path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        self.paths = [path]

    @classmethod
    def open(cls, paths: list[Path], columns: list[str] | None = None) -> list[Source]:
        return [cls(path) for path in paths]


def detect_kind(path: Path) -> str:
    """The source kind of a path: a folder, or by its suffix."""
    if path.is_dir():
        return "folder"
    suffix = path.suffix.lower()
    for kind, entry in SOURCE_KINDS.items():
        if suffix in entry.suffixes:
            return kind
    known = ", ".join(suffix for entry in SOURCE_KINDS.values() for suffix in entry.suffixes)
    raise PrepError(
        f"Cannot tell what kind of source {path} is from its suffix {path.suffix!r}. Known suffixes:"
        f" {known}, or a folder; or name the kind with --format {'|'.join(KINDS)}."
    )


def open_sources(
    paths: list[Path], kind: str | None = None, columns: list[str] | None = None
) -> list[Source]:
    """Sources for the paths given on the command line: all of them of `kind`, or each of the kind its
    suffix says. `columns` limits what a columnar source reads (None: everything)."""
    for path in paths:
        if not path.exists():
            raise PrepError(f"{path} does not exist.")
    if kind is not None:
        if kind not in SOURCE_KINDS:
            raise PrepError(f"Unknown source kind {kind!r}; choose one of {', '.join(KINDS)}.")
        return SOURCE_KINDS[kind].open(list(paths), columns)
    return [source for path in paths for source in SOURCE_KINDS[detect_kind(path)].open([path], columns)]
