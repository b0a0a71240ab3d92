"""Rename a shard's members in place: put a prefix in front of the name each header holds.

The name lives in fixed header fields: the 100-byte name field, and in a ustar header (magic "ustar" then
NUL, or GNU's "ustar" then a space) also the 155-byte prefix field, the two joined by a slash. Renaming a
member in place means rewriting those fields and the checksum of its one header block, nothing else, so
a shard of any size is renamed by writing 512 bytes per member. This is energon 7.4.1's `TarPatcher`
rule, byte for byte:

- every header is renamed except PAX headers (`x`, `g`), whose data is left as it is;
- a ustar header's new name goes whole into the name field if it fits 100 bytes, else it is cut at the
  last slash within the first 156 bytes into prefix (<= 155) and name (1..100); the prefix field is
  zeroed past what it holds (in a GNU header those bytes are atime/ctime, zero as GNU tar writes them);
- a header without ustar magic (V7) has only the name field: the new name must fit 100 bytes;
- the checksum is the unsigned byte sum (`prep.tar.header`), written as six octal digits, NUL, space.

Some names cannot be changed that way, and `renameable_headers` reports the first such obstacle instead
of renaming: a PAX record that gives the name (`path`, `linkpath` and their GNU/SCHILY forms, which
readers take over the header fields), or a GNU long name or long link (`L`/`K`, whose data holds the
name); `prefixed_blocks` says which new names fit no field. A shard the index scan refuses (cut short, a
corrupt header, a GNU sparse member) is refused here too, as a ShardError.

    >>> from prep.tar.write import HeaderMaker
    >>> from prep.tar.header import checksum_ok
    >>> block = with_checksums([prefixed_block(HeaderMaker().member("0001.txt", 5), b"shard-0.tar/")])[0]
    >>> header_path(block), checksum_ok(block)
    ((b'shard-0.tar/0001.txt', True), True)
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass

import numpy as np

from prep.errors import ShardError
from prep.tar.fields import (
    BLOCK,
    CHECKSUM,
    GNU_LONGLINK,
    GNU_LONGNAME,
    MAGIC,
    NAME,
    PAX_EXTENDED,
    PAX_GLOBAL,
    PREFIX,
    SIZE,
    TYPEFLAG,
    USTAR,
)
from prep.tar.header import USTAR_ENDINGS, header_path, number, octal_fields, parse_pax, unsigned_checksums
from prep.tar.scan import HeaderWalker

#: PAX keywords that name a member (or its link target): readers take them over the header's fields.
PAX_NAME_KEYWORDS = frozenset(
    ("path", "linkpath", "gnu.path", "gnu.linkpath", "SCHILY.path", "SCHILY.linkpath")
)
_NAME_WIDTH, _PREFIX_WIDTH = NAME.stop - NAME.start, PREFIX.stop - PREFIX.start
#: Where a PAX record may name the member (a quick look before the records are parsed).
_PAX_NAME_RECORD = re.compile(rb"(?:^|[\n\0])\d+ (?:gnu\.|SCHILY\.)?(?:path|linkpath)=")
_CANNOT_RENAME = "Re-pack the shard with short names (plain ustar headers), or leave out --fix-duplicates."


@dataclass(frozen=True, slots=True)
class ShardHeaders:
    """A shard's renameable headers, in order (every header but the PAX ones): where each block is, the
    blocks themselves as rows, the names readers see instead of the fields' where a GNU long name or a
    PAX `path` gives one (row -> name), and the first obstacle to renaming in place (None: there is none).
    """

    offsets: np.ndarray
    blocks: np.ndarray
    given_names: dict[int, bytes]
    obstacle: ShardError | None


def header_paths(blocks: np.ndarray) -> np.ndarray:
    """`header_path` of each row of `blocks`, as a bytes array; the usual rows (no prefix field in use)
    read at once."""
    name_length = _field_lengths(blocks[:, NAME])
    usual = ~_is_ustar(blocks) | (blocks[:, PREFIX.start] == 0)
    width = max(int(name_length.max(initial=0)), 1)  # as wide as the longest name, not the field
    names = np.where(np.arange(width) < name_length[:, None], blocks[:, :width], 0)
    paths = np.ascontiguousarray(names).view(f"S{width}").ravel()
    unusual = np.flatnonzero(~usual)
    if len(unusual):
        paths = paths.astype(f"S{_NAME_WIDTH + _PREFIX_WIDTH + 1}")
        for row in unusual.tolist():
            paths[row] = header_path(blocks[row].tobytes())[0]
    return paths


def prefixed_block(block: bytes, prefix: bytes) -> bytes | None:
    """The header `block` with `prefix` put in front of its name, or None if the new name fits no field.

    The checksum field is left as it was: `with_checksums` sets it, for many blocks at once.
    """
    path, ustar = header_path(block)
    path = prefix + path
    if len(path) <= _NAME_WIDTH:
        name, name_prefix = path, b""
    elif not ustar:
        return None
    else:
        cut = path.rfind(b"/", 0, _PREFIX_WIDTH + 1)
        if cut < 0:
            return None
        name_prefix, name = path[:cut], path[cut + 1 :]
        if not name or len(name) > _NAME_WIDTH:
            return None
    head = name + bytes(_NAME_WIDTH - len(name)) + block[NAME.stop : PREFIX.start]
    if not ustar:
        return head + block[PREFIX.start :]
    return head + name_prefix + bytes(_PREFIX_WIDTH - len(name_prefix)) + block[PREFIX.stop :]


def prefixed_blocks(blocks: np.ndarray, prefix: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(`prefixed_block` of each row with its checksum set, whether the row's new name fits).

    Rows whose name is in the name field alone and stays there once prefixed (and whose prefix field, if
    they have one, is all zeros) are renamed at once; the others one by one. Rows that do not fit are
    left as they were.
    """
    renamed = blocks.copy()
    fits = np.ones(len(blocks), dtype=bool)
    width = len(prefix)
    name_length = _field_lengths(blocks[:, NAME])
    ustar = _is_ustar(blocks)
    at_once = (name_length + width <= _NAME_WIDTH) & (~ustar | ~blocks[:, PREFIX].any(axis=1))
    rows = np.flatnonzero(at_once)
    if len(rows):  # none when the prefix alone is wider than the name field (a shard's long path)
        kept = np.arange(_NAME_WIDTH - width) < name_length[rows, None]
        names = np.zeros((len(rows), _NAME_WIDTH), dtype=np.uint8)
        names[:, :width] = np.frombuffer(prefix, dtype=np.uint8)
        names[:, width:] = np.where(kept, blocks[rows, : _NAME_WIDTH - width], 0)
        renamed[rows, NAME] = names
    for row in np.flatnonzero(~at_once).tolist():
        block = prefixed_block(blocks[row].tobytes(), prefix)
        if block is None:
            fits[row] = False
        else:
            renamed[row] = np.frombuffer(block, dtype=np.uint8)
    renamed[:, CHECKSUM] = _checksum_fields(unsigned_checksums(renamed))
    return renamed, fits


