"""JSONL: one JSON object per line. The line itself is kept, so the default `json` part is its bytes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from prep.sources import Record, Reject


class JsonlSource:
    """Records from a JSONL file; a line that is not a JSON object is a Reject naming `file:line`."""

    default_parts = "json-line"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)

    def records(self) -> Iterator[Record | Reject]:
        name, base = self.name, self.path.parent
        loads = json.loads
        with open(self.path, "rb", buffering=1 << 20) as file:
            for number, line in enumerate(file, 1):
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue  # blank lines separate nothing in JSONL; they are not samples
                try:
                    fields = loads(line.decode("utf-8"))  # str: json.loads skips its encoding sniffing
                except ValueError as error:
                    yield Reject(f"{name}:{number}", f"not valid JSON ({_reason(error)})", _text(line))
                    continue
                if type(fields) is not dict:
                    yield Reject(
                        f"{name}:{number}", f"a JSON {type(fields).__name__}, not an object", _text(line)
                    )
                    continue
                yield Record(fields, f"{name}:{number}", raw=line, base=base)


def _reason(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg} at column {error.colno}"
    return str(error)


def _text(line: bytes) -> str:
    return line.decode("utf-8", "replace")
