"""The index's sqlite tables read whole, as numpy columns, for verify.

Verify compares every row of `index.sqlite` with the tars, so it reads whole tables. Fetching them as
Python tuples costs more than all the checks together (a few microseconds per row); instead sqlite
joins each column of a range of rows into one `group_concat` string, numpy parses the integers, and
text stays one UTF-8 buffer with start and length arrays (`TextColumn`), decoded only for messages.
Rows come in storage (rowid) order; the caller sorts them.
"""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from prep.errors import PrepError

#: Rows per query: bounds each `group_concat` string well below sqlite's 1 GB string limit.
CHUNK_ROWS = 1 << 20
#: Separates the text values in one `group_concat` string: tar member names cannot contain NUL.
TEXT_SEPARATOR = "\0"


@dataclass(frozen=True)
class TextColumn:
    """Strings stored as one UTF-8 buffer: value `i` is `buffer[starts[i] : starts[i] + lengths[i]]`."""

    buffer: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def from_joined(cls, joined: str, count: int) -> TextColumn:
        """`count` values joined by TEXT_SEPARATOR into one string."""
        buffer = np.frombuffer(joined.encode(), dtype=np.uint8)
        if count == 0:
            return cls(buffer, np.zeros(0, np.int64), np.zeros(0, np.int64))
        separators = np.flatnonzero(buffer == 0)
        starts = np.concatenate([[0], separators + 1])
        ends = np.concatenate([separators, [len(buffer)]])
        if len(starts) != count:
            raise PrepError(
                f"a text column holds {len(starts)} values for {count} rows (a value contains NUL)"
            )
        return cls(buffer, starts, ends - starts)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, row: int) -> str:
        start = int(self.starts[row])
        return self.buffer[start : start + int(self.lengths[row])].tobytes().decode()

    def __iter__(self) -> Iterator[str]:
        return (self[row] for row in range(len(self)))

    def take(self, rows: np.ndarray | slice) -> TextColumn:
        """The values at `rows` (indexes or a slice), sharing this column's buffer."""
        return TextColumn(self.buffer, self.starts[rows], self.lengths[rows])


def segment_gather(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`buffer[starts[i] : starts[i] + lengths[i]]` for every i, concatenated, without a Python loop."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return buffer[np.arange(total) + np.repeat(starts - (ends - lengths), lengths)]


def member_name_fields(keys: TextColumn, parts: TextColumn, width: int = 100) -> np.ndarray:
    """The ustar name field of each member `KEY.PART` (row i joins keys[i] and parts[i]), as bytes.

    One row of `width` bytes per member: the UTF-8 name, NUL-padded, cut at `width` bytes — what the
    header of a member with that name holds when the name fits (longer names go in extra headers).
    """
    rows = len(keys)
    fields = np.zeros((rows, width), dtype=np.uint8)
    if rows == 0:
        return fields
    columns = np.arange(width)
    key_bytes = np.minimum(keys.lengths, width)
    dot_at = keys.lengths
    part_bytes = np.clip(width - 1 - dot_at, 0, parts.lengths)
    fields[columns < key_bytes[:, None]] = segment_gather(keys.buffer, keys.starts, key_bytes)
    with_dot = np.flatnonzero(dot_at < width)
    fields[with_dot, dot_at[with_dot]] = ord(".")
    after_dot = (columns > dot_at[:, None]) & (columns <= (dot_at + part_bytes)[:, None])
    fields[after_dot] = segment_gather(parts.buffer, parts.starts, part_bytes)
    return fields


def _parse_integers(joined: str | None, count: int, column: str) -> np.ndarray:
    if count == 0:
        return np.zeros(0, np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns, and stops, at text that is not an integer
        try:
            values = np.fromstring(joined or "", dtype=np.int64, sep=",")
        except (DeprecationWarning, ValueError):
            values = None
    if values is None or len(values) != count:
        raise PrepError(f"column {column} holds values that are not integers")
    return values


def read_columns(
    db: sqlite3.Connection, table: str, integers: dict[str, str], text: str
) -> tuple[dict[str, np.ndarray], TextColumn]:
    """Every row of `table`: integer columns as int64 arrays (NULL reads as 0), and the `text` column.

    `integers` maps the name to give each array to its sqlite column.

    Raises PrepError, or sqlite3.Error, when a column holds something else than its type.
    """
    names = [*integers.values(), text]
    aggregates = ", ".join(
        [f"group_concat(ifnull({name}, 0))" for name in integers.values()]
        + [f"group_concat(ifnull({text}, ''), char(0))"]
    )
    chunks = []
    try:  # rowid order is storage order, the cheapest to scan; chunks keep each string small
        query = (
            f"SELECT count(*), max(row), {aggregates} FROM (SELECT rowid AS row, {', '.join(names)}"
            f" FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT {CHUNK_ROWS})"
        )
        last = None
        while not chunks or chunks[-1][0] == CHUNK_ROWS:
            count, last, *values = db.execute(query, (-(1 << 63) if last is None else last,)).fetchone()
            chunks.append((count, *values))
    except sqlite3.OperationalError:  # a table without rowid: one query for all of it
        chunks = [db.execute(f"SELECT count(*), {aggregates} FROM {table}").fetchone()]
    chunks = [chunk for chunk in chunks if chunk[0]]
    columns = {
        name: np.concatenate(
            [np.zeros(0, np.int64)] + [_parse_integers(chunk[1 + i], chunk[0], column) for chunk in chunks]
        )
        for i, (name, column) in enumerate(integers.items())
    }
    joined = TEXT_SEPARATOR.join(chunk[-1] for chunk in chunks)
    return columns, TextColumn.from_joined(joined, sum(chunk[0] for chunk in chunks))
