"""Write WebDataset shards and record each member's offsets as it goes: the index comes for free.

    >>> writer = ShardWriter(folder, "shard-%06d.tar", maxcount=10_000)      # doctest: +SKIP
    >>> writer.write("000001", [("txt", b"hello"), ("json", b"{}")])         # doctest: +SKIP
    >>> shards = writer.close()   # one ShardRows per shard, equal to what prepare would find  # doctest: +SKIP

Members get a plain 512-byte ustar header (GNU tar and Python's tarfile read it); a PAX header goes in
front only when the name or size needs one (non-ASCII or over-long names, sizes of 8 GiB and more).
Every sample's first header offset and every part's data offset and size are recorded as they are
written, so the `.tar.idx` and sqlite rows need no second pass over the shard.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prep.shard_index import ShardRows

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
ZERO_PADDING = b"\0" * BLOCK
#: The largest size a 12-byte octal field holds (11 digits); larger members need a PAX `size`.
MAX_OCTAL_SIZE = 8**11 - 1
NAME_FIELD, PREFIX_FIELD = 100, 155


def _template(mtime: int) -> bytearray:
    """A regular-file ustar header with empty name and size and the checksum field as spaces."""
    block = bytearray(BLOCK)
    block[100:108] = b"0000644\0"
    block[108:116] = b"0000000\0"
    block[116:124] = b"0000000\0"
    block[124:136] = b"00000000000\0"
    block[136:148] = b"%011o\0" % mtime
    block[148:156] = b" " * 8
    block[156:157] = b"0"
    block[257:265] = b"ustar\x0000"
    return block


class HeaderMaker:
    """Builds member headers fast: a precomputed template whose checksum is adjusted per name and size."""

    def __init__(self, mtime: int = 0) -> None:
        self.template = bytes(_template(mtime))
        self.base_checksum = sum(self.template) - sum(self.template[124:136])
        template = self.template
        self._modes, self._mtime, self._middle, self._tail = (
            template[100:124], template[136:148], template[157:345], template[500:]
        )

    def ustar(self, name: bytes, size: int, prefix: bytes = b"", typeflag: bytes = b"0") -> bytes:
        """One header block; `name` fits 100 bytes, `prefix` 155, `size` an octal field."""
        size_field = b"%011o\0" % size
        checksum = self.base_checksum + sum(name) + sum(size_field) + sum(prefix) + typeflag[0] - 48
        return b"".join((
            name, bytes(100 - len(name)), self._modes, size_field, self._mtime,
            b"%06o\0 " % checksum, typeflag, self._middle, prefix, bytes(155 - len(prefix)), self._tail,
        ))

    def member(self, name: str, size: int) -> bytes:
        """Every header block of one member: a plain ustar header, or PAX + ustar when the name or size needs it."""
        raw = name.encode("utf-8")
        if len(raw) <= NAME_FIELD and size <= MAX_OCTAL_SIZE and raw.isascii():
            return self.ustar(raw, size)
        return self._extended(name, raw, size)

    def _extended(self, name: str, raw: bytes, size: int) -> bytes:
        records: list[tuple[str, str]] = []
        field_size = size
        if size > MAX_OCTAL_SIZE:
            records.append(("size", str(size)))
            field_size = 0
        if raw.isascii() and len(raw) <= NAME_FIELD:
            return self._pax(records, raw, b"", field_size)
        if raw.isascii():
            split = _ustar_split(raw)
            if split is not None:
                return self._pax(records, split[1], split[0], field_size)
        records.append(("path", name))
        short = raw[:NAME_FIELD].decode("ascii", "replace").encode("ascii", "replace")
        return self._pax(records, short, b"", field_size)

    def _pax(self, records: list[tuple[str, str]], name: bytes, prefix: bytes, field_size: int) -> bytes:
        header = self.ustar(name, field_size, prefix)
        if not records:
            return header
        data = b"".join(_pax_record(key, value) for key, value in records)
        pax = self.ustar(b"././@PaxHeader", len(data), typeflag=b"x")
        return pax + data + ZERO_PADDING[: -len(data) % BLOCK] + header


def _ustar_split(raw: bytes) -> tuple[bytes, bytes] | None:
    """Split a long ASCII path at a slash into ustar's prefix (<= 155) and name (<= 100) fields."""
    if len(raw) > NAME_FIELD + PREFIX_FIELD + 1:
        return None
    slash = raw.find(b"/", max(0, len(raw) - NAME_FIELD - 1))
    while 0 < slash <= PREFIX_FIELD:
        if len(raw) - slash - 1 <= NAME_FIELD:
            return raw[:slash], raw[slash + 1 :]
        slash = raw.find(b"/", slash + 1)
    return None


