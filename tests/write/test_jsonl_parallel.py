"""Plain JSONL is written by worker processes, shard by shard: the result is what one process writes."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.write import BadInputError, write_dataset
from prep.write.jsonl_parallel import plan_shards
from prep.write.shards import ShardLimits
from prep.write.sources.jsonl import JsonlSource


def rows_file(path: Path, count: int) -> list[bytes]:
    lines = [json.dumps({"n": number, "text": "word " * (number % 7)}).encode() for number in range(count)]
    path.write_bytes(
        b"\n".join(lines[:5]) + b"\n\n\r\n" + b"\n".join(lines[5:]) + b"\n"
    )  # blank lines are skipped
    return lines


def written(out: Path) -> dict[str, bytes]:
    """Every shard, `.tar.idx` and index row of a dataset (the random index uuid left out)."""
    files = {path.name: path.read_bytes() for path in out.glob("*.tar*")}
    with sqlite3.connect(out / ".nv-meta" / "index.sqlite") as db:
        for table in ("samples", "sample_parts"):
            files[table] = repr(db.execute(f"SELECT * FROM {table} ORDER BY 1, 3").fetchall()).encode()
    files["info"] = (out / ".nv-meta" / ".info.json").read_bytes()
    return files


@pytest.mark.parametrize("limits", [{"maxcount": 4}, {"maxcount": 100, "maxsize": 5000}])
def test_jsonl_in_workers_writes_the_shards_one_process_writes(tmp_path: Path, limits: dict) -> None:
    lines = rows_file(tmp_path / "rows.jsonl", 23)
    parallel = write_dataset(JsonlSource(tmp_path / "rows.jsonl"), tmp_path / "parallel", **limits)
    serial = write_dataset([{"json": line} for line in lines], tmp_path / "serial", **limits)
    one_worker = write_dataset(
        JsonlSource(tmp_path / "rows.jsonl"), tmp_path / "one", num_workers=1, **limits
    )
    assert parallel.shards > 2 and parallel.samples == 23
    assert (
        (parallel.shards, parallel.bytes)
        == (serial.shards, serial.bytes)
        == (one_worker.shards, one_worker.bytes)
    )
    assert written(tmp_path / "parallel") == written(tmp_path / "serial") == written(tmp_path / "one")


def test_plan_cuts_shards_at_their_first_line_and_key(tmp_path: Path) -> None:
    rows_file(tmp_path / "rows.jsonl", 10)  # lines 6 and 7 are blank
    plans = plan_shards(tmp_path / "rows.jsonl", ShardLimits(maxcount=4))
    assert [(plan.first_line, plan.first_row, plan.count) for plan in plans] == [
        (1, 0, 4),
        (5, 4, 4),
        (11, 8, 2),
    ]
    assert plans[0].start == 0 and plans[-1].end == (tmp_path / "rows.jsonl").stat().st_size
    assert all(before.end == after.start for before, after in zip(plans[:-1], plans[1:], strict=True))


def test_bad_line_in_a_later_shard_stops_with_its_file_line_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    good = [json.dumps({"n": number}) for number in range(12)]
    source.write_text("\n".join(good[:9] + ['{"n": cut'] + good[9:]) + "\n")
    with pytest.raises(BadInputError, match=f"{source}:10: not valid JSON"):
        write_dataset(JsonlSource(source), tmp_path / "out", maxcount=3)
    assert not (tmp_path / "out").exists()


def test_numbers_past_64_bits_read_as_the_standard_json_module_reads_them(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text('{"id": 123456789012345678901234567890}\n{"id": 7}\n')
    write_dataset(JsonlSource(source), tmp_path / "out", key_column="id")
    with sqlite3.connect(tmp_path / "out" / ".nv-meta" / "index.sqlite") as db:
        keys = [key for (key,) in db.execute("SELECT sample_key FROM samples ORDER BY sample_index")]
    assert keys == ["123456789012345678901234567890", "7"]


def reference_plans(data: bytes, limits: ShardLimits) -> list[tuple[int, int, int, int, int, int]]:
    """What the single-process writer does, line by line: (start, end, first line, first row, count, bytes)."""
    from prep.tar.fields import member_bytes

    plans: list[list[int]] = []
    pos = rows = 0
    *ended, last = data.split(b"\n")  # lines end at newlines only, as a file is read line by line
    for number, line in enumerate([line + b"\n" for line in ended] + ([last] if last else []), 1):
        content = line.rstrip(b"\r\n")
        if content.strip():
            size = member_bytes(len(content))
            if not plans or not limits.fits(plans[-1][4] + 1, plans[-1][5] + size):
                if plans:
                    plans[-1][1] = pos
                plans.append([pos, pos, number, rows, 0, 0])
            plans[-1][4] += 1
            plans[-1][5] += size
            rows += 1
        pos += len(line)
    if plans:
        plans[-1][1] = len(data)
    return [tuple(plan) for plan in plans]


lines_of_any_shape = st.lists(
    st.tuples(
        st.sampled_from([b"", b" ", b"\t \x0b", b'{"a": 1}', b"  x  ", b"\r", b"y" * 700, b"z" * 1500]),
        st.sampled_from([b"\n", b"\r\n", b"\r\r\n"]),
    ),
    max_size=60,
)


@given(
    lines_of_any_shape,
    st.booleans(),
    st.integers(1, 5),
    st.sampled_from([2048, 4096, 9000, 3e9]),
    st.integers(1, 64),
)
@settings(max_examples=300, deadline=None)
def test_plan_cuts_where_the_writer_rolls_over_for_lines_of_any_shape(
    tmp_path_factory, lines, last_newline, maxcount, maxsize, chunk_bytes
) -> None:
    """Blank and whitespace-only lines, carriage returns, a last line without a newline, lines longer
    than the chunks the planner reads: each shard starts where the writer would start it."""
    data = b"".join(content + end for content, end in lines)
    if lines and not last_newline:
        data = data.rstrip(b"\r\n")
    path = tmp_path_factory.mktemp("plan") / "rows.jsonl"
    path.write_bytes(data)
    limits = ShardLimits(maxcount=maxcount, maxsize=maxsize)
    plans = plan_shards(path, limits, chunk_bytes=chunk_bytes)
    found = [(p.start, p.end, p.first_line, p.first_row, p.count, p.nbytes) for p in plans]
    assert found == reference_plans(data, limits)
