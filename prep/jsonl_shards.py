"""Write a plain JSONL file's shards on every core: each worker writes whole shards from a byte range.

    >>> plan = plan_shards(Path("rows.jsonl"), maxcount=10_000, maxsize=3e9)       # doctest: +SKIP

The plain case (each line becomes one sample of one `json` part under a generated key) needs no line's
contents to place it: a sample's tar size follows from the line's length, so one quick pass over the
lengths cuts the file into exactly the shards the single-process writer would make, each with its first
line number and first generated key. Workers then parse, check and write their shards independently;
the results are the same bytes, and a bad line is reported as `file:line` in file order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prep.dataset_build import write_rows_file
from prep.shard_index import tar_index_bytes
from prep.shard_writer import BLOCK, MAX_OCTAL_SIZE, HeaderMaker, ShardFile
from prep.source_jsonl import parse_lines
from prep.sources import Reject

#: The part each JSONL line is written as.
PART = "json"


@dataclass
class ShardPlan:
    """One shard's share of the input: the bytes `[start, end)`, beginning at line `first_line`."""

    start: int
    end: int
    first_line: int
    first_row: int
    count: int = 0
    nbytes: int = 0


def plan_shards(path: Path, maxcount: int, maxsize: float) -> list[ShardPlan] | None:
    """The shards the single-process writer would cut `path` into, or None when a line is too long to plan.

    Rolls over as `ShardWriter` does: before a sample when the shard holds `maxcount` samples or the
    sample would take it past `maxsize` (a shard always takes its first sample). Lines that will turn out
    invalid are counted as samples: with on_error=stop the first of them ends the run anyway."""
    plans: list[ShardPlan] = []
    current: ShardPlan | None = None
    pos = 0
    rows = 0
    with open(path, "rb", buffering=1 << 20) as file:
        for number, line in enumerate(file, 1):
            length = len(line)
            content = line.rstrip(b"\r\n")
            if content.strip():
                size = len(content)
                if size > MAX_OCTAL_SIZE:
                    return None  # needs a PAX header: not worth planning
                sample = BLOCK + size + (-size % BLOCK)
                if current is None or current.count >= maxcount or current.nbytes + sample + 2 * BLOCK > maxsize:
                    if current is not None:
                        current.end = pos
                    current = ShardPlan(pos, pos, number, rows)
                    plans.append(current)
                current.count += 1
                current.nbytes += sample
                rows += 1
            pos += length
    if current is not None:
        current.end = pos
    return plans


@dataclass
class ShardJob:
    """What a worker needs to write one planned shard and its index files."""

    source: Path
    name: str
    plan: ShardPlan
    shard: str
    path: Path
    tar_index_path: Path
    rows_path: Path
    headers: HeaderMaker


@dataclass
class ShardDone:
    """A worker's answer: the shard's sample count and tar size, or the first bad line in it."""

    count: int
    nbytes: int
    reject: Reject | None = None


def _lines(file, end: int):  # noqa: ANN001, ANN202 (a binary file; yields its lines up to `end`)
    pos = file.tell()
    for line in file:
        yield line
        pos += len(line)
        if pos >= end:
            return


def write_planned_shard(job: ShardJob) -> ShardDone:
    """Write one planned shard with its `.tar.idx` and rows file; stops at the first bad line (no files left)."""
    plan = job.plan
    shard = ShardFile(job.path, job.shard, job.headers)
    try:
        row = plan.first_row
        with open(job.source, "rb", buffering=1 << 20) as file:
            file.seek(plan.start)
            for record in parse_lines(_lines(file, plan.end), job.name, plan.first_line, job.source.parent):
                if type(record) is Reject:
                    shard.abort()
                    return ShardDone(0, 0, record)
                shard.write(f"{row:09d}", [(PART, record.raw)])  # type: ignore[union-attr]
                row += 1
        rows = shard.close()
    except BaseException:
        shard.abort()
        raise
    with open(job.tar_index_path, "wb") as file:
        file.write(tar_index_bytes(rows.offsets()))
    write_rows_file(job.rows_path, rows)
    return ShardDone(rows.count, shard.pos + 2 * BLOCK)
