"""Resumable prepare (`--resume`): each shard's rows kept beside the dataset as they come in, so a rerun
after an interruption (Ctrl-C, a bad shard, SIGKILL) scans only the shards it had not finished.

    checkpoint = ShardCheckpoint(root)
    checkpoint.check(shards)                     # which shards' saved rows are still valid: `reusable`
    ... checkpoint.load(shard, tar_file_id) for those, checkpoint.save(rows) for each shard scanned ...
    checkpoint.remove()                          # once the new index is in place

One entry of `prep.index.checkpoint` per shard, named by the shard's path, keyed by its size and
modification time when it was scanned (a shard in a bucket: its size and ETag, `prep.prepare.remote`),
holding its `ShardRows`: a shard changed since is scanned again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prep.index.checkpoint import RESUME_DIR, Checkpoint
from prep.index.rows import ShardRows

__all__ = ["RESUME_DIR", "ShardCheckpoint"]

#: Bumped when what a checkpoint entry holds changes; entries of another version are not reused.
FORMAT = 1

Key = tuple[int, str, int, int]


class ShardCheckpoint:
    """The rows of finished shards of dataset `root`, saved in it by an earlier (or this) run; each shard
    keyed by `key` if given (for shards that are not files below `root`), else by its file's stat."""

    def __init__(self, root: Path, *, key: Callable[[str], Key] | None = None) -> None:
        self.root = root
        self.saved = Checkpoint(root)
        self._key_of = key
        self.folder = self.saved.folder
        #: Each shard's key, taken before any is scanned: a shard changed during the run is saved under
        #: its old key, and so scanned again by the next run.
        self.keys: dict[str, Key] = {}
        #: The positions of the shards whose saved rows `check` found valid.
        self.reusable: set[int] = set()

    def _key(self, shard: str) -> Key:
        if self._key_of is not None:
            return self._key_of(shard)
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
        self.reusable = {
            position
            for position, shard in enumerate(shards)
            if shard in self.keys and self.saved.matches(shard, self.keys[shard])
        }
        return self.reusable

    def load(self, shard: str, tar_file_id: int) -> ShardRows:
        """The saved rows of `shard` (one `check` found valid), numbered `tar_file_id` in this run."""
        rows: ShardRows = self.saved.load(shard)
        rows.tar_file_id = tar_file_id
        return rows

    def save(self, rows: ShardRows) -> None:
        """Keep the rows of a shard just scanned, under the key `check` took."""
        key = self.keys.get(rows.shard)
        if key is not None:  # else not there when checked: nothing to resume from
            self.saved.save(rows.shard, key, rows)

    def remove(self) -> None:
        """Forget every saved shard (the index they were for is in place)."""
        self.saved.remove()
