"""Write a plain JSONL file's shards on every core: each worker writes whole shards from a byte range.

    >>> plan = plan_shards(Path("rows.jsonl"), ShardLimits(maxcount=10_000))       # doctest: +SKIP

The plain case (each line becomes one sample of one `json` part under a generated key) needs no line's
contents to place it: a sample's tar size follows from the line's length, so one quick pass over the
lengths cuts the file into exactly the shards the single-process writer would make (the same
`ShardLimits.fits`), each with its first line number and first generated key. Workers then parse, check
and write their shards independently; the results are the same bytes, and a bad line is reported as
`file:line` in file order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prep.index.rows import write_rows_file, write_tar_index
from prep.tar.fields import MAX_OCTAL_SIZE, member_bytes
from prep.tar.write import HeaderMaker
from prep.write.keys import GENERATED_KEY
from prep.write.shards import ShardFile, ShardLimits
from prep.write.sources import Reject
from prep.write.sources.jsonl import parse_lines

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


def plan_shards(path: Path, limits: ShardLimits) -> list[ShardPlan] | None:
    """The shards the single-process writer would cut `path` into, or None when a line is too long to plan.

    Lines that will turn out invalid are counted as samples: with on_error=stop the first of them ends
    the run anyway."""
    plans: list[ShardPlan] = []
    current: ShardPlan | None = None
    pos = 0
    rows = 0
    fits = limits.fits
    with open(path, "rb", buffering=1 << 20) as file:
        for number, line in enumerate(file, 1):
            length = len(line)
            content = line.rstrip(b"\r\n")
            if content.strip():
                size = len(content)
                if size > MAX_OCTAL_SIZE:
                    return None  # needs a PAX header: not worth planning
                sample = member_bytes(size)
                if current is None or not fits(current.count + 1, current.nbytes + sample):
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
    with ShardFile(job.path, job.shard, job.headers) as shard:
        row = plan.first_row
        with open(job.source, "rb", buffering=1 << 20) as file:
            file.seek(plan.start)
            for record in parse_lines(_lines(file, plan.end), job.name, plan.first_line, job.source.parent):
                if type(record) is Reject:
                    shard.abort()
                    return ShardDone(0, 0, record)
                shard.write(GENERATED_KEY % row, [(PART, record.raw)])  # type: ignore[union-attr]
                row += 1
        rows = shard.close()
    write_tar_index(job.tar_index_path, rows)
    write_rows_file(job.rows_path, rows)
    return ShardDone(rows.count, shard.nbytes)
