"""CSV (and TSV by suffix): a header row names the fields; every row must have exactly that many.

`CsvSource.records` reads the whole file; `CsvSource.rows` reads from any reader that stands at a record
boundary, which is how `prep.write.blocks` reads one block of a file with the same code. Both read with
`csv_reader`, whose settings are stated there once. A block's lines come from `text_lines`, each decoded
alone; so do those of a whole-file read from the last record before a byte that is not UTF-8 (its
decoder works ahead of the reader), so that a bad row before the byte is named first, as in blocks.

A TSV file is read with CSV's quoting too (tab-separated, `"` quotes a field, `""` is a quote in it), as
pandas and Python's `csv` module write it: a field that starts with `"` is quoted. A quote left open or
text after a closing quote is a reject naming `file:line`, never rows silently joined into one field.
"""

from __future__ import annotations

import csv
import io
import re
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from prep.errors import PrepError
from prep.write.sources import FileSource, Record, Reject, text_start

#: A lone carriage return ends a line where a text file opened with newline="" ends it (as `records` reads).
_LONE_CR = re.compile(r"(?<=\r)(?!\n)")


def text_lines(file: Any, start: int, limit: int, name: str, at: list[int]) -> Iterator[str]:
    """The text lines of a UTF-8 file (opened "rb") from byte `start` to `limit`, split as a file opened
    with newline="" splits them (at \\n, \\r\\n and a lone \\r), each decoded alone; `at[0]` is the byte
    offset of what has been handed out so far. Bad UTF-8 is a PrepError naming its byte offset, once
    every line before it is out."""
    file.seek(start)
    at[0] = start
    for raw in file:
        if at[0] >= limit:
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise PrepError(
                f"{name}: not UTF-8 text ({error.reason} at byte {at[0] + error.start})."
            ) from None
        cr = text.find("\r")
        if cr < 0 or (cr == len(text) - 2 and text.endswith("\r\n")):  # no CR but the line end's
            at[0] += len(raw)
            yield text
            continue
        for piece in _LONE_CR.split(text):
            if piece:
                at[0] += len(piece.encode("utf-8"))
                yield piece


#: The longest field read (the csv module's default is 131,072 characters; a JSONL line may be 100 MB).
MAX_FIELD_CHARS = 2**31 - 1


def csv_reader(lines: Iterable[str], delimiter: str) -> Any:
    """A `csv.reader` over text lines, strict: a stray quote is a `csv.Error` (which `CsvSource.rows`
    rejects at its line), not a field that swallows the rows after it. Fields up to `MAX_FIELD_CHARS`
    (a setting of the process, made here so that block workers make it too)."""
    csv.field_size_limit(MAX_FIELD_CHARS)
    return csv.reader(lines, delimiter=delimiter, strict=True)


def check_header(header: list[str], name: str) -> None:
    """A PrepError naming the file if a header name is empty or used twice (a row is a dict by name:
    one of two same-named columns would silently be lost)."""
    numbers: dict[str, int] = {}
    for number, column in enumerate(header, 1):
        if not column:
            problem = f"column {number} has no name"
        elif column in numbers:
            problem = f"column {number} is named {column!r} like column {numbers[column]}"
        else:
            numbers[column] = number
            continue
        raise PrepError(f"{name}:1: the header's {problem}. Give every column its own name.")


class CsvSource(FileSource):
    """Records from a CSV file, values as strings; a row with the wrong field count is a Reject."""

    default_parts = "json-row"

    def __init__(self, path: Path, delimiter: str | None = None) -> None:
        super().__init__(path)
        self.delimiter = delimiter or ("\t" if path.suffix.lower() == ".tsv" else ",")

    def records(self) -> Iterator[Record | Reject]:
        with open(self.path, newline="", encoding="utf-8-sig") as file:  # a byte order mark is not text
            reader = csv_reader(file, self.delimiter)
            try:
                header = next(reader, None)
            except UnicodeDecodeError:  # decoded ahead of the reader: the bad byte may be past the header
                header, reader = None, None
            if header is not None:
                check_header(header, self.name)
                yield from self.rows(reader, header, 0)
        if reader is None:
            yield from self._rows_by_line(None, 0)

    def rows(self, reader: Any, header: list[str], lines_before: int) -> Iterator[Record | Reject]:
        """The records `reader` (a `csv.reader` at a record boundary, after `lines_before` lines of the
        file) gives, each a dict by `header`, named by its first line. Where the file's decoder meets a
        byte that is not UTF-8 (it decodes ahead of the reader), the rest is read by `_rows_by_line`."""
        name, base = self.name, self.path.parent
        width = len(header)
        first_line = lines_before + reader.line_num + 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except UnicodeDecodeError:
                break
            except csv.Error as error:
                yield Reject(f"{name}:{first_line}", f"unreadable CSV ({error})")
                first_line = lines_before + reader.line_num + 1
                continue
            where = f"{name}:{first_line}"
            first_line = lines_before + reader.line_num + 1
            if not row:
                continue
            if len(row) != width:
                yield Reject(where, f"the row has {len(row)} fields, the header has {width}", self._text(row))
                continue
            yield Record(dict(zip(header, row, strict=True)), where, base=base)
        yield from self._rows_by_line(header, first_line - 1)

    def _rows_by_line(self, header: list[str] | None, lines_before: int) -> Iterator[Record | Reject]:
        """The records after the file's first `lines_before` lines (its header first, if `header` is None),
        from lines each decoded alone, as a block is read: a whole-file read decodes ahead of its reader,
        and meets a byte that is not UTF-8 before the rows in front of it; here those come out first, then
        the PrepError naming the byte."""
        with open(self.path, "rb") as file:
            lines = text_lines(file, text_start(self.path), 1 << 62, self.name, [0])
            deque(islice(lines, lines_before), maxlen=0)
            reader = csv_reader(lines, self.delimiter)
            if header is None:
                header = next(reader, None)
                if header is None:
                    return
                check_header(header, self.name)
            yield from self.rows(reader, header, lines_before)

    def _text(self, row: list[str]) -> str:
        out = io.StringIO()
        csv.writer(out, delimiter=self.delimiter, lineterminator="").writerow(row)
        return out.getvalue()
