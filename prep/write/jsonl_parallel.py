"""Write a plain JSONL file's shards on every core: each worker writes whole shards from a byte range.

    >>> import shutil, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "rows.jsonl").write_bytes(b'{"a": 1}\\n\\n{"a": 2}\\n{"a": 3}\\n')
    >>> [(plan.first_line, plan.first_row, plan.count) for plan in plan_shards(folder / "rows.jsonl", ShardLimits(2))]
    [(1, 0, 2), (4, 2, 1)]
    >>> shutil.rmtree(folder)

The plain case (each line becomes one sample of one `json` part under a generated key) needs no line's
contents to place it: a sample's tar size follows from the line's length, so one quick pass over the
lengths cuts the file into exactly the shards the single-process writer would make (the same
`ShardLimits.fits`), each with its first line number and first generated key. Workers then parse, check
and write their shards independently; the results are the same bytes, and a bad line is reported as
`file:line` in file order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prep.index.rows import write_rows_file, write_tar_index
from prep.tar.fields import MAX_OCTAL_SIZE, member_bytes
from prep.tar.write import HeaderMaker
from prep.write.keys import GENERATED_KEY
from prep.write.shards import ShardFile, ShardLimits
from prep.write.sources import Reject, text_start
from prep.write.sources.jsonl import parse_lines

if TYPE_CHECKING:
    import numpy as np

#: The part each JSONL line is written as.
PART = "json"
#: Bytes read at a time when planning (a line longer than this is read whole).
CHUNK_BYTES = 1 << 20
#: What `bytes.strip` removes: a line of nothing else is blank.
WHITESPACE = frozenset(b" \t\n\r\x0b\x0c")


@dataclass
class ShardPlan:
    """One shard's share of the input: the bytes `[start, end)`, beginning at line `first_line`."""

    start: int
    end: int
    first_line: int
    first_row: int
    count: int = 0
    nbytes: int = 0


def plan_shards(path: Path, limits: ShardLimits, chunk_bytes: int = CHUNK_BYTES) -> list[ShardPlan] | None:
    """The shards the single-process writer would cut `path` into, or None when a line is too long to plan.

    The file is read a chunk at a time and its lines measured with numpy; each shard then takes the most
    lines that `limits.fits`, found by bisection over their running tar bytes, so the rule is asked a few
    times per shard rather than once per line. Lines that will turn out invalid are counted as samples:
    with on_error=stop the first of them ends the run anyway."""
    import numpy as np

    plans: list[ShardPlan] = []
    current: ShardPlan | None = None
    rows = 0
    for starts, line_numbers, sizes in _nonblank_lines(path, chunk_bytes):
        if len(sizes) and int(sizes.max()) > MAX_OCTAL_SIZE:
            return None  # needs a PAX header: not worth planning
        taken = np.concatenate(([0], np.cumsum(member_bytes(sizes)))).tolist()  # bytes of the first n lines
        first, count = 0, len(sizes)
        while first < count:
            if current is None:  # a shard always takes its first sample
                current = ShardPlan(int(starts[first]), 0, int(line_numbers[first]), rows + first)
                plans.append(current)
            more = _most_that_fit(limits, current, taken, first, count)
            current.count += more
            current.nbytes += taken[first + more] - taken[first]
            first += more
            if first < count:  # the next line would not fit: it starts the next shard
                current.end = int(starts[first])
                current = None
        rows += count
    if current is not None:
        current.end = path.stat().st_size
    return plans


def _most_that_fit(limits: ShardLimits, plan: ShardPlan, taken: list[int], first: int, count: int) -> int:
    """How many of lines `first..count` the plan takes: the most that still fit (at least one in an
    empty shard). Fitting is monotone in the lines taken, so bisection finds the last one."""
    low, high = (1 if plan.count == 0 else 0), count - first  # `low` lines certainly go in
    while low < high:
        middle = (low + high + 1) // 2
        if limits.fits(plan.count + middle, plan.nbytes + taken[first + middle] - taken[first]):
            low = middle
        else:
            high = middle - 1
    return low


def _nonblank_lines(path: Path, chunk_bytes: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(start offset, 1-based line number, content size) of each line that is not blank, a chunk's
    lines at a time. A line's content is the line without its end (the newline, and carriage returns
    before it); a blank line holds nothing but whitespace, and the JSONL reader skips it."""
    import numpy as np

    whitespace = np.zeros(256, dtype=bool)
    whitespace[list(WHITESPACE)] = True
    line_end = np.zeros(256, dtype=bool)
    line_end[list(b"\r\n")] = True
    offset, lines = text_start(path), 0  # where the unread rest of the file starts, and the lines before it
    pending: list[bytes] = []  # the start of a line that has not ended yet
    with open(path, "rb", buffering=0) as file:
        file.seek(offset)
        while True:
            block = file.read(chunk_bytes)
            if block and b"\n" not in block:
                pending.append(block)  # a line longer than a chunk: read on to its end
                continue
            data = b"".join([*pending, block])
            pending = []
            buffer = np.frombuffer(data, dtype=np.uint8)
            ends = np.flatnonzero(buffer == ord("\n")) + 1
            if not block and len(buffer) > (ends[-1] if len(ends) else 0):
                ends = np.append(ends, len(buffer))  # the last line has no newline
            if len(ends):
                starts = np.concatenate(([0], ends[:-1]))
                content = ends - starts
                while True:  # strip the line ends: the newline, then any carriage returns before it
                    at_end = (content > 0) & line_end[buffer[np.maximum(starts + content - 1, 0)]]
                    if not at_end.any():
                        break
                    content -= at_end
                # a blank line starts with whitespace: only those few are looked at closely
                kept = np.ones(len(ends), dtype=bool)
                for line in np.flatnonzero(whitespace[buffer[starts]]).tolist():
                    start = int(starts[line])
                    kept[line] = bool(data[start : start + int(content[line])].strip())
                kept = np.flatnonzero(kept)
                yield starts[kept] + offset, lines + kept + 1, content[kept]
                offset, lines = offset + int(ends[-1]), lines + len(ends)
                pending = [data[int(ends[-1]) :]]
            if not block:
                return


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
