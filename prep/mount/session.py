"""A FUSE session spoken directly over `/dev/fuse`: answer the kernel's requests until unmounted.

One thread reads the requests and answers them: with Python's lock on the interpreter, more threads
would not answer faster, and a request handed between threads costs more than most requests take.
The one thing that can wait long is reading a part from the disk, so a read is first tried from the
page cache only, and one that would wait goes to a small pool of threads that may. A request costs
one `readv` and one `write` plus the filesystem's own work: there is no C library in between, so no
per-call marshalling; a small file is read as soon as it is looked up, so its READ is answered from
memory. The features that save round trips are switched on at INIT — listings with attributes
(READDIRPLUS), so a name listed once needs no lookup; no OPEN, OPENDIR, FLUSH or xattr requests at
all, since the kernel stops sending those once they are answered ENOSYS; and long cache lifetimes,
since a mounted dataset never changes.

The session answers from a `Tree` (`prep.mount.nodes`), whatever it shows; mounting and unmounting the
device is `prep.mount.device`'s. A request that raises is answered, never left waiting: "no such file"
or "not a folder" where that is what the tree said, else an I/O error, which is told in the session's
messages with the request, its path and the exception (`prep.mount.failures`) unless the tree told it.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prep.mount import wire
from prep.mount.failures import FailedRequests
from prep.mount.messages import STDERR, Messages
from prep.mount.nodes import AlreadyToldError, Tree

#: The data never changes under a mount, so the kernel may keep names and attributes this long.
CACHE_SECONDS = 3600
MAX_PAGES = 256  # reads of up to 1 MiB per request
READ_BUFFER = 1 << 17  # more than any request a read-only filesystem accepts (names, xattr values)
SLOW_READ_THREADS = 4
PREFETCH_BYTES = 64 * 1024  # files up to this size are read when looked up
PREFETCHED_FILES = 32  # a file is read soon after its lookup; few slots stay in the CPU's cache


_OUT_HEADER_PACK, _OUT_HEADER_SIZE = wire.OUT_HEADER.pack, wire.OUT_HEADER.size  # once per request


def _opcode_name(opcode: int) -> str:
    try:
        return wire.Opcode(opcode).name
    except ValueError:
        return str(opcode)


@dataclass(frozen=True, slots=True)
class Owner:
    """The attributes every node shares: owner and one timestamp (the index's)."""

    uid: int
    gid: int
    time_s: int
    time_ns: int


class FuseSession:
    """Serves one Tree on an open FUSE device until the filesystem is unmounted."""

    def __init__(
        self, device: int, tree: Tree, owner: Owner, trace: bool = False, messages: Messages = STDERR
    ) -> None:
        self.device = device
        self.trace = trace  # each request on stderr (--debug, in the foreground)
        self.messages = messages
        self.failures = FailedRequests(messages.say)
        self.tree = tree
        self.packer = wire.NodePacker(owner.uid, owner.gid, owner.time_s, owner.time_ns, CACHE_SECONDS)
        self.initialised = threading.Event()
        self.finished = threading.Event()
        # Small files read at lookup, each into one of a fixed set of slots reused in turn, and the
        # buffer other reads are answered from: allocating and freeing a buffer per file costs more
        # than reading it (fresh memory must be faulted in and zeroed). node -> (slot, bytes).
        self._slots = memoryview(bytearray(PREFETCH_BYTES * PREFETCHED_FILES))
        self._slot_node = [0] * PREFETCHED_FILES
        self._next_slot = 0
        self._prefetched: dict[int, tuple[int, memoryview]] = {}
        self._read_buffer = memoryview(bytearray(MAX_PAGES * 4096))
        self._usage: tuple[int, int] | None = None
        self._slow_reads = ThreadPoolExecutor(SLOW_READ_THREADS, thread_name_prefix="fuse-read")
        self._handlers: dict[int, Callable[[int, int, memoryview], None]] = {
            wire.Opcode.INIT: self._init,
            wire.Opcode.LOOKUP: self._lookup,
            wire.Opcode.GETATTR: self._getattr,
            wire.Opcode.READ: self._read,
            wire.Opcode.READDIRPLUS: self._readdir_plus,
            wire.Opcode.READDIR: self._readdir,
            wire.Opcode.RELEASE: self._empty_reply,
            wire.Opcode.RELEASEDIR: self._empty_reply,
            wire.Opcode.STATFS: self._statfs,
            wire.Opcode.DESTROY: self._destroy,
        }
        # Answered ENOSYS once, these are never sent again: opens need no handle, closes no flush.
        for opcode in (wire.Opcode.OPEN, wire.Opcode.OPENDIR, wire.Opcode.FLUSH, wire.Opcode.GETXATTR):
            self._handlers[opcode] = self._not_implemented
        self._handlers[wire.Opcode.IOCTL] = self._no_ioctl
        for opcode in wire.WRITES:
            self._handlers[opcode] = self._read_only

    # -- the loop ------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start serving in a thread; `finished` is set once the filesystem is unmounted."""
        threading.Thread(target=self._serve, name="fuse", daemon=True).start()

    def _serve(self) -> None:
        buffer = bytearray(READ_BUFFER)
        view = memoryview(buffer)
        handlers = self._handlers
        request_head = wire.IN_HEADER_START.unpack_from
        try:
            while True:
                try:
                    length = os.readv(self.device, [buffer])
                except InterruptedError:
                    continue
                except OSError as error:
                    if error.errno == errno.ENOENT:  # the request was interrupted before we took it
                        continue
                    return  # ENODEV: unmounted
                if length == 0:  # the device's other end is gone (a socket in the protocol tests)
                    return
                if length < wire.IN_HEADER.size:
                    continue
                _, opcode, unique, nodeid = request_head(buffer)
                if self.trace:
                    print(f"fuse: {_opcode_name(opcode)} node {nodeid}", file=sys.stderr, flush=True)
                if opcode in wire.NO_REPLY:
                    continue
                handler = handlers.get(opcode, self._not_implemented)
                try:
                    handler(unique, nodeid, view[wire.IN_HEADER.size : length])
                except FileNotFoundError:
                    self._error(unique, errno.ENOENT)
                except NotADirectoryError:
                    self._error(unique, errno.ENOTDIR)
                except AlreadyToldError:
                    self._error(unique, errno.EIO)
                except OSError as error:  # a shard that cannot be read: the caller sees an I/O error
                    if error.errno in (errno.ENODEV, errno.EBADF):  # the device is gone: unmounted
                        return
                    self._failed(unique, opcode, nodeid, view[wire.IN_HEADER.size : length], error)
                except Exception as error:  # noqa: BLE001 - one bad request must not stop the mount
                    self._failed(unique, opcode, nodeid, view[wire.IN_HEADER.size : length], error)
        finally:
            self._slow_reads.shutdown(wait=True)
            self.failures.close()
            self.finished.set()

    # -- replies -------------------------------------------------------------------------------------
    def _reply(self, unique: int, body: bytes | memoryview = b"") -> None:
        try:
            os.writev(self.device, (_OUT_HEADER_PACK(_OUT_HEADER_SIZE + len(body), 0, unique), body))
        except FileNotFoundError:  # the caller gave up (interrupted) before the answer came
            pass

    def _error(self, unique: int, code: int) -> None:
        try:
            os.write(self.device, wire.OUT_HEADER.pack(wire.OUT_HEADER.size, -code, unique))
        except FileNotFoundError:
            pass

    def _failed(self, unique: int, opcode: int, nodeid: int, body: memoryview, error: BaseException) -> None:
        """Answer EIO to a request that raised `error`, and tell the user (`FailedRequests`)."""
        self._error(unique, errno.EIO)
        self.failures.failed(_opcode_name(opcode), lambda: self._asked_for(opcode, nodeid, body), error)

    def _asked_for(self, opcode: int, nodeid: int, body: memoryview) -> str:
        """What a request asked for, for a message: the path it names, and for a read the range."""
        if opcode == wire.Opcode.LOOKUP:
            return f"{self._path(nodeid).rstrip('/')}/{str(body[:-1], 'utf-8', 'replace')}"
        if opcode == wire.Opcode.READ:
            _, offset, size, _ = wire.READ_IN.unpack_from(body)
            return self._range(nodeid, offset, size)
        return self._path(nodeid)

    def _range(self, nodeid: int, offset: int, size: int) -> str:
        return f"{self._path(nodeid)} ({size} bytes at {offset})"

    def _path(self, nodeid: int) -> str:
        """Where a node is under the mount; its id if the tree cannot tell."""
        try:
            path = self.tree.path(nodeid)
        except Exception:  # noqa: BLE001 - the tree may be what failed
            path = None
        return f"node {nodeid}" if path is None else path

    # -- requests ------------------------------------------------------------------------------------
    def _init(self, unique: int, nodeid: int, body: memoryview) -> None:
        major, minor, _, flags = wire.INIT_IN.unpack_from(body)
        try:
            if major != wire.KERNEL_MAJOR:
                raise ValueError(
                    f"the kernel speaks FUSE {major}.{minor}; the mount speaks {wire.KERNEL_MAJOR}.x"
                )
            reply = wire.pack_init_reply(flags, MAX_PAGES, minor)
        except ValueError as error:
            self.messages.say(str(error))
            self._error(unique, errno.EPROTO)
            return
        self._reply(unique, reply)
        self.initialised.set()

    def _lookup(self, unique: int, nodeid: int, body: memoryview) -> None:
        try:
            name = str(body[:-1], "utf-8")  # the name ends with one NUL
        except UnicodeDecodeError:  # no key or part name in an index is anything but UTF-8
            node = None
        else:
            node = self.tree.lookup(nodeid, name)
        if node is None:  # a negative entry: the kernel remembers the name is absent
            self._reply(unique, self.packer.negative_entry())
            return
        self._reply(unique, self.packer.entry(node.id, node.is_dir, node.size))
        if not node.is_dir and node.size <= PREFETCH_BYTES:
            self._prefetch(node.id, node.size)

    def _prefetch(self, nodeid: int, size: int) -> None:
        """Read a small file that was just looked up, while the kernel finishes the lookup and the
        caller opens it, so its READ is answered at once. Only from the page cache."""
        slot = self._next_slot
        self._next_slot = (slot + 1) % PREFETCHED_FILES
        previous = self._prefetched.get(self._slot_node[slot])
        if previous is not None and previous[0] == slot:  # the slot's last file is forgotten
            del self._prefetched[self._slot_node[slot]]
        self._slot_node[slot] = 0
        start = slot * PREFETCH_BYTES
        try:
            data = self.tree.read_cached(nodeid, 0, self._slots[start : start + size])
        except OSError:
            return
        self._slot_node[slot] = nodeid
        self._prefetched[nodeid] = (slot, data)

    def _getattr(self, unique: int, nodeid: int, body: memoryview) -> None:
        node = self.tree.node(nodeid)
        if node is None:
            raise FileNotFoundError(nodeid)
        self._reply(unique, self.packer.attr_out(node.id, node.is_dir, node.size))

    def _read(self, unique: int, nodeid: int, body: memoryview) -> None:
        _, offset, size, _ = wire.READ_IN.unpack_from(body)
        prefetched = self._prefetched.get(nodeid)
        if prefetched is not None:
            self._reply(unique, prefetched[1][offset : offset + size])
            return
        try:  # the reply is written before the next request is read, so one buffer serves every read
            buffer = (
                self._read_buffer[:size] if size <= len(self._read_buffer) else memoryview(bytearray(size))
            )
            data = self.tree.read_cached(nodeid, offset, buffer)
        except BlockingIOError:
            self._slow_reads.submit(self._read_waiting, unique, nodeid, offset, size)
            return
        self._reply(unique, data)

    def _read_waiting(self, unique: int, nodeid: int, offset: int, size: int) -> None:
        """A read in a pool thread: answered whatever happens (a request never answered hangs its
        reader), as the serving loop answers what it handles itself."""
        try:
            data = self.tree.read(nodeid, offset, size)
        except FileNotFoundError:
            self._error(unique, errno.ENOENT)
        except AlreadyToldError:
            self._error(unique, errno.EIO)
        except Exception as error:  # noqa: BLE001 - e.g. the index gone: an I/O error for this read
            self._error(unique, errno.EIO)
            self.failures.failed(wire.Opcode.READ.name, lambda: self._range(nodeid, offset, size), error)
        else:
            self._reply(unique, data)

    def _readdir(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._list(unique, nodeid, body, plus=False)

    def _readdir_plus(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._list(unique, nodeid, body, plus=True)

    def _list(self, unique: int, nodeid: int, body: memoryview, plus: bool) -> None:
        _, after, size, _ = wire.READ_IN.unpack_from(body)
        packer = self.packer
        pieces: list[bytes] = []
        room = size
        if after < 2:  # `.` and `..` first, as a real folder lists them
            dots = packer.dots(nodeid, plus)
            pieces.append(dots if after == 0 else dots[len(dots) // 2 :])
            room -= len(pieces[-1])
        # Each entry takes at least a header and a padded short name, so this many rows can be enough.
        limit = max(1, room // wire.dirent_size(8, plus))
        done = False
        while not done:
            listing = self.tree.list_dir(nodeid, after, limit)
            is_dir = listing.is_dir
            for shown, node, node_size, cookie in listing.entries:
                name = shown.encode("utf-8", "surrogateescape")
                if len(name) > wire.NAME_MAX:  # left out, so the kernel takes the rest of the listing
                    after = cookie
                    continue
                if plus:
                    piece = packer.direntplus(node, cookie, name, is_dir, node_size)
                else:
                    piece = packer.dirent(node, cookie, name, is_dir)
                if len(piece) > room:
                    done = True
                    break
                pieces.append(piece)
                room -= len(piece)
            # An empty reply ends the listing: a page of names left out is followed by the next page.
            done = done or bool(pieces) or not listing.entries
        self._reply(unique, b"".join(pieces))

    def _statfs(self, unique: int, nodeid: int, body: memoryview) -> None:
        if self._usage is None:  # one scan of the parts table, on the first `df`
            self._usage = self.tree.usage()
        total_bytes, parts = self._usage
        self._reply(unique, wire.pack_statfs((total_bytes + 511) // 512, parts))

    def _destroy(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._reply(unique)

    def _empty_reply(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._reply(unique)

    def _not_implemented(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._error(unique, errno.ENOSYS)

    def _no_ioctl(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._error(unique, errno.ENOTTY)  # what isatty() and friends expect of a plain file

    def _read_only(self, unique: int, nodeid: int, body: memoryview) -> None:
        self._error(unique, errno.EROFS)
