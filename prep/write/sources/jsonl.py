"""JSONL: one JSON object per line. The line itself is kept, so the default `json` part is its bytes.

Lines are parsed with orjson when it is installed and the result is certain to equal the standard
library's (no run of 19 digits, which orjson may turn into a float); anything orjson refuses or does
not map to an object goes through `json.loads`, which decides acceptance and the reason, so both agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from prep.write.sources import FileSource, Record, Reject, text_start

try:
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - orjson is optional: the standard library parses every line
    _fast_loads = None

#: Every digit as "0": a run of 19 zeros in a translated line marks a number that may be past 64 bits,
#: where orjson gives a float and `json` an int (a translate and a find cost far less than a regex).
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_NUMBER = b"0" * 19


class JsonlSource(FileSource):
    """Records from a JSONL file; a line that is not a JSON object is a Reject naming `file:line`."""

    default_parts = "json-line"

    def records(self) -> Iterator[Record | Reject]:
        with open(self.path, "rb", buffering=1 << 20) as file:
            file.seek(text_start(self.path))
            yield from parse_lines(file, self.name, 1, self.path.parent)


def parse_lines(
    lines: Iterable[bytes], name: str, first_number: int, base: Path | None
) -> Iterator[Record | Reject]:
    """Records from JSONL lines numbered from `first_number`, named `name:number`; blank lines are skipped."""
    loads = json.loads
    fast_loads = _fast_loads
    as_zero, long_number = _DIGITS_AS_ZERO, _LONG_NUMBER
    for number, line in enumerate(lines, first_number):
        line = line.rstrip(b"\r\n")
        if not line.strip():
            continue  # blank lines separate nothing in JSONL; they are not samples
        if fast_loads is not None and long_number not in line.translate(as_zero):
            try:
                fields = fast_loads(line)
            except ValueError:
                fields = None
            if type(fields) is dict:
                yield Record(fields, f"{name}:{number}", raw=line, base=base)
                continue
        try:
            fields = loads(line.decode("utf-8"))  # str: json.loads skips its encoding sniffing
        except ValueError as error:
            yield Reject(f"{name}:{number}", f"not valid JSON ({_reason(error)})", _text(line))
            continue
        if type(fields) is not dict:
            yield Reject(f"{name}:{number}", f"a JSON {type(fields).__name__}, not an object", _text(line))
            continue
        yield Record(fields, f"{name}:{number}", raw=line, base=base)


def _reason(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} at column {error.colno}"
    return str(error)


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace")
