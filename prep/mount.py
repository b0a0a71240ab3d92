"""A read-only FUSE filesystem over a prepared dataset (mfusepy on libfuse 3).

The filesystem is a thin shell over `MountTree` (which path is what) and `PreparedDataset.read_part`
(one `pread` of exactly the requested range): opening a 1 GB part costs one sqlite lookup, and reading
it streams from the shard without holding it in memory. libfuse runs it multi-threaded; sqlite
connections are per thread and shard descriptors are shared, since `pread` keeps no file position.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator

from prep.dataset_reader import PartLocation
from prep.errors import PrepError
from prep.mount_tree import MountTree

FUSE_INSTALL_HINT = (
    "On Debian/Ubuntu install it with `apt-get install fuse3` and `pip install mfusepy`; in a container"
    " also start it with `--device /dev/fuse --cap-add SYS_ADMIN`."
)
#: The data never changes under a mount, so the kernel may cache names and attributes for a long time.
CACHE_SECONDS = 3600


def fuse_problem() -> str | None:
    """Why this machine cannot mount a FUSE filesystem, or None if it can."""
    if not sys.platform.startswith("linux"):
        return f"shardprep mount needs Linux with FUSE 3; this is {sys.platform}."
    if not os.path.exists("/dev/fuse"):
        return f"there is no /dev/fuse, so FUSE filesystems cannot be mounted here. {FUSE_INSTALL_HINT}"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return (
            "/dev/fuse exists but this user may not open it. Add the user to the `fuse` group or run as a"
            f" user that can. {FUSE_INSTALL_HINT}"
        )
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        return f"the Python package mfusepy is not installed. {FUSE_INSTALL_HINT}"
    except (OSError, AttributeError) as error:
        return f"libfuse 3 could not be loaded ({error}). {FUSE_INSTALL_HINT}"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return f"fusermount3 is not installed, so an ordinary user cannot mount. {FUSE_INSTALL_HINT}"
    return None


def _operations_class() -> type:
    """The mfusepy Operations subclass, defined on first use so importing this module needs no libfuse."""
    from mfusepy import FuseOSError, Operations

    class DatasetFilesystem(Operations):
        """FUSE callbacks answered by a MountTree; every file is a part, read by byte range."""

        use_ns = True

        def __init__(self, tree: MountTree, on_ready: Callable[[], None] | None) -> None:
            self.tree = tree
            self.on_ready = on_ready
            self.was_mounted = False
            self.dataset = tree.dataset
            info = os.stat(self.dataset.meta)
            self._times = {
                "st_mtime": info.st_mtime_ns,
                "st_ctime": info.st_mtime_ns,
                "st_atime": info.st_mtime_ns,
            }
            self._owner = {"st_uid": os.getuid(), "st_gid": os.getgid()}
            self._handles: dict[int, PartLocation] = {}
            self._next_handle = itertools.count(1)

        def _attributes(self, is_dir: bool, size: int) -> dict:
            mode = (stat.S_IFDIR | 0o555) if is_dir else (stat.S_IFREG | 0o444)
            return {
                "st_mode": mode,
                "st_nlink": 2 if is_dir else 1,
                "st_size": size,
                **self._times,
                **self._owner,
            }

        def getattr(self, path: str, fh: int | None = None) -> dict:
            node = self.tree.lookup(path)
            if node is None:
                raise FuseOSError(errno.ENOENT)
            return self._attributes(node.is_dir, node.size)

        def readdir_with_offset(self, path: str, offset: int, fh: int) -> Iterator[tuple[str, dict, int]]:
            try:
                entries = self.tree.list_dir(path, offset)
                first = next(entries, None)
            except FileNotFoundError:
                raise FuseOSError(errno.ENOENT) from None
            if first is None:
                if offset == 0:
                    yield from ((".", {"st_mode": stat.S_IFDIR}, 0), ("..", {"st_mode": stat.S_IFDIR}, 0))
                return
            paged = first.cookie != 0
            if offset < 1:
                yield ".", {"st_mode": stat.S_IFDIR}, 1 if paged else 0
            if offset < 2:
                yield "..", {"st_mode": stat.S_IFDIR}, 2 if paged else 0
            for entry in itertools.chain((first,), entries):
                yield entry.name, {"st_mode": stat.S_IFDIR if entry.is_dir else stat.S_IFREG}, entry.cookie

        def open(self, path: str, flags: int) -> int:
            if flags & os.O_ACCMODE != os.O_RDONLY:
                raise FuseOSError(errno.EROFS)
            node = self.tree.lookup(path)
            if node is None:
                raise FuseOSError(errno.ENOENT)
            if node.location is None:
                raise FuseOSError(errno.EISDIR)
            handle = next(self._next_handle)
            self._handles[handle] = node.location
            return handle

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            location = self._handles.get(fh)
            if location is None:
                raise FuseOSError(errno.EBADF)
            try:
                return self.dataset.read_part(location, offset, size)
            except OSError:
                raise FuseOSError(errno.EIO) from None

        def release(self, path: str, fh: int) -> int:
            self._handles.pop(fh, None)
            return 0

        def init(self, path: str) -> None:
            self.was_mounted = True
            if self.on_ready is not None:
                self.on_ready()

        def statfs(self, path: str) -> dict:
            return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 4096}

        def destroy(self, path: str) -> None:
            self.dataset.close()

    return DatasetFilesystem


def serve(
    tree: MountTree, mountpoint: str, *, debug: bool = False, on_ready: Callable[[], None] | None = None
) -> None:
    """Mount `tree` at `mountpoint` and serve it in this process until it is unmounted (or Ctrl-C).

    `on_ready` runs once the kernel has the mount, before the first request is answered.
    """
    problem = fuse_problem()
    if problem is not None:
        raise PrepError(f"Cannot mount: {problem}")
    import mfusepy

    operations = _operations_class()(tree, on_ready)
    options = {
        "ro": True,
        "fsname": f"shardprep:{tree.dataset.root}",
        "subtype": "shardprep",
        "entry_timeout": CACHE_SECONDS,
        "attr_timeout": CACHE_SECONDS,
        "negative_timeout": CACHE_SECONDS,
        "kernel_cache": True,
        "max_threads": 16,
        "max_idle_threads": 16,  # keep workers: a new thread costs a Python thread state per request
    }
    try:
        mfusepy.FUSE(operations, mountpoint, foreground=True, nothreads=False, debug=debug, **options)
    except RuntimeError as error:
        if operations.was_mounted:  # libfuse reports the signal that ended a live mount (Ctrl-C) as an error
            return
        raise PrepError(
            f"Mounting at {mountpoint} failed (libfuse error {error}). Check that the mount point is an"
            f" existing folder that is not already mounted. {FUSE_INSTALL_HINT}"
        ) from None
