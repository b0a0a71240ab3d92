"""Read a tar shard's member headers without reading its contents.

The scanner walks the 512-byte header blocks of a memory-mapped shard and jumps over member data, so it
touches one page per member however big the member is. It understands ustar, GNU long names and long
links (`L`/`K`), and PAX extended (`x`) and global (`g`) headers, the way Python's `tarfile` does, and it
refuses what `tarfile` lets slip by: a header cut short by the end of the file, member data running past
the end, a corrupt header in the middle, a missing end-of-archive marker, a compressed file.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from prep.errors import ShardError

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)

# Type flags (tarfile's names) as the integer values of the header byte.
REGULAR_TYPES = frozenset(b"0\x007")  # REGTYPE, AREGTYPE, CONTTYPE
KNOWN_NON_REGULAR = frozenset(b"123456")  # links, devices, directory, fifo: no data follows them
GNU_LONGNAME, GNU_LONGLINK, GNU_SPARSE = ord("L"), ord("K"), ord("S")
PAX_EXTENDED, PAX_GLOBAL, SOLARIS_EXTENDED = ord("x"), ord("g"), ord("X")
AREGTYPE = 0

COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}

NOT_UTF8 = (
    "a member name there is not valid UTF-8; energon's index stores names as text and cannot hold it."
    " Rename the member with a UTF-8 name."
)
REWRITE_ADVICE = "Re-create or re-download the shard; shardprep never modifies tars."


@dataclass(frozen=True, slots=True)
class Member:
    """One regular file in a shard: where its first header starts, where its data starts, how long it is."""

    name: str
    offset: int
    offset_data: int
    size: int


def _block_ceil(size: int) -> int:
    return (size + BLOCK - 1) // BLOCK * BLOCK


def _number(field: bytes) -> int:
    """A numeric header field: NUL/space-terminated octal, or GNU base-256 for large values."""
    if field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:  # negative base-256
            value -= 1 << (8 * (len(field) - 1))
        return value
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8")


def header_checksum_ok(header: bytes) -> bool:
    """Whether a 512-byte header's stored checksum matches (unsigned or the historic signed sum)."""
    try:
        stored = _number(header[148:156])
    except ValueError:
        return False
    unsigned = sum(header[:148]) + sum(header[156:]) + 8 * 0x20
    if stored == unsigned:
        return True
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + header[156:]) + 8 * 0x20
    return stored == signed


