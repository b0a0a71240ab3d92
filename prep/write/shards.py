"""Write WebDataset shards and record each member's offsets as it goes: the index comes for free.

    >>> import shutil, tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> with ShardWriter(folder, "shard-%06d.tar", limits=ShardLimits(maxcount=2)) as writer:
    ...     for key in ("a", "b", "c"):
    ...         _ = writer.write(key, [("txt", key.encode()), ("json", b"{}")])
    >>> [(shard.shard, shard.rows.sample_keys) for shard in writer.written]
    [('shard-000000.tar', ['a', 'b']), ('shard-000001.tar', ['c'])]
    >>> shutil.rmtree(folder)

A `ShardFile` is one tar being written (headers from `prep.tar.write`); every sample's first header
offset and every part's data offset and size are recorded in its `ShardRows` as they are written, so the
`.tar.idx` and sqlite rows need no second pass over the shard. A `ShardWriter` writes a sequence of
them, rolling over when the next sample would not fit the `ShardLimits`, the one rollover rule that the
writer, the group writer and the parallel JSONL planner all follow.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prep.errors import PrepError
from prep.index.format import tar_index_name
from prep.index.rows import ShardRows
from prep.index.staging import NAME_MAX
from prep.tar.fields import BLOCK, END_OF_ARCHIVE, ZERO_BLOCK, member_bytes
from prep.tar.write import HeaderMaker, header_bytes


@dataclass(frozen=True)
class ShardLimits:
    """How big a shard may grow: at most `maxcount` samples and `maxsize` bytes of tar file."""

    maxcount: int = 10_000
    maxsize: float = 3e9

    def fits(self, count: int, nbytes: int) -> bool:
        """Whether `count` samples whose members take `nbytes` make a shard within the limits (with the
        end-of-archive marker). A shard takes its first sample whatever its size."""
        return count <= self.maxcount and nbytes + len(END_OF_ARCHIVE) <= self.maxsize

    def room_for(self, count: int, nbytes: int, samples: int, more_bytes: int) -> bool:
        """Whether a shard of `count` samples in `nbytes` takes `samples` more of `more_bytes` without
        rolling over (an empty shard takes anything): the rollover rule.

        >>> ShardLimits(maxcount=2).room_for(2, 100, 1, 10), ShardLimits(maxcount=2).room_for(0, 0, 5, 10)
        (False, True)
        """
        return count == 0 or self.fits(count + samples, nbytes + more_bytes)


def sample_tar_bytes(key: str, parts: list[tuple[str, bytes]]) -> int:
    """Tar bytes one sample takes as `ShardFile.write` writes it: each member's header blocks (PAX ones
    included) and its padded data.

    >>> sample_tar_bytes("a", [("txt", b"hi")]), sample_tar_bytes("k" * 200, [("txt", b"hi")])
    (1024, 2048)
    """
    total = 0
    for part, data in parts:
        size = len(data)
        total += member_bytes(size) - BLOCK + header_bytes(f"{key}.{part}", size)
    return total


class ShardFile:
    """One tar file being written, with the index rows of what is in it so far (column by column).

    A context manager: leaving the block without `close` (an error) removes the half-written file.
    """

    def __init__(self, path: Path, shard: str, headers: HeaderMaker | None = None) -> None:
        self.path = path
        self.shard = shard
        self.headers = headers or HeaderMaker()
        self.file = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 (closed by close/abort)
        self.pos = 0
        #: tar_file_id 0 stands in until the index writer learns the shard's place in the shard list.
        self.rows = ShardRows(shard, 0)
        self.keys: list[str] = []

    @property
    def count(self) -> int:
        return len(self.keys)

    def write(self, key: str, parts: list[tuple[str, bytes]]) -> int:
        """Append one sample (its parts in order, named `key.part`); returns the bytes written."""
        rows = self.rows
        sample_index = len(self.keys)
        start = pos = self.pos
        member = self.headers.member
        pieces = []
        for part, data in parts:
            size = len(data)
            header = member(f"{key}.{part}", size)
            pos += len(header)
            rows.part_samples.append(sample_index)
            rows.part_names.append(part)
            rows.part_offsets.append(pos)
            rows.part_sizes.append(size)
            padding = -size % BLOCK
            if size < 1 << 16:
                pieces += (header, data, ZERO_BLOCK[:padding])
            else:  # a large part goes out as it is, not copied into the joined buffer
                pieces.append(header)
                self.file.write(b"".join(pieces))
                self.file.write(data)
                pieces = [ZERO_BLOCK[:padding]]
            pos += size + padding
        self.file.write(b"".join(pieces))
        self.keys.append(key)
        rows.sample_starts.append(start)
        rows.sample_sizes.append(pos - start)
        self.pos = pos
        return pos - start

    def close(self) -> ShardRows:
        """Write the end-of-archive marker, flush to disk and return the shard's index rows."""
        self.rows.set_keys(self.keys)
        self.rows.end = self.pos
        self.file.write(END_OF_ARCHIVE)
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        return self.rows

    @property
    def nbytes(self) -> int:
        """The tar file's size once closed."""
        return self.pos + len(END_OF_ARCHIVE)

    def abort(self) -> None:
        try:
            self.file.close()  # flushes what is buffered, which fails on a full disk: the file goes anyway
        except OSError:
            pass
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, exc_type: type | None, *exc_info: object) -> None:
        if exc_type is not None:
            self.abort()


