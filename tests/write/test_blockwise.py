"""A write in blocks (`--resume` on this machine, `--engine ray` on a cluster): files cut into blocks
read alone give the records of a whole-file read, with the same names, even where a cut falls inside a
quoted CSV field; its progress counts the pieces of each stage and says how long the stage has to go."""

from __future__ import annotations

from pathlib import Path

import pytest

from prep.write import WriteProgress, open_sources, write_dataset
from prep.write.blocks import Block, block_records, count_block, counted_blocks, plan_blocks
from tests.write.test_engine_ray import csv_file, records, written


def whole_and_in_blocks(path: Path, block_bytes: int) -> tuple[list, list, int]:
    """(records of a whole-file read, records of its blocks, rounds of counting)."""
    rounds = []

    def count(blocks: list[Block]) -> list:
        rounds.append(len(blocks))
        return [count_block(block) for block in blocks]

    source = open_sources([path])
    blocks = counted_blocks(plan_blocks(source, block_bytes, 10)[0], count, block_bytes)
    assert len(blocks) > 5
    parts = [
        (record.where, getattr(record, "fields", None)) for b in blocks for record in block_records(b)[1]
    ]
    whole = [(record.where, getattr(record, "fields", None)) for record in source[0].records()]
    return whole, parts, len(rounds)


def test_csv_blocks_read_the_records_of_the_whole_file(tmp_path: Path) -> None:
    whole, parts, rounds = whole_and_in_blocks(csv_file(tmp_path / "in.csv", records(300)), 2000)
    assert parts == whole and len(whole) == 300 and rounds == 1


def test_a_stray_quote_that_misleads_the_cutter_costs_a_recount_not_a_wrong_record(tmp_path: Path) -> None:
    path = csv_file(tmp_path / "in.csv", records(300), stray_quote_at=40)
    whole, parts, rounds = whole_and_in_blocks(path, 2000)
    assert parts == whole and rounds == 2


def test_progress_counts_each_stage_and_gives_an_eta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prep.write import blockwise

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 3000)
    seen: list[WriteProgress] = []
    path = csv_file(tmp_path / "in.csv", records(300))
    write_dataset(open_sources([path]), tmp_path / "out", maxcount=30, resume=True, progress=seen.append)
    stages = [(state.stage, state.done, state.total) for state in seen if state.stage]
    encoding = [done for stage, done, _ in stages if stage == "encoding blocks"]
    shards = [(done, total) for stage, done, total in stages if stage == "writing shards"]
    assert len(encoding) > 5 and encoding == list(range(len(encoding)))
    assert shards == [(done, 10) for done in range(11)]
    assert all(state.eta is not None for state in seen if state.stage and 0 < state.done < state.total)
    write_dataset(open_sources([path]), tmp_path / "one", maxcount=30)
    assert written(tmp_path / "out") == written(tmp_path / "one")


def test_bad_utf8_in_a_later_block_is_named_by_its_byte_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prep.errors import PrepError
    from prep.write import blockwise

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 3000)
    path = csv_file(tmp_path / "in.csv", records(300))
    data = path.read_bytes()
    at = data.index(b"k250,")
    path.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    for resume in (True, False):  # in blocks and in one pass alike
        with pytest.raises(PrepError, match=rf"in.csv: not UTF-8 text \(invalid start byte at byte {at}\)"):
            write_dataset(open_sources([path]), tmp_path / f"out-{resume}", resume=resume)
        assert not (tmp_path / f"out-{resume}" / ".nv-meta").exists()


def test_bad_utf8_in_a_record_running_past_a_block_is_named_by_its_byte_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stray quote makes a cut fall inside a quoted field; the bad byte lies in the read past the
    block's end: the block is joined with the next, which names the byte, as one pass does."""
    from prep.errors import PrepError
    from prep.write import blockwise

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 64)
    data = (
        b'a,b\n1,x"y\n'
        + b"".join(b"%d,xx\n" % i for i in range(2, 14))
        + b'3,"p\nq\nr\ns\nt\nu\n\xff\nv\nw\n"\n4,ok\n'
        + b"".join(b"%d,zz\n" % i for i in range(5, 30))
    )
    path = tmp_path / "in.csv"
    path.write_bytes(data)
    at = data.index(b"\xff")
    messages = []
    for resume in (True, False):
        with pytest.raises(PrepError) as raised:
            write_dataset(open_sources([path]), tmp_path / f"out-{resume}", resume=resume)
        messages.append(str(raised.value))
    assert messages[0] == messages[1] and f"at byte {at})" in messages[0]


def test_a_lone_cr_near_the_end_of_a_last_line_splits_it_as_one_pass_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(b"a\n1\n2\nx\ry")  # no newline at the end, a lone CR one character before it
    write_dataset(open_sources([path]), tmp_path / "blocks", resume=True)
    write_dataset(open_sources([path]), tmp_path / "one")
    assert written(tmp_path / "blocks") == written(tmp_path / "one")


def test_a_bad_record_ends_the_block_workers_with_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error about a bad record holds the frames that hold the map of blocks: its workers must end
    when the write does, not when that error is let go of (they could write into a removed staging)."""
    import os

    from prep.write import BadInputError, blockwise
    from tests.support.leftovers import processes_where

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 2000)
    path = tmp_path / "in.jsonl"
    lines = [f'{{"text": "record {i} {"x" * 40}"}}\n' for i in range(3000)]
    lines[40] = "{not json\n"
    path.write_text("".join(lines))
    before = set(processes_where(1, os.getpid()))
    with pytest.raises(BadInputError, match="in.jsonl:41") as raised:
        write_dataset(open_sources([path]), tmp_path / "out", resume=True, num_workers=2)
    assert set(processes_where(1, os.getpid())) <= before, "block workers outlived the write"
    assert raised.traceback  # (the error, frames and all, is still held here)


def test_a_later_file_that_cannot_be_cut_is_named_after_the_bad_rows_before_it(tmp_path: Path) -> None:
    """A CSV header naming a column twice (or a file that is not Parquet) is found while the inputs are
    cut, before any record is read: it must still be named only after the records of the files before
    it, as one process reading the inputs in order names the first bad one."""
    from prep.errors import PrepError

    (tmp_path / "bad-row.csv").write_text("id,text\n1,a\n2,b,extra\n")
    (tmp_path / "fine.csv").write_text("id,text\n1,a\n")
    (tmp_path / "bad-header.csv").write_text("id,id\n1,a\n")
    for first, named in (
        ("bad-row.csv", "bad-row.csv:3: the row has 3 fields"),
        ("fine.csv", "bad-header.csv:1"),
    ):
        sources = [tmp_path / first, tmp_path / "bad-header.csv"]
        with pytest.raises(PrepError) as expected:
            write_dataset(open_sources(sources), tmp_path / "one", num_workers=1)
        with pytest.raises(PrepError) as raised:
            write_dataset(open_sources(sources), tmp_path / "blocks", resume=True, num_workers=1)
        assert str(raised.value) == str(expected.value) and named in str(raised.value)
