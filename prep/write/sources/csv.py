"""CSV (and TSV by suffix): a header row names the fields; every row must have exactly that many.

`CsvSource.records` reads the whole file; `CsvSource.rows` reads from any reader that stands at a record
boundary, which is how `prep.write.blocks` reads one block of a file with the same code. Both read with
`csv_reader`, whose settings are stated there once.

A TSV file is read with CSV's quoting too (tab-separated, `"` quotes a field, `""` is a quote in it), as
pandas and Python's `csv` module write it: a field that starts with `"` is quoted. A quote left open or
text after a closing quote is a reject naming `file:line`, never rows silently joined into one field.
"""

from __future__ import annotations

import codecs
import csv
import io
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prep.errors import PrepError
from prep.write.sources import FileSource, Record, Reject


def first_bad_utf8(path: Path, chunk: int = 1 << 20) -> tuple[int, str]:
    """The file offset of the first byte of `path` that is not UTF-8, and why (0 and "" if none is).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile(suffix=".csv") as file:
    ...     _ = file.write("héllo".encode() + bytes([255])); file.flush()
    ...     first_bad_utf8(Path(file.name), chunk=2)
    (6, 'invalid start byte')
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as file:
        while True:
            data = file.read(chunk)
            try:
                decoder.decode(data, final=not data)
            except UnicodeDecodeError as error:  # `error.object` is what the decoder held, then `data`
                return offset - (len(error.object) - len(data)) + error.start, error.reason
            if not data:
                return 0, ""
            offset += len(data)


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
        try:
            with open(self.path, newline="", encoding="utf-8-sig") as file:  # a byte order mark is not text
                reader = csv_reader(file, self.delimiter)
                header = next(reader, None)
                if header is None:
                    return
                check_header(header, self.name)
                yield from self.rows(reader, header, 0)
        except UnicodeDecodeError as error:  # its offset counts from the decoder's chunk, not the file
            offset, reason = first_bad_utf8(self.path)
            raise PrepError(
                f"{self.name}: not UTF-8 text ({reason or error.reason} at byte {offset})."
            ) from None

    def rows(self, reader: Any, header: list[str], lines_before: int) -> Iterator[Record | Reject]:
        """The records `reader` (a `csv.reader` at a record boundary, after `lines_before` lines of the
        file) gives, each a dict by `header`, named by its first line."""
        name, base = self.name, self.path.parent
        width = len(header)
        first_line = lines_before + reader.line_num + 1
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
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

    def _text(self, row: list[str]) -> str:
        out = io.StringIO()
        csv.writer(out, delimiter=self.delimiter, lineterminator="").writerow(row)
        return out.getvalue()