@dataclass
class WrittenShard:
    """A finished shard: its name under the dataset root, where it was written, and its index rows."""

    shard: str
    path: Path
    #: The shard's index rows; None once `on_close` has taken them.
    rows: ShardRows | None
    bytes: int


def _in_place(final: Path) -> Path:
    """Write a shard under its final name (no staging), in a folder made for it if needed."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return final


def shard_name(pattern: str, number: int) -> str:
    """`pattern % number`, the name of shard `number` below its folder; a PrepError if it, or its
    `.tar.idx`, would have a part longer than a file name may be. A pattern's one number changes nothing
    but the name's length from one shard to the next, so each name is checked as it is made (what else
    makes a bad name, `path_problem`, is seen in shard 0's: `WriteOptions`).

    >>> shard_name("s-%06d.tar", 7)
    's-000007.tar'
    >>> shard_name("x" * 245 + "-%d.tar", 10)
    Traceback (most recent call last):
    prep.errors.PrepError: --shard-pattern 'xx...x-%d.tar' names shard 10 xx...x-10.tar, but its index file's name, xx...x-10.tar.idx, would be 256 bytes, more than the 255 a file name may have. Give a pattern with a shorter name, such as shard-%06d.tar.
    """
    name = pattern % number
    parts = tar_index_name(name).split("/")
    for at, part in enumerate(parts):
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            what = "its index file's name" if at == len(parts) - 1 else "a folder's name"
            raise PrepError(
                f"--shard-pattern {pattern!r} names shard {number} {name}, but {what}, {part}, would be"
                f" {size} bytes, more than the {NAME_MAX} a file name may have. Give a pattern with a shorter"
                " name, such as shard-%06d.tar."
            )
    return name


class ShardWriter:
    """Writes samples into a sequence of shards `folder/pattern % n`, rolling over by `limits`.

    A shard is closed before a sample that would take it past the limits (a single larger sample gets a
    shard of its own). `temp_name` maps a shard's final path to the path it is written under (for
    all-or-nothing writes); `on_close` sees each finished shard.
    """

    def __init__(
        self,
        folder: Path,
        pattern: str = "shard-%06d.tar",
        *,
        prefix: str = "",
        limits: ShardLimits | None = None,
        temp_name: Callable[[Path], Path] | None = None,
        on_close: Callable[[WrittenShard], None] | None = None,
        headers: HeaderMaker | None = None,
    ) -> None:
        self.folder = folder
        self.pattern = pattern
        self.prefix = prefix
        self.limits = limits or ShardLimits()
        self.temp_name = temp_name or _in_place
        self.on_close = on_close
        self.headers = headers or HeaderMaker()
        self.number = 0
        self.current: ShardFile | None = None
        self.written: list[WrittenShard] = []

    def next_shard(self) -> tuple[str, Path]:
        """The next shard in the sequence: its name under the dataset root and its final path."""
        name = shard_name(self.pattern, self.number)
        self.number += 1
        return self.prefix + name, self.folder / name

    def room_for(self, samples: int, nbytes: int) -> bool:
        """Whether the open shard takes `samples` more samples of `nbytes` tar bytes without rolling over
        (a new shard takes anything)."""
        current = self.current
        return current is None or self.limits.room_for(current.count, current.pos, samples, nbytes)

    def write(self, key: str, parts: list[tuple[str, bytes]], same_shard: bool = False) -> int:
        """Write one sample, opening a new shard first if this one is full; returns the bytes written.

        `same_shard` keeps the sample in the open shard even past the limits (the rest of a group)."""
        if not same_shard and not self.room_for(1, sample_tar_bytes(key, parts)):
            self.finish_shard()
        current = self.current
        if current is None:
            shard, final = self.next_shard()
            current = self.current = ShardFile(self.temp_name(final), shard, self.headers)
        return current.write(key, parts)

    def finish_shard(self) -> None:
        """Close the open shard (if any); the next sample starts a new one."""
        if self.current is None:
            return
        shard = self.current
        self.current = None
        rows = shard.close()
        written = WrittenShard(shard.shard, shard.path, rows, shard.nbytes)
        if self.on_close is not None:
            self.on_close(written)
            written.rows = None  # handed over: holding every shard's rows would grow without bound
        self.written.append(written)

    def close(self) -> list[WrittenShard]:
        """Finish the last shard and return every shard written, in order."""
        self.finish_shard()
        return self.written

    def abort(self) -> None:
        """Remove the open shard's file (finished shards are the caller's to remove)."""
        if self.current is not None:
            self.current.abort()
            self.current = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type | None, *exc_info: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