def _pax_record(key: str, value: str) -> bytes:
    """`"LEN key=value\\n"` where LEN counts the whole record, its own digits included."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


class ShardFile:
    """One tar file being written, with the index rows of what is in it so far (column by column)."""

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
                pieces += (header, data, ZERO_PADDING[:padding])
            else:  # a large part goes out as it is, not copied into the joined buffer
                pieces.append(header)
                self.file.write(b"".join(pieces))
                self.file.write(data)
                pieces = [ZERO_PADDING[:padding]]
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

    def abort(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)


@dataclass
class WrittenShard:
    """A finished shard: its name under the dataset root, where it was written, and its index rows."""

    shard: str
    path: Path
    #: The shard's index rows; None once `on_close` has taken them.
    rows: ShardRows | None
    bytes: int


class ShardWriter:
    """Writes samples into a sequence of shards `folder/pattern % n`, rolling over by count and size.

    `maxsize` counts tar bytes; a shard is closed before a sample that would take it past `maxsize`
    (a single larger sample gets a shard of its own). `temp_name` maps a shard's final path to the path
    it is written under (for all-or-nothing writes); `on_close` sees each finished shard.
    """

    def __init__(
        self,
        folder: Path,
        pattern: str = "shard-%06d.tar",
        *,
        prefix: str = "",
        maxcount: int = 10_000,
        maxsize: float = 3e9,
        temp_name: Callable[[Path], Path] | None = None,
        on_close: Callable[[WrittenShard], None] | None = None,
        headers: HeaderMaker | None = None,
    ) -> None:
        self.folder = folder
        self.pattern = pattern
        self.prefix = prefix
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.temp_name = temp_name or (lambda path: path)
        self.on_close = on_close
        self.headers = headers or HeaderMaker()
        self.number = 0
        self.current: ShardFile | None = None
        self.written: list[WrittenShard] = []

    def next_shard(self) -> tuple[str, Path]:
        """The next shard in the sequence: its name under the dataset root and its final path (folder made)."""
        name = self.pattern % self.number
        self.number += 1
        final = self.folder / name
        final.parent.mkdir(parents=True, exist_ok=True)
        return self.prefix + name, final

    def _open(self) -> ShardFile:
        shard, final = self.next_shard()
        return ShardFile(self.temp_name(final), shard, self.headers)

    def write(self, key: str, parts: list[tuple[str, bytes]], same_shard: bool = False) -> int:
        """Write one sample, opening a new shard first if this one is full; returns the bytes written.

        `same_shard` keeps the sample in the open shard even past the limits (the rest of a group)."""
        current = self.current
        if current is not None and not same_shard and (
            current.count >= self.maxcount or current.pos + sample_tar_bytes(parts) + 2 * BLOCK > self.maxsize
        ):
            self.finish_shard()
            current = None
        if current is None:
            current = self.current = self._open()
        return current.write(key, parts)

    def room_for(self, samples: int, nbytes: int) -> bool:
        """Whether the open shard takes `samples` more samples of `nbytes` tar bytes without rolling over."""
        current = self.current
        if current is None or current.count == 0:
            return True
        return current.count + samples <= self.maxcount and current.pos + nbytes + 2 * BLOCK <= self.maxsize

    def finish_shard(self) -> None:
        """Close the open shard (if any); the next sample starts a new one."""
        if self.current is None:
            return
        shard = self.current
        self.current = None
        rows = shard.close()
        written = WrittenShard(shard.shard, shard.path, rows, shard.pos + 2 * BLOCK)
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


def sample_tar_bytes(parts: list[tuple[str, bytes]]) -> int:
    """Tar bytes one sample takes with plain ustar headers (a lower bound when PAX headers are needed)."""
    total = 0
    for _, data in parts:
        size = len(data)
        total += BLOCK + size + (-size % BLOCK)
    return total
