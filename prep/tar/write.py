"""Make tar member headers fast: a plain ustar header where it suffices, PAX records where it does not.

    >>> from prep.tar.header import number
    >>> header = HeaderMaker(mtime=0).member("0001.txt", 5)
    >>> len(header), header[:8], number(header[SIZE])
    (512, b'0001.txt', 5)

A member gets one 512-byte ustar header (GNU tar and Python's `tarfile` read it); a PAX header goes in
front only when the name or size needs one (non-ASCII or over-long names, sizes of 8 GiB and more). The
header is a precomputed template whose checksum is adjusted for each name and size, so making one costs
a join, not a sum over 512 bytes.
"""

from __future__ import annotations

from prep.tar.fields import (
    BLOCK,
    CHECKSUM,
    GID,
    MAGIC,
    MAX_OCTAL_SIZE,
    MODE,
    MTIME,
    NAME,
    PREFIX,
    SIZE,
    TYPEFLAG,
    UID,
    ZERO_BLOCK,
)

_NAME_WIDTH, _PREFIX_WIDTH = NAME.stop - NAME.start, PREFIX.stop - PREFIX.start
#: The name of the PAX header block that precedes a member (what tarfile writes).
PAX_HEADER_NAME = b"././@PaxHeader"


def _template(mtime: int) -> bytes:
    """A regular-file ustar header with empty name and size and the checksum field as spaces."""
    block = bytearray(BLOCK)
    block[MODE] = b"0000644\0"
    block[UID] = b"0000000\0"
    block[GID] = b"0000000\0"
    block[SIZE] = b"00000000000\0"
    block[MTIME] = b"%011o\0" % mtime
    block[CHECKSUM] = b" " * 8
    block[TYPEFLAG] = ord("0")
    block[MAGIC.start : MAGIC.start + 8] = b"ustar\x0000"
    return bytes(block)


class HeaderMaker:
    """Builds member headers: a template whose checksum is adjusted per name, size and type."""

    def __init__(self, mtime: int = 0) -> None:
        template = _template(mtime)
        self.base_checksum = sum(template) - sum(template[SIZE])
        self._modes = template[MODE.start : SIZE.start]
        self._mtime = template[MTIME]
        self._middle = template[TYPEFLAG + 1 : PREFIX.start]
        self._tail = template[PREFIX.stop :]

    def ustar(self, name: bytes, size: int, prefix: bytes = b"", typeflag: bytes = b"0") -> bytes:
        """One header block; `name` fits 100 bytes, `prefix` 155, `size` an octal field."""
        size_field = b"%011o\0" % size
        checksum = self.base_checksum + sum(name) + sum(size_field) + sum(prefix) + typeflag[0] - 48
        return b"".join((
            name, bytes(_NAME_WIDTH - len(name)), self._modes, size_field, self._mtime,
            b"%06o\0 " % checksum, typeflag, self._middle, prefix, bytes(_PREFIX_WIDTH - len(prefix)),
            self._tail,
        ))  # fmt: skip

    def member(self, name: str, size: int) -> bytes:
        """Every header block of one member: a plain ustar header, or PAX + ustar when the name or size
        needs it."""
        raw = name.encode("utf-8")
        if _plain(raw, size):
            return self.ustar(raw, size)
        return self._extended(name, raw, size)

    def _extended(self, name: str, raw: bytes, size: int) -> bytes:
        records: list[tuple[str, str]] = []
        field_size = size
        if size > MAX_OCTAL_SIZE:
            records.append(("size", str(size)))
            field_size = 0
        if raw.isascii() and len(raw) <= _NAME_WIDTH:
            return self._pax(records, raw, b"", field_size)
        if raw.isascii():
            halves = _prefix_and_name(raw)
            if halves is not None:
                return self._pax(records, halves[1], halves[0], field_size)
        records.append(("path", name))
        short = raw[:_NAME_WIDTH].decode("ascii", "replace").encode("ascii", "replace")
        return self._pax(records, short, b"", field_size)

    def _pax(self, records: list[tuple[str, str]], name: bytes, prefix: bytes, field_size: int) -> bytes:
        header = self.ustar(name, field_size, prefix)
        if not records:
            return header
        data = b"".join(pax_record(key, value) for key, value in records)
        pax = self.ustar(PAX_HEADER_NAME, len(data), typeflag=b"x")
        return pax + data + ZERO_BLOCK[: -len(data) % BLOCK] + header


def _plain(name: str | bytes, size: int) -> bool:
    """Whether a member of this name (text, or its UTF-8 bytes) and size takes one plain ustar header
    block. (An ASCII name's length is that of its bytes, so the text need not be encoded.)"""
    return name.isascii() and len(name) <= _NAME_WIDTH and size <= MAX_OCTAL_SIZE


_SIZER = HeaderMaker()


def header_bytes(name: str, size: int) -> int:
    """Bytes of the header blocks `HeaderMaker.member` makes for a member (a PAX header included).

    >>> header_bytes("0001.txt", 5), header_bytes("k" * 200 + ".txt", 5)
    (512, 1536)
    """
    return BLOCK if _plain(name, size) else len(_SIZER.member(name, size))


def _prefix_and_name(raw: bytes) -> tuple[bytes, bytes] | None:
    """Split a long ASCII path at a slash into ustar's prefix (<= 155) and name (<= 100) fields."""
    if len(raw) > _NAME_WIDTH + _PREFIX_WIDTH + 1:
        return None
    slash = raw.find(b"/", max(0, len(raw) - _NAME_WIDTH - 1))
    while 0 < slash <= _PREFIX_WIDTH:
        if len(raw) - slash - 1 <= _NAME_WIDTH:
            return raw[:slash], raw[slash + 1 :]
        slash = raw.find(b"/", slash + 1)
    return None


def pax_record(key: str, value: str) -> bytes:
    """`"LEN key=value\\n"` where LEN counts the whole record, its own digits included.

    >>> pax_record("path", "dir/a.jpg")
    b'18 path=dir/a.jpg\\n'
    """
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body
