"""Input files cut into blocks that workers read on their own, each record where a single reader sees it.

    blocks, problem = plan_blocks(sources, block_bytes=32 << 20, block_rows=100_000)  # here: a quick pass
    blocks = counted_blocks(blocks, count_in_workers, 32 << 20)                         # numbers fixed
    for record in block_records(block): ...                                            # in workers
    if problem: raise problem                                        # after the records before it

A block is a byte range of a JSONL or CSV file starting at a line, or a range of rows of one Parquet row
group. Its records are read by the sources' own code (`JsonlSource`'s `parse_lines`, `CsvSource.rows`,
`ParquetSource.rows`), so values, types and `file:line` names are exactly those of a whole-file read.

What a block cannot know alone is how many records and lines come before it (the generated keys and the
line numbers follow from them), so every block is counted first, in parallel (`count_block`), and
`counted_blocks` adds up. A CSV record may span lines (a quoted newline), so CSV blocks are cut only at
a newline with an even number of quotes before it, which is a record boundary in well-formed CSV; the
count then proves it: read from a true boundary (the first block starts after the header), a block
whose last record ends exactly at its end hands the next block a true boundary. Where one does not (a
stray quote in an unquoted field flips the count), the block ends where its record does and the rest of
the file is cut again from there, so a cut in the wrong place costs time, never a wrong record.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prep.errors import PrepError
from prep.write.sources import Record, Reject, Source, text_start
from prep.write.sources.csv import CsvSource, check_header, csv_reader, text_lines
from prep.write.sources.jsonl import JsonlSource, parse_lines
from prep.write.sources.parquet import ParquetSource

#: Bytes read at a time when cutting a file.
CHUNK_BYTES = 1 << 20
#: How far a CSV block is read past its end to see its last record end: a record running further than
#: this past a cut is not at a record boundary anyway, and the block is joined with the next.
CSV_SLACK = 1 << 20


@dataclass(frozen=True)
class Block:
    """A part of one input file that a worker reads alone."""

    #: "jsonl", "csv" or "parquet".
    kind: str
    #: The file, absolute (a Ray worker does not run in this folder), and its name in messages.
    path: str
    name: str
    #: Bytes `[start, end)` of the file; for Parquet, rows `[start, end)` of row group `group`.
    start: int
    end: int
    group: int = -1
    #: Lines (JSONL, CSV) or rows (Parquet) of the file before the block: set by `settle_blocks`.
    lines_before: int = 0
    #: Records of all inputs before the block (the first generated key's number): set by `settle_blocks`.
    records_before: int = 0
    #: CSV: the header's fields and the delimiter. Parquet: the columns to read (None: all).
    header: tuple[str, ...] = ()
    delimiter: str = ","
    columns: tuple[str, ...] | None = None

    def describe(self) -> str:
        """The block in messages: the file and where in it."""
        if self.kind == "parquet":
            return f"{self.name} (row group {self.group}, rows {self.start}-{self.end})"
        return f"{self.name} (bytes {self.start}-{self.end})"


@dataclass(frozen=True)
class BlockCount:
    """A block's records and lines (rows); for CSV, whether its last record ends exactly at its end, and
    if not, where it does end (`stop`; None if it runs on past what was read)."""

    records: int
    lines: int
    synced: bool = True
    stop: int | None = None


def supported(source: Source) -> bool:
    """Whether blocks can be cut from this source (one JSONL, CSV or Parquet file)."""
    return type(source) in (JsonlSource, CsvSource, ParquetSource)


def plan_blocks(
    sources: list[Source], block_bytes: int, block_rows: int
) -> tuple[list[Block], PrepError | None]:
    """The blocks of every source, in input order: JSONL and CSV files cut near every `block_bytes`,
    Parquet row groups into at most `block_rows` rows each. A source that cannot be cut (a CSV header
    unreadable or naming a column twice, a file that is not Parquet) ends the plan: the blocks before it
    come with its PrepError, for the caller to raise once they are read, as one process reading the
    inputs in order meets it only after every record before it (and stops at the first bad one)."""
    blocks: list[Block] = []
    for source in sources:
        try:
            if isinstance(source, JsonlSource):
                path = os.path.abspath(source.path)
                cuts = _cuts(source.path, text_start(source.path), block_bytes, quoted=False)
                blocks += [Block("jsonl", path, source.name, start, end) for start, end in cuts]
            elif isinstance(source, CsvSource):
                blocks += _csv_blocks(source, block_bytes)
            elif isinstance(source, ParquetSource):
                blocks += _parquet_blocks(source, block_rows)
            else:
                raise TypeError(f"no blocks of a {type(source).__name__}")
        except PrepError as problem:
            return blocks, problem
    return blocks, None


def _cuts(path: Path, start: int, block_bytes: int, *, quoted: bool) -> list[tuple[int, int]]:
    """`[start, end)` ranges covering `path` from `start`, each ending just after a newline near the next
    multiple of `block_bytes` (with `quoted`: a newline with an even number of `"` before it)."""
    import numpy as np

    size = path.stat().st_size
    ranges: list[tuple[int, int]] = []
    begin, offset, odd = start, start, False
    with open(path, "rb", buffering=0) as file:
        file.seek(start)
        while chunk := file.read(CHUNK_BYTES):
            if offset + len(chunk) > begin + block_bytes:
                data = np.frombuffer(chunk, dtype=np.uint8)
                ends = np.flatnonzero(data == ord("\n")) + 1  # cut points within the chunk
                if quoted:
                    quotes = np.cumsum(data == ord('"'))
                    even = (quotes[ends - 1] + odd) % 2 == 0
                    ends = ends[even]
                positions = (ends + offset).tolist()
                while True:  # each block ends at the first cut point at or past its size
                    at = int(np.searchsorted(positions, begin + block_bytes, side="left"))
                    if at >= len(positions) or positions[at] >= size:
                        break
                    ranges.append((begin, positions[at]))
                    begin = positions[at]
            if quoted:
                odd = bool((chunk.count(b'"') + odd) % 2)
            offset += len(chunk)
    if begin < size or not ranges:
        ranges.append((begin, size))
    return ranges


def _csv_blocks(source: CsvSource, block_bytes: int) -> list[Block]:
    """The header (read here), then blocks of the rest of the file, cut at even-quote newlines."""
    path = os.path.abspath(source.path)
    at = [0]
    with open(source.path, "rb") as file:
        reader = csv_reader(
            text_lines(file, text_start(source.path), 1 << 62, source.name, at), source.delimiter
        )
        header = next(reader, None)
        header_lines = reader.line_num
    if header is None:
        return []
    check_header(header, source.name)
    cuts = _cuts(source.path, at[0], block_bytes, quoted=True)
    return [
        Block(
            "csv", path, source.name, start, end, lines_before=header_lines, header=tuple(header),
            delimiter=source.delimiter,
        )
        for start, end in cuts
        if end > start
    ]  # fmt: skip


def _parquet_blocks(source: ParquetSource, block_rows: int) -> list[Block]:
    parquet = source.open_file()
    path = os.path.abspath(source.path)
    columns = tuple(source.columns) if source.columns is not None else None
    blocks = []
    for group in range(parquet.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        for start in range(0, rows, block_rows):
            end = min(rows, start + block_rows)
            blocks.append(Block("parquet", path, source.name, start, end, group=group, columns=columns))
    return blocks


def _source(block: Block) -> Any:
    """The block's source, named as the user gave it (its path here is absolute, for other machines)."""
    if block.kind == "jsonl":
        source: Any = JsonlSource(Path(block.path))
    elif block.kind == "csv":
        source = CsvSource(Path(block.path), block.delimiter)
    else:
        source = ParquetSource(Path(block.path), list(block.columns) if block.columns is not None else None)
    source.name = block.name
    return source


