"""The Linux FUSE protocol (`<linux/fuse.h>`, version 7.38) as data: opcodes, flags and struct layouts.

A FUSE filesystem is a process that reads requests from `/dev/fuse` and writes replies to it. Every
request starts with a 40-byte `fuse_in_header`, every reply with a 16-byte `fuse_out_header`; the
rest is one of the fixed little structs below. Only what a read-only filesystem needs is here, and
nothing in this module does any I/O, so the byte layouts can be checked on their own.
"""

from __future__ import annotations

import struct
from enum import IntEnum

KERNEL_MAJOR = 7
KERNEL_MINOR = 38
#: The oldest protocol whose request and reply layouts (entries, attributes) are the ones below.
MIN_KERNEL_MINOR = 12


class Opcode(IntEnum):
    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    DESTROY = 38
    IOCTL = 39
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    TMPFILE = 51


#: Requests the kernel sends without waiting for (and must not get) a reply.
NO_REPLY = frozenset({Opcode.FORGET, Opcode.BATCH_FORGET, Opcode.INTERRUPT})
#: Requests that would change the filesystem; a read-only mount refuses them with EROFS.
WRITES = frozenset(
    {
        Opcode.SETATTR,
        Opcode.SYMLINK,
        Opcode.MKNOD,
        Opcode.MKDIR,
        Opcode.UNLINK,
        Opcode.RMDIR,
        Opcode.RENAME,
        Opcode.LINK,
        Opcode.WRITE,
        Opcode.SETXATTR,
        Opcode.REMOVEXATTR,
        Opcode.CREATE,
        Opcode.FALLOCATE,
        Opcode.RENAME2,
        Opcode.COPY_FILE_RANGE,
        Opcode.TMPFILE,
    }
)

# fuse_init_in.flags / fuse_init_out.flags
ASYNC_READ = 1 << 0
DO_READDIRPLUS = 1 << 13
PARALLEL_DIROPS = 1 << 18
MAX_PAGES = 1 << 22


IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, pad
IN_HEADER_START = struct.Struct("<IIQQ")  # the part of it a read-only filesystem needs
OUT_HEADER = struct.Struct("<IiQ")  # len, error (negative errno), unique
INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags (flags2 follows from 7.36)
INIT_OUT = struct.Struct("<IIIIHHIIHHI7I")  # ... max_background, congestion, max_write, time_gran, max_pages
INIT_OUT_COMPAT_22 = 24  # the INIT reply's size for kernels before 7.23: up to max_write
READ_IN = struct.Struct("<QQII")  # fh, offset, size, read_flags (lock_owner, flags follow)
OPEN_OUT = struct.Struct("<QII")  # fh, open_flags, padding
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks atime mtime ctime *nsec mode nlink uid gid ...
ENTRY_OUT_HEAD = struct.Struct("<QQQQII")  # nodeid, generation, entry_valid, attr_valid, and their nsec
ATTR_OUT_HEAD = struct.Struct("<QII")  # attr_valid, attr_valid_nsec, dummy
DIRENT_HEAD = struct.Struct("<QQII")  # ino, off (the cookie to resume after this entry), namelen, type
KSTATFS = struct.Struct("<QQQQQIIII6I")

ENTRY_OUT_SIZE = ENTRY_OUT_HEAD.size + ATTR.size  # 128
#: The longest name every kernel takes in a listing (FUSE_NAME_MAX; newer kernels take longer ones): a
#: longer entry fails the whole listing with EIO.
NAME_MAX = 1024
DT_DIR = 4
DT_REG = 8
S_IFDIR = 0o040000
S_IFREG = 0o100000


_PAD = [bytes(n) for n in range(8)]


def dirent_size(name_length: int, plus: bool) -> int:
    """Bytes one entry takes in a READDIR (or READDIRPLUS) reply: padded to a multiple of 8.

    >>> dirent_size(5, False), dirent_size(8, False), dirent_size(5, True)
    (32, 32, 160)
    """
    size = DIRENT_HEAD.size + name_length
    return ((size + 7) & ~7) + (ENTRY_OUT_SIZE if plus else 0)


