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
else; anything else is refused with a message (`trusted`), since a pickle planted by another user would
run as this one.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import stat
from pathlib import Path
from typing import Any

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

    def _base(self, name: str) -> Path:
        return self.folder / hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]

    def file(self, name: str, suffix: str) -> Path:
        """Where entry `name` keeps its file `suffix` (given to `save`)."""
        return Path(f"{self._base(name)}{suffix}")

    def trusted(self) -> bool:
        """Whether the folder holds entries that can be read: it exists and is this user's alone. A
        PrepError if it exists but someone else could have written it."""
        try:
            info = os.lstat(self.folder)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022:
            return True
        raise PrepError(
            f"{self.folder} is not safe to resume from: it is a link, not this user's, or writable by"
            " others, and what it holds would run as code when read. Remove it (or give another --tmp-path)"
            " and run again; everything is then done anew."
        )

    def matches(self, name: str, key: object) -> bool:
        """Whether entry `name` was saved under `key` (its files with it); False if missing or unreadable."""
        if not self.trusted():
            return False
        try:
            with open(self.file(name, ".record"), "rb") as file:
                return bool(pickle.load(file) == key)
        except _UNREADABLE:
            return False

    def load(self, name: str) -> Any:
        """The result saved in entry `name` (one `matches` found valid)."""
        try:
            with open(self.file(name, ".record"), "rb") as file:
                pickle.load(file)  # the key, compared by `matches`
                return pickle.load(file)
        except _UNREADABLE as error:
            raise PrepError(
                f"The saved result of {name} in {self.folder} cannot be read ({error}). Remove that folder"
                " and run again: everything is then done anew."
            ) from None

    def save(self, name: str, key: object, result: object, files: dict[str, Path] | None = None) -> None:
        """Keep `result` (and a hard link to each of `files`, by suffix) as entry `name` under `key`."""
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.trusted()  # one made by someone else is not written into either
        record = self.file(name, ".record")
        record.unlink(missing_ok=True)  # an entry being replaced is invalid until its new record is in
        for suffix, path in (files or {}).items():
            kept = self.file(name, suffix)
            kept.unlink(missing_ok=True)
            try:
                os.link(path, kept)
            except OSError:  # another filesystem, or no hard links there: a copy
                shutil.copyfile(path, kept)
        temporary = self.file(name, ".record-tmp")
        with open(temporary, "wb") as file:
            pickle.dump(key, file, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.dump(result, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, record)

    def restore(self, name: str, suffix: str, target: Path) -> None:
        """Put entry `name`'s file `suffix` at `target` (a hard link: the entry keeps its own)."""
        target.unlink(missing_ok=True)
        try:
            os.link(self.file(name, suffix), target)
        except OSError:
            shutil.copyfile(self.file(name, suffix), target)

    def entries(self) -> int:
        """How many entries are saved (complete or not)."""
        try:
            return sum(1 for entry in self.folder.iterdir() if entry.suffix == ".record")
        except OSError:
            return 0

    def remove(self) -> None:
        """Forget every entry (what they were for is in place)."""
        shutil.rmtree(self.folder, ignore_errors=True)
