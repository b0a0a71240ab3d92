"""A write cut into blocks: each block's samples encoded by a worker, the shards cut here, assembled by workers.

    done = encode_block(EncodeJob(block, ...))          # a worker: the block's samples, per split a segment
    planner.add(number, done)                           # here, block after block, in input order
    for shard in planner.finish(): assemble_shard(...)  # a worker: the shard from its segments' bytes

A sample's bytes in a tar do not depend on where in the tar it is, so a worker can write the samples of
its block (key, split and parts stages as `prep.write.run` runs them) into one *segment* per split: tar
members without the end marker, with their index rows (`ShardRows`, offsets within the segment). What it
hands back is small: per split, each sample's tar bytes, which are what the shard writer rolls over by
(`sample_tar_bytes`). From those `ShardPlanner` cuts each split's samples into shards by
`ShardLimits.room_for`, the writer's own rule, in input order, so the shards are those one process cuts.
A shard is then a run of byte ranges of segments, copied into place with its rows moved by the range's
offset: the same bytes, `.tar.idx` and rows as one process writes.
"""

from __future__ import annotations

import bisect
import os
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import BinaryIO

from prep.index.checkpoint import file_key
from prep.index.rows import ShardRows, read_rows_file, write_rows_file, write_tar_index
from prep.tar.fields import END_OF_ARCHIVE
from prep.tar.write import HeaderMaker
from prep.write.blocks import Block, block_records
from prep.write.keys import Rejected, SampleKeys
from prep.write.options import WriteOptions
from prep.write.parts import media_files_read
from prep.write.shards import ShardFile, ShardLimits
from prep.write.sources import Record, Reject, Source
from prep.write.stages import stage_record

#: Bytes read at a time where a range cannot be copied within the kernel.
COPY_BYTES = 1 << 22


@dataclass
class EncodeJob:
    """A block to encode, and where its segments go (`folder/segment-NUMBER-SPLIT.tar`)."""

    block: Block
    number: int
    options: WriteOptions
    folder: str
    headers: HeaderMaker


@dataclass
class Segment:
    """A block's samples of one split: the members' file, its rows file, and each sample's tar bytes."""

    path: str
    rows_path: str
    #: Each sample's tar bytes as written (extended headers included): `sample_tar_bytes`.
    sizes: array = field(default_factory=lambda: array("q"))


@dataclass
class BlockDone:
    """A worker's answer for one block: its segments by split, and the first bad record in it."""

    records: int
    segments: dict[str, Segment]
    #: The first record of the block that cannot be written: (its position in the block, where, why).
    reject: tuple[int, str, str] | None = None
    #: With --key-column: each record's key and name, in order, for the duplicate check across blocks.
    keys: list[str] | None = None
    wheres: list[str] | None = None
    #: `prep.index.checkpoint.file_key` of each media file the block's records named by path and read:
    #: `write --resume` reuses the block only while they are unchanged.
    media_files: list[tuple[str, int, int]] = field(default_factory=list)


def encode_block(job: EncodeJob) -> BlockDone:
    """Run the key, split and parts stages over a block's records and write each split's segment.

    Stops at the first record that cannot be written (the run stops there, `--on-error stop`)."""
    options, block = job.options, job.block
    source, records = block_records(block)
    keys = SampleKeys(options.key_column)
    keys.generated = block.records_before
    files: dict[str, ShardFile] = {}
    done = BlockDone(0, {})
    if options.key_column is not None:
        done.keys, done.wheres = [], []
    try:
        with media_files_read() as media_read:
            _encode_records(job, source, records, keys, files, done)
        done.media_files = [file_key(path) for path in dict.fromkeys(media_read)]
        for split, file in files.items():
            write_rows_file(Path(done.segments[split].rows_path), file.close())
    except BaseException:
        for file in files.values():
            file.abort()
        raise
    return done


def _encode_records(
    job: EncodeJob,
    source: Source,
    records: Iterable[Record | Reject],
    keys: SampleKeys,
    files: dict[str, ShardFile],
    done: BlockDone,
) -> None:
    """Each record of the block into its split's segment, up to the first that cannot be written."""
    options = job.options
    for record in records:
        if type(record) is Reject:
            done.reject = (done.records, record.where, record.reason)
            break
        try:
            key, _, split, parts, _ = stage_record(source, record, keys, options)
        except Rejected as rejected:
            done.reject = (done.records, record.where, str(rejected))
            break
        segment = done.segments.get(split)
        if segment is None:
            path = f"{job.folder}/segment-{job.number:06d}-{split}.tar"
            segment = done.segments[split] = Segment(path, path + ".rows")
            files[split] = ShardFile(Path(path), "segment", job.headers)
        segment.sizes.append(files[split].write(key, parts))
        if done.keys is not None and done.wheres is not None:
            done.keys.append(key)
            done.wheres.append(record.where)
        done.records += 1


@dataclass
class Piece:
    """Samples `[first, stop)` of a segment, which take its bytes `[start, end)`."""

    segment: str
    rows_path: str
    first: int
    stop: int


@dataclass
class PlannedShard:
    split: str
    pieces: list[Piece] = field(default_factory=list)
    count: int = 0
    #: Tar bytes of its samples (without the end marker).
    nbytes: int = 0


