"""The tar format's layout as data: the block size, where each header field lies, the type flags.

A tar archive is a sequence of 512-byte blocks: each member is one header block (ustar, POSIX 1988)
followed by its data padded to whole blocks, and two zero blocks end the archive. This module is the
only place that knows those offsets and flags; the scanner, the checker and the writer all read them here.

>>> block_ceil(0), block_ceil(1), block_ceil(512), member_bytes(300)
(0, 512, 512, 1024)
"""

from __future__ import annotations

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
#: Two zero blocks end an archive.
END_OF_ARCHIVE = bytes(2 * BLOCK)

# The ustar header fields (octal numbers are ASCII digits ending in NUL or space).
NAME = slice(0, 100)
MODE = slice(100, 108)
UID = slice(108, 116)
GID = slice(116, 124)
SIZE = slice(124, 136)
MTIME = slice(136, 148)
CHECKSUM = slice(148, 156)
TYPEFLAG = 156
LINKNAME = slice(157, 257)
#: "ustar" then NUL (POSIX) or a space (old GNU), then the two-byte version.
MAGIC = slice(257, 263)
USTAR = b"ustar"
PREFIX = slice(345, 500)
#: The first byte of the prefix field: non-zero when a ustar name is split into prefix and name.
PREFIX_START = PREFIX.start

#: The widest value of a 12-byte octal field (11 digits); larger sizes need a PAX `size` record.
MAX_OCTAL_SIZE = 8**11 - 1

# Type flags, as the integer values of the header's typeflag byte (tarfile's names).
REGTYPE, AREGTYPE, CONTTYPE = ord("0"), 0, ord("7")
#: Plain files: the members that carry sample parts.
REGULAR_TYPES = frozenset((REGTYPE, AREGTYPE, CONTTYPE))
#: Links, devices, folders, fifos: no data follows their header.
KNOWN_NON_REGULAR = frozenset(b"123456")
GNU_LONGNAME, GNU_LONGLINK, GNU_SPARSE = ord("L"), ord("K"), ord("S")
PAX_EXTENDED, PAX_GLOBAL, SOLARIS_EXTENDED = ord("x"), ord("g"), ord("X")
#: Headers whose data describes the next member (or all of them, `g`) rather than being one.
EXTENSION_TYPES = frozenset((GNU_LONGNAME, GNU_LONGLINK, PAX_EXTENDED, PAX_GLOBAL, SOLARIS_EXTENDED))


def block_ceil(size: int) -> int:
    """`size` bytes of member data rounded up to whole blocks: what the data takes in the archive."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def member_bytes(size: int) -> int:
    """Archive bytes of a member of `size` bytes with a plain ustar header: the header and padded data."""
    return BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
