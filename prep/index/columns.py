"""Whole index tables as numpy columns: integers as int64 arrays, text as one UTF-8 buffer.

Verify and info read every row of `index.sqlite`. Fetching rows as Python tuples costs more than all
their work together (a few microseconds per row); instead sqlite joins each column of a range of rows
into one `group_concat` string (`IndexReader.columns` runs that SQL), numpy parses the integers here, and
text stays one UTF-8 buffer with start and length arrays (`TextColumn`), decoded only where needed.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from prep.errors import PrepError

#: Separates the text values in one `group_concat` string: tar member names cannot contain NUL.
TEXT_SEPARATOR = "\0"


@dataclass(frozen=True)
class TextColumn:
    """Strings stored as one UTF-8 buffer: value `i` is `buffer[starts[i] : starts[i] + lengths[i]]`.

    >>> column = TextColumn.from_joined("jpg\\0txt\\0jpg", 3)
    >>> list(column), column[1], column.codes()
    (['jpg', 'txt', 'jpg'], 'txt', (['jpg', 'txt'], array([0, 1, 0])))
    """

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

    def distinct(self) -> set[str]:
        """The distinct values, without a Python step per row when the values lie one after another in the
        buffer (the column as read, or a slice of it: a shard's rows)."""
        if not len(self):
            return set()
        ends = self.starts + self.lengths
        if (self.starts[1:] == ends[:-1] + 1).all():
            run = self.buffer[int(self.starts[0]) : int(ends[-1])]
            return set(run.tobytes().decode().split(TEXT_SEPARATOR))
        return set(self)

    def codes(self) -> tuple[list[str], np.ndarray]:
        """The distinct values in order of first appearance, and each row's position among them (for a
        column of few distinct values, such as part names)."""
        if not len(self):
            return [], np.zeros(0, np.int64)
        distinct: dict[str, int] = {}
        ends = self.starts + self.lengths
        whole = (
            self.starts[0] == 0 and ends[-1] == len(self.buffer) and (self.starts[1:] == ends[:-1] + 1).all()
        )
        if whole:  # the column as read: its buffer is its values, separated
            values = self.buffer.tobytes().decode().split(TEXT_SEPARATOR)
        else:  # a selection of rows (`take`)
            values = list(self)
        codes = np.fromiter(
            (distinct.setdefault(value, len(distinct)) for value in values), np.int64, len(values)
        )
        return list(distinct), codes


def segment_gather(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`buffer[starts[i] : starts[i] + lengths[i]]` for every i, concatenated, without a Python loop."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return buffer[np.arange(total) + np.repeat(starts - (ends - lengths), lengths)]


def parse_integers(joined: str | None, count: int, column: str) -> np.ndarray:
    """`count` integers joined by commas into one string; PrepError if they are not integers."""
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
