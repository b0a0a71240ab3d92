"""Read a tar shard's member headers without reading its contents.

The scanner walks the 512-byte header blocks of a memory-mapped shard and jumps over member data, so it
touches one page per member however big the member is; shards of many small members are instead read
window by window and their headers found with numpy. Pages are released behind the scan, so memory stays
flat. It understands ustar, GNU long names and long links (`L`/`K`), and PAX extended (`x`) and global
(`g`) headers, the way Python's `tarfile` does, and it refuses what `tarfile` lets slip by: a header cut
short by the end of the file, member data running past the end, a corrupt header in the middle, a
missing end-of-archive marker, a compressed file.
"""

from __future__ import annotations

import mmap
import os
import re
import shlex
import stat
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, overload

import numpy as np

from prep.errors import ShardError
from prep.tar.fields import (
    AREGTYPE,
    BLOCK,
    EXTENSION_TYPES,
    GNU_LONGLINK,
    GNU_LONGNAME,
    GNU_SPARSE,
    KNOWN_NON_REGULAR,
    MAGIC,
    NAME,
    PAX_EXTENDED,
    PAX_GLOBAL,
    PREFIX,
    PREFIX_START,
    REGULAR_TYPES,
    SIZE,
    TYPEFLAG,
    USTAR,
    ZERO_BLOCK,
    block_ceil,
)
from prep.tar.header import checksum_ok, checksums_match, number, octal_fields, parse_pax

#: Blocks the vectorised scan reads before releasing them (2 MiB).
WINDOW_BLOCKS = 4096
#: The header walk checks the checksums of this many headers at a time.
CHECKSUM_BATCH = 2048
#: The header walk releases the pages behind it every this many bytes.
RELEASE_STRIDE = 16 * 1024 * 1024
#: Shards whose first members average at most this many bytes take the vectorised scan.
SMALL_MEMBER_STRIDE = 4 * 1024
_REGULAR_CODES = np.array(sorted(REGULAR_TYPES), dtype=np.uint8)
_NO_DATA_TYPES = np.array(sorted(KNOWN_NON_REGULAR), dtype=np.uint8)
_FAST_TYPES = np.array(sorted(REGULAR_TYPES | KNOWN_NON_REGULAR | {PAX_EXTENDED}), dtype=np.uint8)
#: The bytes after the end-of-archive marker are looked at this many at a time.
TAIL_CHUNK = 1024 * 1024
#: PAX keywords that change what is indexed (the rest, e.g. webdataset's float mtime, are skipped unparsed).
_PAX_KEYWORDS_THAT_MATTER = re.compile(rb" (?:path=|size=|GNU\.sparse|hdrcharset=)")

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

#: Member names as `HeaderWalker.scan_table` gives them: a numpy bytes array (dtype `S`, each name's
#: UTF-8 bytes NUL-padded; clean UTF-8) where the vectorised scan found them, else the header walk's list
#: of str.
Names = np.ndarray | list[str]


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8")


def check_not_compressed(shard: str, head: bytes) -> None:
    """Refuse a compressed shard: energon reads members by byte offset into the raw file.

    A valid first tar header wins over a magic number (a member may be named "BZh...").
    """
    if len(head) >= BLOCK and checksum_ok(head[:BLOCK]):
        return
    for magic, kind in COMPRESSED_MAGIC.items():
        if head.startswith(magic):
            raise ShardError(
                shard,
                f"is {kind}-compressed. energon reads samples by byte offset and cannot load a compressed"
                " shard (energon prepare indexes it anyway, then fails at load time).",
                advice=f"Decompress it to a plain .tar (e.g. `{kind} -dc` or `tar -x` then re-pack), "
                "then prepare again.",
            )


@dataclass(frozen=True, slots=True)
class Member:
    """One regular file in a shard: where its first header starts, where its data starts, how long it is."""

    name: str
    offset: int
    offset_data: int
    size: int