def _parse_pax(data: bytes) -> dict[str, str]:
    """The records of a PAX header block: `"%d %s=%s\\n"`, length counting the whole record."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            break
        length = int(data[pos:space])
        if length <= 0:
            raise ValueError("a PAX record of length 0")
        record = data[space + 1 : pos + length - 1]
        keyword, eq, value = record.partition(b"=")
        if not eq:
            raise ValueError("a PAX record without '='")
        records[keyword.decode("utf-8")] = value.decode("utf-8")
        pos += length
    return records


def check_not_compressed(shard: str, head: bytes) -> None:
    """Refuse a compressed shard: energon reads members by byte offset into the raw file."""
    for magic, kind in COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            raise ShardError(
                shard,
                f"is {kind}-compressed. energon reads samples by byte offset and cannot load a compressed"
                " shard (energon prepare indexes it anyway, then fails at load time).",
                advice=f"Decompress it to a plain .tar (e.g. `{kind} -dc` or `tar -x` then re-pack), "
                "then prepare again.",
            )


class HeaderWalker:
    """Walks the headers of one memory-mapped shard; `members()` yields its regular files in order.

    After the walk, `end` is where the end-of-archive marker starts (energon's last `.tar.idx` offset) and
    `header_offsets` lists every header block visited, for a batched checksum check.
    """

    def __init__(self, shard: str, buffer: mmap.mmap | bytes) -> None:
        self.shard = shard
        self.buf = buffer
        self.size = len(buffer)
        self.end = 0
        self.header_offsets = array("q")

    def _fail(self, offset: int, problem: str, advice: str = REWRITE_ADVICE) -> ShardError:
        """An error at `offset`, unless an earlier header is corrupt: then that is the real cause."""
        corrupt = self.first_corrupt_header()
        if corrupt is not None:
            return self._corrupt(corrupt)
        return ShardError(self.shard, problem, offset=offset, advice=advice)

    def _corrupt(self, offset: int) -> ShardError:
        if offset == 0:
            return ShardError(
                self.shard,
                "is not a tar archive: the first 512 bytes are not a valid tar header (bad checksum).",
                advice="Remove or rename the file, or exclude it with --exclude.",
            )
        return ShardError(
            self.shard,
            "the header there is corrupt (its checksum does not match its contents).",
            offset=offset,
            advice=REWRITE_ADVICE,
        )

    def members(self) -> Iterator[Member]:
        buf, size, shard = self.buf, self.size, self.shard
        header_offsets = self.header_offsets
        global_pax: dict[str, str] = {}
        pos = 0
        chain_start = -1  # first header of an L/K/x chain: where the member "starts" for energon
        long_name: str | None = None
        pax: dict[str, str] | None = None
        while True:
            header = buf[pos : pos + BLOCK]
            if len(header) < BLOCK:
                if pos == 0 and not header:
                    raise ShardError(
                        shard,
                        "is an empty file, not a tar archive.",
                        advice="Remove it or exclude it with --exclude.",
                    )
                if not header:
                    problem = (
                        "the shard ends without the end-of-archive marker (two zero blocks) that every tar"
                        " writer puts there: it was probably cut short at a member boundary."
                    )
                else:
                    problem = (
                        f"the shard ends inside a header ({len(header)} of its {BLOCK} bytes are there):"
                        " it was cut short."
                    )
                raise self._fail(pos, problem)
            if header == ZERO_BLOCK:
                if chain_start >= 0:
                    raise self._fail(
                        chain_start,
                        "an extended header is followed by the end-of-archive marker instead of a member.",
                    )
                self.end = pos
                return
            header_offsets.append(pos)
            if pos == 0 and not header_checksum_ok(header):
                raise self._corrupt(0)
            typeflag = header[156]
            try:
                member_size = _number(header[124:136])
            except ValueError:
                raise self._fail(pos, "the header's size field is not a number") from None
            offset_data = pos + BLOCK
            if typeflag in (GNU_LONGNAME, GNU_LONGLINK, PAX_EXTENDED, PAX_GLOBAL, SOLARIS_EXTENDED):
                data_end = offset_data + member_size
                if member_size < 0 or data_end > size:
                    raise self._fail(pos, "an extended header's data runs past the end of the shard")
                data = buf[offset_data:data_end]
                if typeflag != PAX_GLOBAL and chain_start < 0:
                    chain_start = pos
                if typeflag == GNU_LONGNAME:
                    try:
                        long_name = _text(data)
                    except UnicodeDecodeError:
                        raise self._fail(pos, NOT_UTF8) from None
                elif typeflag in (PAX_EXTENDED, SOLARIS_EXTENDED, PAX_GLOBAL):
                    try:
                        records = _parse_pax(data)
                    except UnicodeDecodeError:
                        raise self._fail(pos, NOT_UTF8) from None
                    except ValueError as exc:
                        raise self._fail(pos, f"the PAX header is malformed ({exc})") from None
                    if any(key.startswith("GNU.sparse") for key in records):
                        raise self._unsupported_sparse(pos)
                    if typeflag == PAX_GLOBAL:
                        global_pax.update(records)
                    else:
                        pax = records if pax is None else {**pax, **records}
                pos = offset_data + _block_ceil(member_size)
                continue

            if typeflag == GNU_SPARSE:
                raise self._unsupported_sparse(pos)
            if long_name is not None:
                name = long_name
            else:
                try:
                    name = _text(header[0:100])
                    if header[345]:  # ustar prefix (tarfile joins it for every non-GNU type)
                        name = _text(header[345:500]) + "/" + name
                except UnicodeDecodeError:
                    raise self._fail(pos, NOT_UTF8) from None
            if global_pax or pax:
                effective = {**global_pax, **(pax or {})}
                if "path" in effective:
                    name = effective["path"].rstrip("/")
                if "size" in effective:
                    try:
                        member_size = int(effective["size"])
                    except ValueError:
                        raise self._fail(pos, "the PAX size record is not a number") from None
            is_regular = typeflag in REGULAR_TYPES and not (typeflag == AREGTYPE and name.endswith("/"))
            start = chain_start if chain_start >= 0 else pos
            chain_start, long_name, pax = -1, None, None
            if is_regular or typeflag not in KNOWN_NON_REGULAR:
                next_pos = offset_data + _block_ceil(member_size)
                if member_size < 0 or next_pos > size:
                    raise self._fail(
                        pos,
                        f"member {name!r} declares {member_size} bytes of data (ending at byte {next_pos}"
                        f" with padding) but the shard ends at byte {size}: it was cut short inside the"
                        " member's data.",
                    )
            else:
                next_pos = offset_data
            if is_regular:
                yield Member(name, start, offset_data, member_size)
            pos = next_pos

    def _unsupported_sparse(self, offset: int) -> ShardError:
        return ShardError(
            self.shard,
            "holds a GNU sparse member, whose bytes are not stored contiguously; energon cannot read it.",
            offset=offset,
            advice="Re-create the shard without --sparse.",
        )

    def first_corrupt_header(self) -> int | None:
        """The offset of the first visited header whose checksum is wrong, checked in vectorised batches."""
        if not self.header_offsets:
            return None
        import numpy as np

        data = np.frombuffer(self.buf, dtype=np.uint8)
        offsets = np.frombuffer(self.header_offsets, dtype=np.int64)
        columns = np.concatenate([np.arange(0, 148), np.arange(156, BLOCK)])
        for start in range(0, len(offsets), 8192):
            chunk = offsets[start : start + 8192]
            sums = data[chunk[:, None] + columns].sum(axis=1, dtype=np.int64) + 8 * 0x20
            stored = np.array([_stored_checksum(self.buf, int(o)) for o in chunk], dtype=np.int64)
            for index in np.nonzero(sums != stored)[0]:
                offset = int(chunk[index])
                if not header_checksum_ok(self.buf[offset : offset + BLOCK]):
                    return offset
        return None

    def verify_checksums(self) -> None:
        """Raise on the first visited header whose checksum is wrong."""
        corrupt = self.first_corrupt_header()
        if corrupt is not None:
            raise self._corrupt(corrupt)


def _stored_checksum(buf: mmap.mmap | bytes, offset: int) -> int:
    try:
        return _number(buf[offset + 148 : offset + 156])
    except ValueError:
        return -1


def open_shard(path: str, shard: str) -> mmap.mmap | bytes:
    """Memory-map a shard read-only, with errors that name it (missing, unreadable, a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:
        raise ShardError(
            shard,
            "cannot be read: permission denied.",
            advice="Give the user running prepare read access (e.g. `chmod a+r`), or exclude it with --exclude.",
        ) from None
    except IsADirectoryError:
        raise ShardError(shard, "is a folder, not a tar file.", advice="Rename it or exclude it with --exclude.") from None
    except OSError as exc:
        raise ShardError(shard, f"cannot be opened: {exc.strerror}.") from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return b""
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def scan_members(path: str, shard: str) -> tuple[list[Member], int]:
    """All regular members of a shard and the offset where its end-of-archive marker starts.

    Convenience for tools and tests; the indexer streams `HeaderWalker.members()` instead.
    """
    buffer = open_shard(path, shard)
    check_not_compressed(shard, buffer[:8])
    walker = HeaderWalker(shard, buffer)
    members = list(walker.members())
    walker.verify_checksums()
    return members, walker.end