class ShardPlanner:
    """Cuts each split's samples into shards, block after block in input order, by the shard writer's rule."""

    def __init__(self, limits: ShardLimits) -> None:
        self.limits = limits
        self.shards: list[PlannedShard] = []
        self.open: dict[str, PlannedShard] = {}

    def add(self, done: BlockDone) -> None:
        """Take in a block's segments (blocks must come in input order)."""
        for split, segment in done.segments.items():
            sizes = [0, *accumulate(segment.sizes)]  # bytes of the segment's first n samples
            first, count = 0, len(segment.sizes)
            while first < count:
                shard = self.open.get(split)
                if shard is None:
                    shard = self.open[split] = PlannedShard(split)
                    self.shards.append(shard)
                taken = self._most_that_fit(shard, sizes, first, count)
                if taken == 0:  # the next sample would not fit: it starts the next shard
                    del self.open[split]
                    continue
                shard.pieces.append(Piece(segment.path, segment.rows_path, first, first + taken))
                shard.count += taken
                shard.nbytes += sizes[first + taken] - sizes[first]
                first += taken

    def _most_that_fit(self, shard: PlannedShard, sizes: list[int], first: int, count: int) -> int:
        """How many of samples `first..count` the shard takes before one rolls it over. The k-th is
        checked as the writer checks it, with the bytes written before it plus its own; that grows with
        k, so bisection finds the last to go in."""

        def fits(taken: int) -> bool:  # whether the `taken`-th sample goes in
            before = shard.nbytes + sizes[first + taken - 1] - sizes[first]
            size = sizes[first + taken] - sizes[first + taken - 1]
            return self.limits.room_for(shard.count + taken - 1, before, 1, size)

        low, high = 0, count - first
        while low < high:
            middle = (low + high + 1) // 2
            if fits(middle):
                low = middle
            else:
                high = middle - 1
        return low

    def finish(self) -> list[PlannedShard]:
        """Every planned shard, in order of its split's first sample, numbered within its split in order."""
        self.open.clear()
        return self.shards


@dataclass
class AssembleJob:
    """A planned shard and where it and its index files go."""

    shard: str
    path: str
    tar_index_path: str
    rows_path: str
    pieces: list[Piece]


_cached: tuple[str, ShardRows] | None = None


def _segment_rows(rows_path: str) -> ShardRows:
    """A segment's rows; the last one read is kept, as consecutive shards mostly come from one segment."""
    global _cached
    if _cached is None or _cached[0] != rows_path:
        _cached = (rows_path, read_rows_file(Path(rows_path)))
    return _cached[1]


def assemble_shard(job: AssembleJob) -> tuple[int, int]:
    """Copy a planned shard's byte ranges into place, write its `.tar.idx` and rows; (samples, tar size)."""
    rows = ShardRows(job.shard, 0)
    keys: list[str] = []
    position = 0
    with open(job.path, "wb", buffering=0) as out:
        try:
            for piece in job.pieces:
                segment = _segment_rows(piece.rows_path)
                start = segment.sample_starts[piece.first]
                last = piece.stop - 1
                end = segment.sample_starts[last] + segment.sample_sizes[last]
                shift = position - start
                _copy(piece.segment, start, end - start, out)
                base = len(keys)
                rows.sample_starts.extend(
                    offset + shift for offset in segment.sample_starts[piece.first : piece.stop]
                )
                rows.sample_sizes.extend(segment.sample_sizes[piece.first : piece.stop])
                low = bisect.bisect_left(segment.part_samples, piece.first)
                high = bisect.bisect_left(segment.part_samples, piece.stop)
                rows.part_samples.extend(
                    sample - piece.first + base for sample in segment.part_samples[low:high]
                )
                rows.part_names += segment.part_names[low:high]
                rows.part_offsets.extend(offset + shift for offset in segment.part_offsets[low:high])
                rows.part_sizes.extend(segment.part_sizes[low:high])
                keys += segment.keys_between(piece.first, piece.stop)
                position += end - start
            out.write(END_OF_ARCHIVE)
            os.fsync(out.fileno())
        except BaseException:
            out.close()
            Path(job.path).unlink(missing_ok=True)
            raise
    rows.set_keys(keys)
    rows.end = position
    write_tar_index(Path(job.tar_index_path), rows)
    write_rows_file(Path(job.rows_path), rows)
    return rows.count, position + len(END_OF_ARCHIVE)


def _copy(source: str, offset: int, length: int, out: BinaryIO) -> None:
    """Bytes `[offset, offset + length)` of file `source` appended to `out` (an unbuffered file)."""
    with open(source, "rb", buffering=0) as file:
        while length > 0:
            try:
                copied = os.copy_file_range(file.fileno(), out.fileno(), length, offset)
            except OSError:
                copied = 0
            if copied <= 0:  # not on this filesystem: read and write
                copied = len(data := os.pread(file.fileno(), min(length, COPY_BYTES), offset))
                if not copied:
                    raise OSError(f"{source} ends before byte {offset + length}")
                out.write(data)
            offset += copied
            length -= copied
