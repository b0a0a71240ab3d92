"""What every source yields: records (fields plus where they came from) and rejects (what was wrong, where).

A source is anything with `records()` yielding `Record` or `Reject` and a `default_parts` saying which
parts a record becomes when the user maps none:

- `"json-line"`: the record's raw line as a `json` part, byte for byte (JSONL);
- `"json-row"`: the whole row as a `json` part (CSV, Parquet);
- `"by-name"`: every field as the part of that name, e.g. `{"jpg": ..., "txt": ...}` (folders, dicts);
- a list of (field, part) pairs (parallel text).

`open_source` picks the source kind from a path; `DictSource` wraps any iterable of dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prep.errors import PrepError

#: A field of this name (webdataset's convention) holds the sample key.
KEY_FIELD = "__key__"


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

    def records(self) -> Iterator[Record | Reject]: ...


class DictSource:
    """Any iterable of dicts, webdataset style: `__key__` (optional) and parts named by extension.

    >>> [r.fields for r in DictSource([{"txt": "hi"}]).records()]
    [{'txt': 'hi'}]
    """

    default_parts = "by-name"

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


#: Source kinds by file suffix; folders are read as folders of files grouped by stem.
SUFFIX_KINDS = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
KINDS = ("jsonl", "csv", "parquet", "folder", "parallel")


def detect_kind(path: Path) -> str:
    """The source kind of a path: a folder, or by its suffix."""
    if path.is_dir():
        return "folder"
    kind = SUFFIX_KINDS.get(path.suffix.lower())
    if kind is None:
        raise PrepError(
            f"Cannot tell what kind of source {path} is from its suffix {path.suffix!r}. Known suffixes:"
            f" {', '.join(SUFFIX_KINDS)}, or a folder; or name the kind with --format {'|'.join(KINDS)}."
        )
    return kind


def open_sources(paths: list[Path], kind: str | None = None, columns: list[str] | None = None) -> list[Source]:
    """Sources for the paths given on the command line (`parallel`: SOURCE TARGET [ALIGNMENT] as one)."""
    for path in paths:
        if not path.exists():
            raise PrepError(f"{path} does not exist.")
    if kind == "parallel":
        from prep.source_parallel_text import ParallelTextSource

        if len(paths) not in (2, 3):
            raise PrepError(
                "--format parallel takes a source file, a target file and optionally a pharaoh alignment"
                f" file, line-aligned; got {len(paths)} paths."
            )
        return [ParallelTextSource(*paths)]
    sources: list[Source] = []
    for path in paths:
        chosen = kind or detect_kind(path)
        if chosen == "jsonl":
            from prep.source_jsonl import JsonlSource

            sources.append(JsonlSource(path))
        elif chosen == "csv":
            from prep.source_csv import CsvSource

            sources.append(CsvSource(path))
        elif chosen == "parquet":
            from prep.source_parquet import ParquetSource

            sources.append(ParquetSource(path, columns))
        elif chosen == "folder":
            from prep.source_folder import FolderSource

            sources.append(FolderSource(path))
        else:
            raise PrepError(f"Unknown source kind {chosen!r}; choose one of {', '.join(KINDS)}.")
    return sources