def checksum_field(checksum: int) -> bytes:
    """The checksum field as tar writers fill it: six octal digits, a NUL, a space."""
    return b"%06o\0 " % checksum


def with_checksums(blocks: list[bytes]) -> list[bytes]:
    """Each header block with its checksum field set to its unsigned byte sum."""
    if not blocks:
        return []
    rows = np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(len(blocks), BLOCK).copy()
    rows[:, CHECKSUM] = _checksum_fields(unsigned_checksums(rows))
    return [row.tobytes() for row in rows]


def _checksum_fields(checksums: np.ndarray) -> np.ndarray:
    """`checksum_field` of each checksum, as rows of 8 bytes."""
    shifts = np.arange(15, -1, -3)
    fields = np.empty((len(checksums), CHECKSUM.stop - CHECKSUM.start), dtype=np.uint8)
    fields[:, :6] = (checksums[:, None] >> shifts) % 8 + ord("0")
    fields[:, 6], fields[:, 7] = 0, ord(" ")
    return fields


def _field_lengths(fields: np.ndarray) -> np.ndarray:
    """Each row's length up to its first NUL (the whole width if there is none)."""
    nul = fields == 0
    return np.where(nul.any(axis=1), nul.argmax(axis=1), fields.shape[1])


def _is_ustar(blocks: np.ndarray) -> np.ndarray:
    """Whether each row's magic is "ustar" then NUL or a space (a column at a time: no 2-D reduction)."""
    ustar = np.isin(blocks[:, MAGIC.start + len(USTAR)], USTAR_ENDINGS)
    for position, byte in enumerate(USTAR, MAGIC.start):
        ustar &= blocks[:, position] == byte
    return ustar


