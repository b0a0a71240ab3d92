"""Finished work kept beside a dataset, so a rerun after an interruption reuses it (`--resume`).

    checkpoint = Checkpoint(root)
    if checkpoint.matches(name, key):
        result = checkpoint.load(name)                        # done by an earlier run
    else:
        result = work()
        checkpoint.save(name, key, result, files={".tar": shard_path})
    ...
    checkpoint.remove()                                       # once what it was for is in place

One entry per piece of work, in `DATASET/.shardprep-resume/`, named by a hash of its name: a record file
holding first the entry's key (what the result was made from: a file's path, size and modification time,
the options that shape it), then the result, each a pickle; and beside it, under the same hash, the files
the work made (hard links, so keeping them costs no copy). An entry is valid only while its key equals
the one the rerun computes: anything changed since is redone. The record is written under a temporary
name and renamed after its files are in place, so a run killed mid-save leaves no entry that looks
complete. The folder is hidden (no shard is looked for in it), outlives an aborted run, and is removed by
the run that puts its result in place. The records are pickles, so a folder is read only if it is
safe to: made by this user with mode 0700 (`save` makes it so), not a symbolic link, writable by no one
else; anything else is refused with a message, since a pickle planted by another user would run as this
one. The check is made on the folder opened once (without following a link), and every entry is then
read and written through that open folder, never by its path again: whoever can write the folder above
it (a dataset's group, or another user where a bucket prepare keeps it under /tmp) cannot swap another
folder in between the check and a read.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import shutil
import weakref
from pathlib import Path
from typing import Any, BinaryIO

from prep.errors import PrepError

#: The checkpoint folder's name, in the dataset folder (hidden: the shard search skips it).
RESUME_DIR = ".shardprep-resume"
#: What reading a damaged or foreign record raises: such an entry is not valid.
_UNREADABLE = (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError)


def file_key(path: Path) -> tuple[str, int, int]:
    """What says a file is unchanged: its absolute path, size and modification time (ns)."""
    info = path.stat()
    return (os.path.abspath(path), info.st_size, info.st_mtime_ns)


class Checkpoint:
    """The entries kept under `root/.shardprep-resume` by an earlier (or this) run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / RESUME_DIR
        #: The folder, opened and checked (`_open`), or None before that.
        self._fd: int | None = None
        self._closer: weakref.finalize | None = None

    @staticmethod
    def _base(name: str) -> str:
        """Entry `name`'s file names in the folder start so."""
        return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]

    def _open(self, create: bool = False) -> int | None:
        """The folder's open descriptor, checked to be this user's alone on the descriptor itself (made,
        with mode 0700, if `create`); None if there is none. A PrepError if someone else could have
        written it."""
        if self._fd is not None:
            return self._fd
        if create:
            self.folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.folder, 0o700)
            except FileExistsError:
                pass  # checked below, as one found
        try:
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise self._unsafe() from None
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o022:
            os.close(fd)
            raise self._unsafe()
        self._fd, self._closer = fd, weakref.finalize(self, os.close, fd)
        return fd

    def _unsafe(self) -> PrepError:
        return PrepError(
            f"{self.folder} is not safe to resume from: it is a link, not this user's, or writable by"
            " others, and what it holds would run as code when read. Remove it (or give another --tmp-path)"
            " and run again; everything is then done anew."
        )

    def trusted(self) -> bool:
        """Whether the folder holds entries that can be read: it exists and is this user's alone. A
        PrepError if it exists but someone else could have written it."""
        return self._open() is not None

    def matches(self, name: str, key: object) -> bool:
        """Whether entry `name` was saved under `key` (its files with it); False if missing or unreadable."""
        fd = self._open()
        if fd is None:
            return False
        try:
            with os.fdopen(os.open(self._base(name) + ".record", os.O_RDONLY, dir_fd=fd), "rb") as file:
                return bool(pickle.load(file) == key)
        except _UNREADABLE:
            return False

    def load(self, name: str) -> Any:
        """The result saved in entry `name` (one `matches` found valid)."""
        try:
            fd = self._open()
            if fd is None:
                raise FileNotFoundError(self.folder)
            with os.fdopen(os.open(self._base(name) + ".record", os.O_RDONLY, dir_fd=fd), "rb") as file:
                pickle.load(file)  # the key, compared by `matches`
                return pickle.load(file)
        except _UNREADABLE as error:
            raise PrepError(
                f"The saved result of {name} in {self.folder} cannot be read ({error}). Remove that folder"
                " and run again: everything is then done anew."
            ) from None

    def save(self, name: str, key: object, result: object, files: dict[str, Path] | None = None) -> None:
        """Keep `result` (and a hard link to each of `files`, by suffix) as entry `name` under `key`."""
        fd = self._open(create=True)
        assert fd is not None  # made, or a PrepError
        base = self._base(name)
        _unlink(base + ".record", fd)  # an entry being replaced is invalid until its new record is in
        for suffix, path in (files or {}).items():
            _unlink(base + suffix, fd)
            try:
                os.link(path, base + suffix, dst_dir_fd=fd)
            except OSError:  # another filesystem, or no hard links there: a copy
                with open(path, "rb") as source, _create(base + suffix, fd) as kept:
                    shutil.copyfileobj(source, kept)
        with _create(base + ".record-tmp", fd) as file:
            pickle.dump(key, file, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.dump(result, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(base + ".record-tmp", base + ".record", src_dir_fd=fd, dst_dir_fd=fd)

    def restore(self, name: str, suffix: str, target: Path) -> None:
        """Put entry `name`'s file `suffix` at `target` (a hard link: the entry keeps its own)."""
        fd = self._open()
        if fd is None:
            raise FileNotFoundError(self.folder)
        target.unlink(missing_ok=True)
        try:
            os.link(self._base(name) + suffix, target, src_dir_fd=fd)
        except OSError:
            with os.fdopen(os.open(self._base(name) + suffix, os.O_RDONLY, dir_fd=fd), "rb") as kept:
                with open(target, "wb") as copy:
                    shutil.copyfileobj(kept, copy)

    def entries(self) -> int:
        """How many entries are saved (complete or not)."""
        try:
            fd = self._open()
            return 0 if fd is None else sum(1 for entry in os.listdir(fd) if entry.endswith(".record"))
        except OSError:
            return 0

    def remove(self) -> None:
        """Forget every entry (what they were for is in place)."""
        if self._closer is not None:
            self._closer()  # closes the folder's descriptor
            self._fd = self._closer = None
        shutil.rmtree(self.folder, ignore_errors=True)


def _unlink(name: str, folder: int) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def _create(name: str, folder: int) -> BinaryIO:
    """File `name` in the open `folder`, made anew (this user's alone) for writing."""
    return os.fdopen(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=folder), "wb")