class HeaderWalker:
    """Walks the headers of one memory-mapped shard; `members()` yields its regular files in order.

    After the walk, `end` is where the end-of-archive marker starts (energon's last `.tar.idx` offset; the
    shard's size when `end_marker` is False, for a shard that ends right after its last member's data) and
    `header_offsets` lists every header block visited, for a batched checksum check.
    """

    def __init__(self, shard: str, buffer: mmap.mmap | bytes) -> None:
        self.shard = shard
        self.buf = buffer
        self.size = len(buffer)
        self.end = 0
        self.end_marker = True
        self.header_offsets = array("q")
        #: Headers whose checksum is wrong, found during the scan (None: not checked yet).
        self._corrupt_headers: list[int] | None = None
        #: During `_walk`: (corrupt headers found so far, headers copied since), so that an error in the
        #: middle of the walk finds an earlier corrupt header without reading the shard again.
        self._walked: tuple[list[int], bytearray] | None = None

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
        """The shard's regular members in order, one object each (for readers that want them so)."""
        names, starts, data_offsets, sizes = self.scan()
        for name, start, offset_data, size in zip(names, starts, data_offsets, sizes, strict=True):
            yield Member(name, start, offset_data, size)

    def scan(self) -> tuple[list[str], array, array, array]:
        """(names, member starts, data offsets, sizes) of the regular members, and `end`."""
        names, starts, data_offsets, sizes = self.scan_table()
        return decoded_names(names), starts, data_offsets, sizes

    def scan_table(self) -> tuple[Names, array, array, array]:
        """`scan`, with the names as the vectorised path finds them (`Names`): a shard's index rows are
        grouped from them without a str per member.

        Shards of many small members (text, JSON) take the vectorised path; others, and anything unusual,
        the header-by-header walk.
        """
        if self.size >= BLOCK and self.mostly_small_members():
            fast = self._scan_vectorised()
            if fast is not None:
                return fast
            self.header_offsets = array("q")
            self._corrupt_headers = None
        return self._walk()

    def data_after_end(self) -> int | None:
        """After the scan: where bytes other than zeros start after the end-of-archive marker, or None.
        Readers stop at the marker (tar without -i, tarfile, energon), so such bytes are not read: a
        second archive joined on with `cat` loses its members."""
        return first_nonzero(self.buf, self.end, self.size) if self.end_marker else None

    def mostly_small_members(self, probe: int = 16) -> bool:
        """Whether the first `probe` members (or all, if fewer) end within `probe * SMALL_MEMBER_STRIDE`
        bytes: then reading every block beats seeking past data (a shard in a bucket is then read whole).
        Reads nothing past that limit."""
        buf, pos, limit = self.buf, 0, probe * SMALL_MEMBER_STRIDE
        for _ in range(probe):
            if pos + BLOCK > self.size:
                return True
            if pos > limit:
                return False
            if buf[pos : pos + BLOCK] == ZERO_BLOCK:
                return True
            try:
                member_size = number(buf[pos + SIZE.start : pos + SIZE.stop])
            except ValueError:
                return False
            pos += BLOCK + block_ceil(member_size)
        return pos <= limit

    def _scan_vectorised(self) -> tuple[Names, array, array, array] | None:
        """The whole header chain found with numpy, or None where the shard needs the careful walk.

        Every block whose magic says "ustar" is a candidate header; the candidates must chain exactly
        (each header's size leads to the next candidate, the last to a zero block), and only plain
        members, folders, links and PAX headers that change nothing indexed may appear. The shard is read
        a window at a time and each window's pages are released after it, so memory stays flat however
        big the shard is; header checksums are checked on the way.
        """
        whole = self.size // BLOCK
        blocks = np.frombuffer(self.buf, dtype=np.uint8, count=whole * BLOCK).reshape(whole, BLOCK)
        found: list[tuple[np.ndarray, ...]] = []
        prefixes: dict[int, bytes] = {}
        for first in range(0, whole, WINDOW_BLOCKS):
            window = blocks[first : first + WINDOW_BLOCKS]
            at_magic = window[:, MAGIC.start]
            is_header = at_magic == USTAR[0]
            for position, byte in enumerate(
                USTAR[1:], MAGIC.start + 1
            ):  # a column at a time: no 2-D reduction
                is_header &= window[:, position] == byte
            local = np.flatnonzero(is_header)
            headers = window[local]
            candidates = local + first
            # The block after a PAX header holds its records (it may start the next window).
            following = np.minimum(candidates + 1, whole - 1)
            sizes, sizes_ok = octal_fields(headers[:, SIZE])
            if not sizes_ok.all():  # base-256 or unusual sizes: leave to the walk
                return None
            pax = headers[:, TYPEFLAG] == PAX_EXTENDED
            if pax.any():
                # The records' whole block is searched, as tarfile reads it (records may run on where
                # the size field ends); records longer than a block are left to the walk.
                if int(sizes[pax].max()) > BLOCK:
                    return None
                if _pax_may_change_index(blocks[following[pax]].tobytes()):
                    return None
            for row in np.flatnonzero(headers[:, PREFIX_START]):  # ustar prefixes are rare: keep them aside
                prefixes[int(candidates[row])] = bytes(headers[row, PREFIX]).split(b"\0", 1)[0]
            found.append(
                (
                    candidates,
                    sizes,
                    headers[:, TYPEFLAG].copy(),
                    ~checksums_match(headers),
                    _name_fields(headers),
                )
            )
            self._release(first * BLOCK, len(window) * BLOCK + BLOCK)
        if not found:
            return None
        candidates, sizes, types, corrupt, name_fields = (
            np.concatenate(column) for column in zip(*found, strict=True)
        )
        del found
        if len(candidates) == 0 or candidates[0] != 0:
            return None
        if not np.isin(types, _FAST_TYPES).all():
            return None
        has_data = ~np.isin(types, _NO_DATA_TYPES)
        following = candidates + 1 + np.where(has_data, (sizes + BLOCK - 1) // BLOCK, 0)
        if (following[:-1] != candidates[1:]).any():
            return None
        end_block = int(following[-1])
        if end_block >= whole or self.buf[end_block * BLOCK : (end_block + 1) * BLOCK] != ZERO_BLOCK:
            return None
        extended = types == PAX_EXTENDED
        if extended[-1] or (extended[:-1] & extended[1:]).any():
            return None
        if (sizes[extended] > BLOCK).any():
            return None
        self.header_offsets = int_array(candidates * BLOCK)
        self._corrupt_headers = [int(at) * BLOCK for at in candidates[corrupt]]
        regular = np.isin(types, _REGULAR_CODES)
        member_rows = np.flatnonzero(regular)
        starts = candidates[member_rows].copy()
        after_pax = member_rows[member_rows > 0]
        chained = extended[after_pax - 1]
        starts[member_rows > 0] = np.where(chained, candidates[after_pax - 1], starts[member_rows > 0])
        row_prefixes = [prefixes.get(int(at)) for at in candidates[member_rows]] if prefixes else None
        names = self._names(name_fields[member_rows], row_prefixes)
        if names is None:
            return None
        # Old V7 tars mark a folder as a plain file whose name ends with a slash.
        folders = {
            i for i in np.flatnonzero(types[member_rows] == AREGTYPE).tolist() if names[i].endswith(b"/")
        }
        if folders:
            keep = [i for i in range(len(names)) if i not in folders]
            names, member_rows, starts = names[keep], member_rows[keep], starts[keep]
        self.end = end_block * BLOCK
        return (
            names,
            int_array(starts * BLOCK),
            int_array((candidates[member_rows] + 1) * BLOCK),
            int_array(sizes[member_rows]),
        )

    def _release(self, start: int, length: int) -> None:
        """Drop a scanned range's pages from this process (they stay in the page cache)."""
        if not isinstance(self.buf, mmap.mmap):
            return
        start -= start % mmap.PAGESIZE
        length = min(length, self.size - start)
        if length > 0:
            self.buf.madvise(mmap.MADV_DONTNEED, start, length)

    @staticmethod
    def _names(name_fields: np.ndarray, prefixes: list[bytes | None] | None) -> np.ndarray | None:
        """Member names from the name fields (and ustar prefixes, per row or None) as a bytes array
        (`Names`); None if one is not clean UTF-8.

        A name ends at its first NUL (as tarfile reads it): what follows in its field is cleared. Only
        the names with a byte above 0x7F are decoded to check them.
        """
        if not len(name_fields):
            return name_fields
        fields = name_fields.view(np.uint8).reshape(len(name_fields), -1)
        after_nul = np.logical_or.accumulate(fields == 0, axis=1)
        fields = np.where(after_nul, np.uint8(0), fields)
        names = fields.view(name_fields.dtype).ravel()
        try:
            not_ascii = np.flatnonzero((fields > 0x7F).any(axis=1))
            if len(not_ascii):
                nul_joined(fields[not_ascii], ~after_nul[not_ascii])
            if prefixes is None:
                return names
            for prefix in prefixes:
                if prefix is not None:
                    prefix.decode("utf-8")
        except UnicodeDecodeError:
            return None
        listed = names.tolist()
        for row, prefix in enumerate(prefixes):
            if prefix is not None:
                listed[row] = prefix + b"/" + listed[row]
        return np.array(listed)

    def _walk(self) -> tuple[list[str], array, array, array]:
        """Walk every header once, slicing only the fields it needs and jumping over member data."""
        buf, size = self.buf, self.size
        header_offsets = self.header_offsets
        names: list[str] = []
        starts, data_offsets, sizes = array("q"), array("q"), array("q")
        global_pax: dict[str, str] = {}
        pos = 0
        chain_start = -1  # first header of an L/K/x chain: where the member "starts" for energon
        long_name: str | None = None
        # In a chain of extended headers the first one wins, as in tarfile: an earlier long name over a
        # later one and over a later PAX path, an earlier PAX record over a later one.
        long_name_first = False
        pax: dict[str, str] | None = None
        released, release_at = 0, RELEASE_STRIDE
        # Headers are copied as they are read and their checksums checked in batches, so the check after
        # the walk does not read them from the shard again.
        checked = bytearray()
        corrupt: list[int] = []
        self._walked = (corrupt, checked)
        while True:
            if len(checked) >= CHECKSUM_BATCH * BLOCK:
                corrupt += _corrupt_offsets(checked, header_offsets)
                checked.clear()
            if pos >= release_at:
                self._release(released, pos - released)
                released, release_at = pos - pos % mmap.PAGESIZE, pos + RELEASE_STRIDE
            if pos + BLOCK > size:
                if pos >= size and chain_start >= 0:  # (an extended header's records may run past the end)
                    raise self._fail(
                        chain_start,
                        "an extended header is followed by the end of the shard instead of a member: it was"
                        " cut short.",
                    )
                if pos == size and pos > 0:
                    # The last member is whole but the end-of-archive marker is missing: GNU tar, tarfile
                    # and energon read such a shard to its end, and so do we (the caller may warn).
                    self.end, self.end_marker = pos, False
                    self._corrupt_headers = corrupt + _corrupt_offsets(checked, header_offsets)
                    return names, starts, data_offsets, sizes
                raise self._fail(pos, self._short_end_problem(pos))
            typeflag = buf[pos + TYPEFLAG]
            if typeflag == 0 and buf[pos] == 0 and buf[pos : pos + BLOCK] == ZERO_BLOCK:
                if chain_start >= 0:
                    raise self._fail(
                        chain_start,
                        "an extended header is followed by the end-of-archive marker instead of a member.",
                    )
                self.end = pos
                self._corrupt_headers = corrupt + _corrupt_offsets(checked, header_offsets)
                return names, starts, data_offsets, sizes
            header = buf[pos : pos + BLOCK]
            checked += header
            header_offsets.append(pos)
            if pos == 0 and not checksum_ok(header):
                raise self._corrupt(0)
            size_field = header[SIZE]
            try:  # 11 digits and a NUL or space, as most writers put them; else 12 digits (bsdtar), base-256
                member_size = int(size_field[:11], 8) if size_field[11] in b"\0 " else number(size_field)
            except ValueError:
                try:
                    member_size = number(size_field)
                except ValueError:
                    raise self._fail(pos, "the header's size field is not a number") from None
            offset_data = pos + BLOCK

            if typeflag in REGULAR_TYPES:
                if long_name is not None:
                    name = long_name
                else:
                    raw_name = header[NAME]
                    nul = raw_name.find(0)
                    if nul >= 0:
                        raw_name = raw_name[:nul]
                    if header[PREFIX_START]:  # ustar prefix (tarfile joins it for every non-GNU type)
                        raw_name = header[PREFIX].split(b"\0", 1)[0] + b"/" + raw_name
                    try:
                        name = raw_name.decode("utf-8")
                    except UnicodeDecodeError:
                        raise self._fail(pos, NOT_UTF8) from None
                if pax is not None or global_pax:
                    name, member_size = self._apply_pax(pos, name, member_size, global_pax, pax)
                    if long_name_first:
                        name = long_name  # type: ignore[assignment]
                next_pos = offset_data + block_ceil(member_size)
                if next_pos > size or member_size < 0:
                    raise self._fail(pos, self._cut_data_problem(name, member_size, next_pos))
                if typeflag != AREGTYPE or not name.endswith("/"):  # V7 folders end with a slash
                    names.append(name)
                    starts.append(chain_start if chain_start >= 0 else pos)
                    data_offsets.append(offset_data)
                    sizes.append(member_size)
                chain_start, long_name, pax, long_name_first = -1, None, None, False
                pos = next_pos
                continue

            if typeflag in EXTENSION_TYPES:
                data_end = offset_data + member_size
                if member_size < 0 or data_end > size:
                    raise self._fail(pos, "an extended header's data runs past the end of the shard")
                if typeflag != PAX_GLOBAL and chain_start < 0:
                    chain_start = pos
                # tarfile (so energon) reads an extended header's whole blocks: a long name up to its
                # first NUL and PAX records up to the first NUL, also where the size field says less
                data = buf[offset_data : min(offset_data + block_ceil(member_size), size)]
                if typeflag == GNU_LONGNAME:
                    try:
                        text = _text(data)
                    except UnicodeDecodeError:
                        raise self._fail(pos, NOT_UTF8) from None
                    if long_name is None:
                        long_name, long_name_first = text, pax is None
                elif typeflag != GNU_LONGLINK and _pax_may_change_index(data):
                    records = self._pax_records(pos, data)
                    if typeflag == PAX_GLOBAL:
                        global_pax.update(records)
                    else:
                        pax = records if pax is None else {**records, **pax}
                pos = offset_data + block_ceil(member_size)
                continue

            if typeflag == GNU_SPARSE:
                raise self._unsupported_sparse(pos)
            # Links, folders, devices: no data follows. Unknown types: tarfile skips their data.
            if pax is not None or global_pax:
                _, member_size = self._apply_pax(pos, "", member_size, global_pax, pax)
            next_pos = offset_data
            if typeflag not in KNOWN_NON_REGULAR:
                next_pos += block_ceil(member_size)
                if next_pos > size or member_size < 0:
                    raise self._fail(pos, "a member's data runs past the end of the shard")
            chain_start, long_name, pax, long_name_first = -1, None, None, False
            pos = next_pos

    def _pax_records(self, pos: int, data: bytes) -> dict[str, str]:
        try:
            records = parse_pax(data)
        except UnicodeDecodeError:
            raise self._fail(pos, NOT_UTF8) from None
        except ValueError as exc:
            raise self._fail(pos, f"the PAX header is malformed ({exc})") from None
        if any(key.startswith("GNU.sparse") for key in records):
            raise self._unsupported_sparse(pos)
        return records

    def _apply_pax(
        self, pos: int, name: str, size: int, global_pax: dict[str, str], pax: dict[str, str] | None
    ) -> tuple[str, int]:
        effective = {**global_pax, **pax} if pax else global_pax
        if "path" in effective:
            name = effective["path"].rstrip("/")
        if "size" in effective:
            try:
                size = int(effective["size"])
            except ValueError:
                raise self._fail(pos, "the PAX size record is not a number") from None
        return name, size

    def _short_end_problem(self, pos: int) -> str:
        left = self.size - pos
        if pos == 0 and left == 0:
            return "is an empty file, not a tar archive."
        return f"the shard ends inside a header ({left} of its {BLOCK} bytes are there): it was cut short."

    @staticmethod
    def _cut_data_problem(name: str, member_size: int, next_pos: int) -> str:
        return (
            f"member {name!r} declares {member_size} bytes of data (ending at byte {next_pos} with padding)"
            " but the shard ends before that: it was cut short inside the member's data."
        )

    def _unsupported_sparse(self, offset: int) -> ShardError:
        return ShardError(
            self.shard,
            "holds a GNU sparse member, whose bytes are not stored contiguously; energon cannot read it.",
            offset=offset,
            advice="Re-create the shard without --sparse.",
        )

    def first_corrupt_header(self) -> int | None:
        """The offset of the first visited header whose checksum is wrong, checked in vectorised batches."""
        if self._corrupt_headers is None and self._walked is not None:  # an error in the middle of the walk
            corrupt, checked = self._walked
            self._corrupt_headers = corrupt + _corrupt_offsets(checked, self.header_offsets)
        if self._corrupt_headers is not None:
            return self._corrupt_headers[0] if self._corrupt_headers else None
        if not self.header_offsets:
            return None
        whole_blocks = self.size // BLOCK
        blocks = np.frombuffer(self.buf, dtype=np.uint8, count=whole_blocks * BLOCK).reshape(
            whole_blocks, BLOCK
        )
        rows_at = np.frombuffer(self.header_offsets, dtype=np.int64) // BLOCK
        # Small batches: each header read maps its neighbourhood too (kernel fault-around).
        for first in range(0, len(rows_at), 1024):
            batch = rows_at[first : first + 1024]
            corrupt = batch[~checksums_match(blocks[batch])]
            self._release(int(batch[0]) * BLOCK, (int(batch[-1]) - int(batch[0]) + 1) * BLOCK)
            if len(corrupt):
                return int(corrupt[0]) * BLOCK
        return None

    def verify_checksums(self) -> None:
        """Raise on the first visited header whose checksum is wrong."""
        corrupt = self.first_corrupt_header()
        if corrupt is not None:
            raise self._corrupt(corrupt)


class RangedBuffer(Protocol):
    """A shard read piece by piece (an object in a bucket, `prep.storage.ranged.RangedObject`): its length,
    a byte by index and bytes by contiguous slice."""

    def __len__(self) -> int: ...

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> bytes: ...


class RangedHeaderWalker(HeaderWalker):
    """`HeaderWalker` over a shard read through ranged reads: the same header-by-header walk, rules and
    errors, without the vectorised scan (which needs the whole shard in memory). Checksums are checked on
    the headers the walk copied, an error's cause among them too."""

    def __init__(self, shard: str, buffer: RangedBuffer) -> None:
        super().__init__(shard, buffer)  # type: ignore[arg-type]

    def scan_table(self) -> tuple[Names, array, array, array]:
        return self._walk()


def first_nonzero(buffer: mmap.mmap | bytes | RangedBuffer, start: int, stop: int) -> int | None:
    """The offset of the first byte of `buffer[start:stop]` that is not zero, or None, read `TAIL_CHUNK`
    bytes at a time.

    >>> first_nonzero(bytes(3000) + b"x", 1024, 3001), first_nonzero(bytes(3000), 0, 3000)
    (3000, None)
    """
    for at in range(start, stop, TAIL_CHUNK):
        found = np.flatnonzero(np.frombuffer(buffer[at : min(at + TAIL_CHUNK, stop)], dtype=np.uint8))
        if found.size:
            return at + int(found[0])
    return None


def repack_command(shard: str) -> str:
    """A GNU tar command that puts the members of archives joined end to end (`cat a.tar b.tar`) into
    one archive, `SHARD.repacked`, keeping their names and order (`-i` reads past end-of-archive markers).

    >>> print(repack_command("my shard.tar").split(" && ")[1])
    tar -xif 'my shard.tar' -C "$d"
    """
    shard = shlex.quote(shard)
    return (
        f'd=$(mktemp -d) && tar -xif {shard} -C "$d" && tar -itf {shard} | tar -cf {shard}.repacked -C "$d"'
        ' --no-recursion --verbatim-files-from -T - && rm -r "$d"'
    )


def _corrupt_offsets(headers: bytearray, header_offsets: array) -> list[int]:
    """Offsets of the last `len(headers) // BLOCK` walked headers whose checksum is wrong."""
    count = len(headers) // BLOCK
    if not count:
        return []
    blocks = np.frombuffer(headers, dtype=np.uint8).reshape(count, BLOCK)
    offsets = header_offsets[len(header_offsets) - count :]
    return [offsets[row] for row in np.flatnonzero(~checksums_match(blocks)).tolist()]


def _pax_may_change_index(records: bytes) -> bool:
    """Whether PAX records may rename or resize a member (then they are parsed; otherwise skipped)."""
    return _PAX_KEYWORDS_THAT_MATTER.search(records) is not None


def _name_fields(headers: np.ndarray) -> np.ndarray:
    """The headers' name fields as a bytes array, as wide as the longest name up to its first NUL (a name
    ends at its first NUL, as tarfile reads it)."""
    nul = headers[:, NAME] == 0
    if not len(headers) or not nul.any(axis=1).all():
        width = NAME.stop
    else:
        width = max(1, int(nul.argmax(axis=1).max()))
    return np.ascontiguousarray(headers[:, :width]).view(f"S{width}").ravel()


def nul_joined(rows: np.ndarray, kept: np.ndarray) -> str:
    """The `kept` bytes of each row of a 2-D uint8 array, each row followed by a NUL, as one string.

    The bytes are decoded as UTF-8 in one piece rather than a bytes object per row; UnicodeDecodeError
    if they are not UTF-8.

    >>> rows = np.frombuffer(b"ab\\0\\0cde\\0", dtype=np.uint8).reshape(2, 4)
    >>> nul_joined(rows, rows != 0)
    'ab\\x00cde\\x00'
    """
    joined = np.zeros((len(rows), rows.shape[1] + 1), dtype=np.uint8)
    joined[:, :-1] = rows
    keep = np.ones(joined.shape, dtype=bool)
    keep[:, :-1] = kept
    return joined[keep].tobytes().decode("utf-8")


def decoded_names(names: Names) -> list[str]:
    """`Names` as a list of str (one decode for a bytes array, whose names are clean UTF-8).

    >>> decoded_names(np.array([b"a.txt", b"", b"caf\\xc3\\xa9.json"]))
    ['a.txt', '', 'café.json']
    """
    if isinstance(names, list):
        return names
    if not len(names):
        return []
    raw = names.view(np.uint8).reshape(len(names), names.dtype.itemsize)
    return nul_joined(raw, raw != 0).split("\0")[:-1]


def int_array(values: np.ndarray) -> array:
    """A numpy integer array as an `array("q")`, without a Python int per value."""
    return array("q", values.astype(np.int64, copy=False).tobytes())


def open_shard(path: str, shard: str) -> mmap.mmap | bytes:
    """Memory-map a shard read-only, with errors that name it (missing, unreadable, a folder, a FIFO or
    device: opened without blocking, so a FIFO named like a shard cannot stop the run)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except PermissionError:
        raise ShardError(
            shard,
            "cannot be read: permission denied.",
            advice="Give the user running prepare read access (e.g. `chmod a+r`), or exclude it with --exclude.",
        ) from None
    except IsADirectoryError:
        raise ShardError(
            shard, "is a folder, not a tar file.", advice="Rename it or exclude it with --exclude."
        ) from None
    except OSError as exc:
        raise ShardError(shard, f"cannot be opened: {exc.strerror}.") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise ShardError(
                shard,
                "is not a regular file (a FIFO, socket or device), so it is not a tar file.",
                advice="Rename it or exclude it with --exclude.",
            )
        if status.st_size == 0:
            return b""
        return mmap.mmap(fd, status.st_size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