def renameable_headers(shard: str, buf: mmap.mmap | bytes) -> ShardHeaders:
    """Walk a shard's headers (`prep.tar.scan.HeaderWalker`) and keep those a rename changes.

    ShardError for a shard that is not a whole, readable tar (as the index scan refuses it), a header
    whose checksum is wrong included: a rename rewrites the checksum, so a corrupt header is refused
    rather than made to look whole.
    """
    walker = HeaderWalker(shard, buf)
    names, _, data_offsets, _ = walker.scan()
    walker.verify_checksums()
    offsets = np.frombuffer(walker.header_offsets, dtype=np.int64)
    whole = len(buf) // BLOCK
    all_blocks = np.frombuffer(buf, dtype=np.uint8, count=whole * BLOCK).reshape(whole, BLOCK)[
        offsets // BLOCK
    ]
    types = all_blocks[:, TYPEFLAG]
    extended = np.isin(types, (PAX_EXTENDED, PAX_GLOBAL))
    obstacle = _long_name_obstacle(shard, offsets, types) or _pax_name_obstacle(shard, buf, offsets[extended])
    kept = ~extended
    given: dict[int, bytes] = {}
    if obstacle is not None:  # names the fields do not hold: keys are judged by what readers see
        row_of = {int(offset): row for row, offset in enumerate(offsets[kept].tolist())}
        for name, data_offset in zip(names, data_offsets, strict=True):
            row = row_of.get(data_offset - BLOCK)
            if row is not None:
                given[row] = name.encode()
    return ShardHeaders(offsets[kept].copy(), all_blocks[kept], given, obstacle)


def _long_name_obstacle(shard: str, offsets: np.ndarray, types: np.ndarray) -> ShardError | None:
    found = np.flatnonzero(np.isin(types, (GNU_LONGNAME, GNU_LONGLINK)))
    if not len(found):
        return None
    return ShardError(
        shard,
        "holds a GNU long name or long link there, whose name cannot be changed in its header alone"
        " (energon's --fix-duplicates cannot rename it either).",
        offset=int(offsets[found[0]]),
        advice=_CANNOT_RENAME,
    )


def _pax_name_obstacle(shard: str, buf: mmap.mmap | bytes, offsets: np.ndarray) -> ShardError | None:
    """The first PAX header whose records name the member, or that cannot be read.

    Records of one block (all of webdataset's) are searched at once, each block cut at its size; a PAX
    header whose records may name the member is then parsed alone.
    """
    whole = len(buf) // BLOCK
    blocks = np.frombuffer(buf, dtype=np.uint8, count=whole * BLOCK).reshape(whole, BLOCK)
    sizes, usual = octal_fields(blocks[offsets // BLOCK, SIZE])
    for row in np.flatnonzero(~usual).tolist():  # base-256 and the like
        sizes[row] = number(buf[offsets[row] + SIZE.start : offsets[row] + SIZE.stop])
    one_block = sizes <= BLOCK
    records = blocks[np.minimum(offsets[one_block] // BLOCK + 1, whole - 1)]
    records = np.where(np.arange(BLOCK) < sizes[one_block, None], records, 0)
    hit = _PAX_NAME_RECORD.search(records.tobytes())
    suspects = offsets[one_block][hit.start() // BLOCK :] if hit else offsets[:0]
    for offset in sorted([*suspects.tolist(), *offsets[~one_block].tolist()]):
        size = number(buf[offset + SIZE.start : offset + SIZE.stop])
        data = bytes(buf[offset + BLOCK : offset + BLOCK + size])
        try:
            named = sorted(PAX_NAME_KEYWORDS & parse_pax(data).keys())
        except ValueError as error:  # UnicodeDecodeError included
            problem = f"holds a malformed PAX header there ({error})."
        else:
            if not named:
                continue
            problem = (
                f"a PAX header there names the member ({named[0]}=...), and readers take that name over the"
                " header's name fields, which are all a rename in place can change (energon's"
                " --fix-duplicates cannot rename it either)."
            )
        return ShardError(shard, problem, offset=offset, advice=_CANNOT_RENAME)
    return None


def write_blocks(fd: int, offsets: np.ndarray, blocks: np.ndarray) -> None:
    """Write each row of `blocks` at its offset of the open file `fd` (not synced: the caller fsyncs)."""
    if not len(offsets):
        return
    with mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE) as mapped:
        whole = len(mapped) // BLOCK
        rows = np.frombuffer(mapped, dtype=np.uint8, count=whole * BLOCK).reshape(whole, BLOCK)
        rows[offsets // BLOCK] = blocks
        del rows
        mapped.flush()