def _lines_until(file: Any, end: int) -> Iterator[bytes]:
    """A binary file's lines from where it stands up to byte `end`."""
    position = file.tell()
    for line in file:
        if position >= end:
            return
        yield line
        position += len(line)


def block_records(block: Block) -> tuple[Source, Iterator[Record | Reject]]:
    """The block's source (for its default parts) and its records, named as a whole-file read names them."""
    source = _source(block)
    return source, _records(block, source)


def _records(block: Block, source: Any) -> Iterator[Record | Reject]:
    if block.kind == "parquet":
        parquet = source.open_file()
        # rows of the file before this block: earlier row groups' rows plus this group's first ones
        before = sum(parquet.metadata.row_group(group).num_rows for group in range(block.group)) + block.start
        yield from source.rows(parquet, block.group, block.start, block.end, before)
        return
    with open(block.path, "rb", buffering=1 << 20) as file:
        if block.kind == "jsonl":
            file.seek(block.start)
            base = Path(block.path).parent
            yield from parse_lines(_lines_until(file, block.end), block.name, block.lines_before + 1, base)
            return
        at = [0]
        reader = csv_reader(text_lines(file, block.start, block.end, block.name, at), block.delimiter)
        yield from source.rows(reader, list(block.header), block.lines_before)


def count_block(block: Block) -> BlockCount:
    """How many records and lines the block holds (a worker's task); for CSV, whether its last record
    ends exactly at its end (else it was not cut at a record boundary, or its start was not one)."""
    if block.kind == "parquet":
        return BlockCount(block.end - block.start, block.end - block.start)
    with open(block.path, "rb", buffering=1 << 20) as file:
        if block.kind == "jsonl":
            file.seek(block.start)
            lines = records = 0
            for line in _lines_until(file, block.end):
                lines += 1
                records += bool(line.strip())
            return BlockCount(records, lines)
        at = [0]
        limit = min(block.end + CSV_SLACK, os.path.getsize(block.path))
        reader = csv_reader(text_lines(file, block.start, limit, block.name, at), block.delimiter)
        records = 0  # as `CsvSource.rows` counts them: rows but blank ones, and unreadable ones
        while at[0] < block.end:
            try:
                records += bool(next(reader))
            except StopIteration:
                break
            except csv.Error:
                records += 1
            except PrepError:  # not UTF-8
                if at[0] < block.end:  # in the block: reading it again says so, after any earlier bad record
                    return BlockCount(records, reader.line_num)
                # In a record running past the block's end: the block is joined with the next, whose
                # reading then names the byte.
                return BlockCount(records, reader.line_num, synced=False, stop=None)
        ended = at[0] < limit or limit == os.path.getsize(block.path)
        return BlockCount(records, reader.line_num, at[0] == block.end, at[0] if ended else None)