class NodePacker:
    """Packs attributes, lookup entries and listing entries of read-only nodes that share an owner,
    one timestamp and one cache lifetime: a folder is mode 0555, a file 0444.

    >>> packer = NodePacker(uid=0, gid=0, time_s=0, time_ns=0, valid_s=60)
    >>> len(packer.attr(1, True, 0)), len(packer.entry(5, False, 10)), len(packer.dirent(5, 4, b"a.txt", False))
    (88, 128, 32)
    >>> packer.direntplus(5, 4, b"a.txt", False, 10) == packer.entry(5, False, 10) + packer.dirent(5, 4, b"a.txt", False)
    True
    """

    _ENTRY = struct.Struct("<" + ENTRY_OUT_HEAD.format[1:] + ATTR.format[1:])
    _DIRENTPLUS = struct.Struct("<" + ENTRY_OUT_HEAD.format[1:] + ATTR.format[1:] + DIRENT_HEAD.format[1:])

    _DOTS = struct.Struct("<" + 2 * (DIRENT_HEAD.format[1:] + "8s"))  # each name padded to 8 bytes
    _DOTS_PLUS = struct.Struct("<" + 2 * (f"{ENTRY_OUT_SIZE}x" + DIRENT_HEAD.format[1:] + "8s"))

    def __init__(self, uid: int, gid: int, time_s: int, time_ns: int, valid_s: int) -> None:
        self.valid_s = valid_s
        self._times = (time_s, time_s, time_s, time_ns, time_ns, time_ns)
        self._folder = (S_IFDIR | 0o555, 2, uid, gid, 0, 4096, 0)
        self._file = (S_IFREG | 0o444, 1, uid, gid, 0, 4096, 0)

    def _attr_fields(self, nodeid: int, is_dir: bool, size: int) -> tuple[int, ...]:
        """The values of a `fuse_attr`, in order: what `attr`, `entry` and `direntplus` pack."""
        return (nodeid, size, (size + 511) >> 9, *self._times, *(self._folder if is_dir else self._file))

    def attr(self, nodeid: int, is_dir: bool, size: int) -> bytes:
        """A `fuse_attr`."""
        return ATTR.pack(*self._attr_fields(nodeid, is_dir, size))

    def entry(self, nodeid: int, is_dir: bool, size: int) -> bytes:
        """A `fuse_entry_out`: the name and its attributes may be cached for `valid_s` seconds."""
        valid = self.valid_s
        return self._ENTRY.pack(nodeid, 0, valid, valid, 0, 0, *self._attr_fields(nodeid, is_dir, size))

    def negative_entry(self) -> bytes:
        """A `fuse_entry_out` saying the name does not exist, which the kernel may remember as long."""
        return ENTRY_OUT_HEAD.pack(0, 0, self.valid_s, 0, 0, 0) + bytes(ATTR.size)

    def attr_out(self, nodeid: int, is_dir: bool, size: int) -> bytes:
        """A `fuse_attr_out`, the GETATTR reply."""
        return ATTR_OUT_HEAD.pack(self.valid_s, 0, 0) + self.attr(nodeid, is_dir, size)

    def dirent(self, nodeid: int, cookie: int, name: bytes, is_dir: bool) -> bytes:
        """A READDIR entry; `cookie` is where a listing resumes after it."""
        head = DIRENT_HEAD.pack(nodeid, cookie, len(name), DT_DIR if is_dir else DT_REG)
        return head + name + _PAD[-(len(head) + len(name)) % 8]

    def direntplus(self, nodeid: int, cookie: int, name: bytes, is_dir: bool, size: int) -> bytes:
        """A READDIRPLUS entry: the lookup entry and the listing entry in one, packed in one call."""
        valid = self.valid_s
        head = self._DIRENTPLUS.pack(
            nodeid, 0, valid, valid, 0, 0, *self._attr_fields(nodeid, is_dir, size),
            nodeid, cookie, len(name), DT_DIR if is_dir else DT_REG,
        )  # fmt: skip
        return head + name + _PAD[-(DIRENT_HEAD.size + len(name)) % 8]

    def dots(self, nodeid: int, plus: bool) -> bytes:
        """The `.` and `..` entries that start every listing (cookies 1 and 2), packed in one call; in a
        READDIRPLUS reply each carries a zero lookup entry, which tells the kernel to make no entry of it.
        Both take the same room, so the second alone is the back half.

        >>> packer = NodePacker(uid=0, gid=0, time_s=0, time_ns=0, valid_s=60)
        >>> packer.dots(7, False) == packer.dirent(7, 1, b".", True) + packer.dirent(7, 2, b"..", True)
        True
        >>> len(packer.dots(7, True))
        320
        """
        return (self._DOTS_PLUS if plus else self._DOTS).pack(
            nodeid, 1, 1, DT_DIR, b".", nodeid, 2, 2, DT_DIR, b".."
        )


def pack_init_reply(kernel_flags: int, max_pages: int, kernel_minor: int = KERNEL_MINOR) -> bytes:
    """The INIT reply to a kernel speaking 7.`kernel_minor`: the lower of its version and ours, the features
    we take from those it offers, in the reply size its version expects (24 bytes before 7.23, whose
    fields end at max_write; the whole struct after; `max_pages` means something only from 7.28).

    >>> [len(pack_init_reply(0, 256, minor)) for minor in (22, 23, 38, 45)]
    [24, 64, 64, 64]
    """
    if kernel_minor < MIN_KERNEL_MINOR:
        raise ValueError(
            f"the kernel speaks FUSE 7.{kernel_minor}; the mount needs 7.{MIN_KERNEL_MINOR} or newer"
        )
    minor = min(kernel_minor, KERNEL_MINOR)
    wanted = ASYNC_READ | DO_READDIRPLUS | PARALLEL_DIROPS | MAX_PAGES
    flags = kernel_flags & wanted
    pages = max_pages if minor >= 28 else 0
    reply = INIT_OUT.pack(KERNEL_MAJOR, minor, 1 << 20, flags, 64, 48, 4096, 1, pages, 0, 0, *([0] * 7))
    return reply[:INIT_OUT_COMPAT_22] if minor < 23 else reply


def pack_statfs(blocks: int, files: int) -> bytes:
    """A `fuse_kstatfs` for a full, read-only filesystem of `blocks` 512-byte blocks, whose names are
    listed up to NAME_MAX bytes."""
    return KSTATFS.pack(blocks, 0, 0, files, 0, 512, NAME_MAX, 512, 0, *([0] * 6))
