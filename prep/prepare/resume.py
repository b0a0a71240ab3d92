"""Resumable prepare (`--resume`): each shard's rows kept beside the dataset as they come in, so a rerun
after an interruption (Ctrl-C, a bad shard, SIGKILL) scans only the shards it had not finished.

    checkpoint = ShardCheckpoint(root)
    checkpoint.check(shards)                     # which shards' saved rows are still valid: `reusable`
    ... checkpoint.load(shard, tar_file_id) for those, checkpoint.save(rows) for each shard scanned ...
    checkpoint.remove()                          # once the new index is in place

One file per shard in `DATASET/.shardprep-resume/`, named by a hash of the shard's path, holding first
its key (the path, size and modification time of the shard when it was scanned), then its `ShardRows`.
A saved shard is valid only while its key matches the shard on disk: a shard changed since is scanned
again. Each file is written under a temporary name and renamed, so a run killed mid-write leaves none
half-written. The folder is hidden (no shard is looked for in it) and is not part of the staging, so an
aborted run keeps it; the run that puts an index in place removes it. The files are pickles written by
an earlier run of the same user on this dataset, which holds the dataset lock (`prep.index.lock`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
from pathlib import Path

from prep.errors import PrepError
from prep.index.rows import ShardRows

#: The checkpoint folder's name, in the dataset folder (hidden: the shard search skips it).
RESUME_DIR = ".shardprep-resume"
#: Bumped when what a checkpoint file holds changes; files of another version are ignored.
FORMAT = 1

Key = tuple[int, str, int, int]


class ShardCheckpoint:
    """The rows of finished shards of dataset `root`, saved by an earlier (or this) run."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / RESUME_DIR
        #: Each shard's key, taken before any is scanned: a shard changed during the run is saved under
        #: its old key, and so scanned again by the next run.
        self.keys: dict[str, Key] = {}
        #: The positions of the shards whose saved rows `check` found valid.
        self.reusable: set[int] = set()

    def _path(self, shard: str) -> Path:
        return self.folder / (
            hashlib.sha256(shard.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".rows"
        )

    def _key(self, shard: str) -> Key:
        info = (self.root / shard).stat()
        return (FORMAT, shard, info.st_size, info.st_mtime_ns)

    def check(self, shards: list[str]) -> set[int]:
        """The positions in `shards` of those whose saved rows still match the shard on disk, kept as
        `reusable`. Call it before scanning: it takes every shard's key."""
        self.keys = {}
        for shard in shards:
            try:
                self.keys[shard] = self._key(shard)
            except OSError:
                continue  # the scan will say what is wrong with it
        self.reusable = found = set()
        if not self.folder.is_dir():
            return found
        for position, shard in enumerate(shards):
            try:
                with open(self._path(shard), "rb") as file:
                    if shard in self.keys and pickle.load(file) == self.keys[shard]:
                        found.add(position)
            except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError):
                continue  # no checkpoint, or an unreadable one: scan the shard again
        return found

    def load(self, shard: str, tar_file_id: int) -> ShardRows:
        """The saved rows of `shard` (one `check` found valid), numbered `tar_file_id` in this run."""
        try:
            with open(self._path(shard), "rb") as file:
                pickle.load(file)  # the key, compared by `check`
                rows: ShardRows = pickle.load(file)
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
            raise PrepError(
                f"The saved rows of {shard} in {self.folder} cannot be read ({error}). Remove that folder"
                " and run again: every shard is then scanned anew."
            ) from None
        rows.tar_file_id = tar_file_id
        return rows

    def save(self, rows: ShardRows) -> None:
        """Keep the rows of a shard just scanned, under the key `check` took (the folder made if missing)."""
        key = self.keys.get(rows.shard)
        if key is None:
            return  # not there when checked: nothing to resume from
        self.folder.mkdir(exist_ok=True)
        path = self._path(rows.shard)
        temporary = path.with_name(path.name + ".tmp")
        with open(temporary, "wb") as file:
            pickle.dump(key, file, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.dump(rows, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temporary, path)

    def remove(self) -> None:
        """Forget every saved shard (the index they were for is in place)."""
        shutil.rmtree(self.folder, ignore_errors=True)