def counted_blocks(
    blocks: list[Block], count: Callable[[list[Block]], list[BlockCount]], block_bytes: int
) -> list[Block]:
    """The blocks, counted by `count` (in workers), with the lines and records before each filled in.

    Blocks of a file are checked in order, each starting where the previous one ended: a CSV block
    whose last record runs past its end ends where that record does (a record boundary, as the block
    started at one), and the rest of its file is cut again from there and counted again; if the record
    runs on past what was read, the block is joined with the next instead."""
    blocks = [block for block in blocks if block.end > block.start]
    counts = count(blocks)
    index = 0
    while index < len(blocks):
        block, tally = blocks[index], counts[index]
        same_file = index + 1
        while same_file < len(blocks) and blocks[same_file].path == block.path:
            same_file += 1
        if tally.synced or same_file == index + 1:
            index += 1
            continue
        if tally.stop is None:  # no record boundary seen: join with the next block
            blocks[index : index + 2] = [replace(block, end=blocks[index + 1].end)]
            counts[index : index + 2] = count(blocks[index : index + 1])
            continue
        rest = [
            replace(block, start=start, end=end)
            for start, end in _cuts(Path(block.path), tally.stop, block_bytes, quoted=True)
            if end > start and end <= blocks[same_file - 1].end
        ]
        blocks[index:same_file] = [replace(block, end=tally.stop), *rest]
        counts[index:same_file] = [replace(tally, synced=True), *count(rest)]
        index += 1
    return _settled(blocks, counts)


def _settled(blocks: list[Block], counts: list[BlockCount]) -> list[Block]:
    """The blocks with the lines of their file and the records of all inputs before each."""
    settled: list[Block] = []
    records = 0
    for index, (block, tally) in enumerate(zip(blocks, counts, strict=True)):
        previous = settled[-1] if settled else None
        if previous is not None and previous.path == block.path and previous.end == block.start:
            block = replace(block, lines_before=previous.lines_before + counts[index - 1].lines)
        settled.append(replace(block, records_before=records))
        records += tally.records
    return settled
