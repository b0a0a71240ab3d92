"""One run at a time per dataset: the lock `prepare` and `write` hold on the folder they write.

Two runs writing one dataset at once would each stage an index and put it in place, the second over the
first, with `.tar.idx` files of one beside the sqlite of the other. So each run holds an exclusive
`flock` on `DATASET/.shardprep.lock` for as long as it writes, and a second run refuses at once, naming
the owner (pid, host, command and start time, which the owner writes into the file):

    with dataset_lock(root, "prepare"):
        ...   # stage, build, commit

The kernel drops a `flock` when its holder dies, whatever kills it, so a lock left by a killed run is
stale by construction: the next run takes it over without asking, and removes what the killed run had
staged (`prep.index.staging.remove_leftovers`), which only the lock's holder may do. The file is removed
when the run ends. On a filesystem without `flock` (some network mounts) runs are not serialised and
leftovers stay, and nothing fails.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prep.errors import PrepError
from prep.index.staging import remove_leftovers

LOCK_FILE = ".shardprep.lock"


@contextmanager
def dataset_lock(root: Path, command: str) -> Iterator[None]:
    """Hold the lock on dataset folder `root` (made if missing) while `command` writes it; a PrepError
    naming the owner if another run holds it. Folders it makes are removed again if left empty."""
    missing = [folder for folder in (root, *root.parents) if not folder.exists()]
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PrepError(f"Cannot make the folder {root} ({error.strerror}).") from None
    path = root / LOCK_FILE
    try:
        fd, exclusive = _acquire(path, command)
    except BaseException:
        _remove_if_empty(missing)
        raise
    try:
        if exclusive:
            remove_leftovers(root)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "command": command, "started": _now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)  # while still holding the lock, so no one locks the old file after us
        except OSError:
            pass
        os.close(fd)
        _remove_if_empty(missing)


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove `folders` (innermost first) where they are empty: those the lock made for a run that wrote
    nothing in them."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _acquire(path: Path, command: str) -> tuple[int, bool]:
    """The lock file's descriptor, locked, and whether the lock is real (False: no flock here)."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise PrepError(
                f"Cannot write in {path.parent} ({error.strerror}): {command} writes its index files there."
                " Check the folder's permissions and free space."
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _owner(fd)
            os.close(fd)
            raise PrepError(
                f"{path.parent} is being written by another run ({owner}). Two runs on one dataset would mix"
                " their index files: wait for that one to finish (its lock goes when it ends, however it ends)."
            ) from None
        except OSError as error:
            if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            return fd, False  # no flock on this filesystem: go on unserialised
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, True
        os.close(fd)  # the previous owner removed the file as we opened it: lock the new one


def _owner(fd: int) -> str:
    """Who holds the lock, from what it wrote into the file."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (
            f"`shardprep {owner['command']}`, pid {owner['pid']} on host {owner['host']},"
            f" started {owner['started']}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "its owner has not written its name yet"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %z")
