"""Fuzzing `write`'s sources: whatever bytes a JSONL, CSV or Parquet file holds, write either makes a
dataset energon can index or stops with the project's own error naming the file (and the line or row),
never another exception, and leaves no half-written output behind."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.errors import PrepError
from prep.write import write_dataset
from prep.write.sources import open_sources

SETTINGS = settings(
    max_examples=int(os.environ.get("SHARDPREP_FUZZ_EXAMPLES", "150")) // 2,
    deadline=5000,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ROWS = [
    {"text": "hello", "n": 1},
    {"text": "ünïcode", "n": 2.5},
    {"text": "", "n": None},
    {"text": "x" * 300},
]


def mutate(data: bytes, draw: st.DrawFn) -> bytes:
    data = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "nul", "bad-utf8", "insert", "crlf"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "cut":
            del data[at:]
        elif kind == "nul":
            data[at:at] = b"\0"
        elif kind == "bad-utf8":
            data[at:at] = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]))
        elif kind == "insert":
            data[at:at] = draw(st.binary(max_size=20))
        else:
            data[at:at] = b"\r\n"
    return bytes(data)


@st.composite
def jsonl_bytes(draw: st.DrawFn) -> bytes:
    return mutate("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in ROWS).encode(), draw)


@st.composite
def csv_bytes(draw: st.DrawFn) -> bytes:
    return mutate(b'text,n\nhello,1\n"quoted, with comma",2\n"multi\nline",3\n,\n', draw)


def check_write(tmp_path: Path, name: str, data: bytes) -> None:
    folder = tmp_path / os.urandom(6).hex()
    folder.mkdir()
    source = folder / name
    source.write_bytes(data)
    out = folder / "out"
    try:
        summary = write_dataset(open_sources([source]), out)
    except PrepError as error:
        assert name in str(error), str(error)
        assert not out.exists(), "a failed write left its output folder"
        return
    assert (out / ".nv-meta" / "index.sqlite").is_file()
    assert summary.samples >= 0


@SETTINGS
@given(data=jsonl_bytes())
def test_any_jsonl_bytes_write_a_dataset_or_stop_naming_the_file(tmp_path: Path, data: bytes) -> None:
    check_write(tmp_path, "rows.jsonl", data)


@SETTINGS
@given(data=csv_bytes())
def test_any_csv_bytes_write_a_dataset_or_stop_naming_the_file(tmp_path: Path, data: bytes) -> None:
    check_write(tmp_path, "rows.csv", data)


@SETTINGS
@given(cut=st.floats(0, 1), flip=st.integers(0, 10_000), byte=st.integers(1, 255))
def test_a_damaged_parquet_file_writes_or_stops_naming_the_file(tmp_path: Path, cut, flip, byte) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    out = io.BytesIO()
    parquet.write_table(pyarrow.Table.from_pylist(ROWS), out)
    data = bytearray(out.getvalue())
    data[flip % len(data)] ^= byte
    check_write(tmp_path, "rows.parquet", bytes(data[: max(1, int(cut * len(data)))]))


def test_a_100_mb_line_is_written_in_bounded_time_or_refused_clearly(tmp_path: Path) -> None:
    line = json.dumps({"text": "y" * 100_000_000}) + "\n"
    (tmp_path / "big.jsonl").write_text('{"text": "small"}\n' + line)
    summary = write_dataset(open_sources([tmp_path / "big.jsonl"]), tmp_path / "out")
    assert summary.samples == 2
