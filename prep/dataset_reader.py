"""Read-only access to a prepared dataset: its metadata, its index and its parts, by byte offset.

A prepared dataset is a folder of shards plus `.nv-meta/` (written by `shardprep prepare` or
`energon prepare`). This module reads `.info.json` (the shard order is the `tar_file_id` order),
`split.yaml` (brace-expanded the way energon expands it), `dataset.yaml`, the per-shard `.tar.idx`
offsets and `index.sqlite`, and reads part bytes with `os.pread` so no caller ever loads more of a
shard than it asked for. It never writes anything.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import braceexpand
import numpy as np
import yaml

from prep.errors import PrepError
from prep.index_format import (
    DATASET_YAML,
    INDEX_SQLITE,
    INFO_JSON,
    INFO_YAML,
    META_DIR,
    SPLIT_YAML,
    TAR_INDEX_ENTRY,
    tar_index_name,
)

_CANNOT_TELL = "this filesystem cannot tell whether a read would wait"
RERUN_PREPARE = "Re-run `shardprep prepare` (or `energon prepare`) on the dataset folder."


class PartLocation(NamedTuple):
    """Where one part's bytes live: shard position (`tar_file_id`), data offset and length.

    A named tuple, not a dataclass: the mount makes one per file it serves, and tuples are made faster.
    """

    tar_file_id: int
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One row of the `samples` table."""

    tar_file_id: int
    key: str
    index: int
    offset: int
    size: int


def load_splits(path: Path) -> tuple[dict[str, list[str]], list[str]]:
    """The split file's shard lists (brace-expanded, excluded shards removed) and its expanded excludes.

    Entries of `exclude` that contain a `/` below a shard name exclude single samples; energon keeps them
    in the exclude list, and so does this function.
    """
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as error:
        raise PrepError(f"{path} cannot be read ({error.strerror}). {RERUN_PREPARE}") from None
    except yaml.YAMLError as error:
        raise PrepError(f"{path} is not valid YAML ({error}). {RERUN_PREPARE}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("split_parts"), dict):
        raise PrepError(f"{path} has no `split_parts` mapping, so no split can be read. {RERUN_PREPARE}")
    excludes = [
        name for pattern in raw.get("exclude") or [] for name in braceexpand.braceexpand(str(pattern))
    ]
    excluded = set(excludes)
    splits: dict[str, list[str]] = {}
    for split, patterns in raw["split_parts"].items():
        names = [name for pattern in patterns or [] for name in braceexpand.braceexpand(str(pattern))]
        splits[str(split)] = [name for name in names if name not in excluded]
    return splits, excludes


class PreparedDataset:
    """A prepared dataset opened for reading.

    Metadata is read once at construction; sqlite is opened read-only (`db()` for one thread, a
    `connect()` per thread for several), and shard files are opened lazily and kept open, so concurrent
    `read_part` calls share one descriptor per shard (`pread` has no file position to fight over).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.meta = self.root / META_DIR
        if not self.root.is_dir():
            raise PrepError(
                f"{self.root} is not a folder. Give the folder that holds the shards and {META_DIR}/."
            )
        if not self.meta.is_dir():
            raise PrepError(
                f"{self.root} is not a prepared dataset: it has no {META_DIR}/ folder. Prepare it first with"
                f" `shardprep prepare {self.root}`."
            )
        self.shard_counts = self._load_shard_counts()
        self.shards = list(self.shard_counts)
        self._shard_ids = {name: index for index, name in enumerate(self.shards)}
        self._db: sqlite3.Connection | None = None
        self._fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        self._nowait_reads = hasattr(os, "RWF_NOWAIT")

    # -- metadata ---------------------------------------------------------------------------------
    def _load_shard_counts(self) -> dict[str, int]:
        path = self.meta / INFO_JSON
        try:
            if path.exists():
                info = json.loads(path.read_text())
            elif (self.meta / INFO_YAML).exists():
                path = self.meta / INFO_YAML
                info = yaml.safe_load(path.read_text())
            else:
                raise PrepError(f"{self.root} has no {META_DIR}/{INFO_JSON}. {RERUN_PREPARE}")
        except (ValueError, yaml.YAMLError) as error:
            raise PrepError(f"{path} is not valid ({error}). {RERUN_PREPARE}") from None
        counts = info.get("shard_counts") if isinstance(info, dict) else None
        if not isinstance(counts, dict) or not all(isinstance(v, int) for v in counts.values()):
            raise PrepError(
                f"{path} has no valid `shard_counts` mapping of shard name to sample count. {RERUN_PREPARE}"
            )
        return {str(name): int(count) for name, count in counts.items()}

    def splits(self, split_file: str = SPLIT_YAML) -> dict[str, list[str]]:
        """Split name -> shard names, as energon resolves them from the split file."""
        return load_splits(self.meta / split_file)[0]

    def split_shards(self, split: str | None) -> list[str]:
        """The shards of one split, or of the whole dataset when `split` is None."""
        if split is None:
            return list(self.shards)
        splits = self.splits()
        if split not in splits:
            raise PrepError(
                f"{self.root} has no split {split!r}; its splits are {', '.join(sorted(splits)) or 'none'}."
            )
        return splits[split]

    def dataset_config(self) -> dict | None:
        """The parsed `dataset.yaml`, or None if there is none."""
        path = self.meta / DATASET_YAML
        if not path.exists():
            return None
        try:
            config = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise PrepError(f"{path} is not valid YAML ({error}). {RERUN_PREPARE}") from None
        return config if isinstance(config, dict) else None

    def tar_file_id(self, shard: str) -> int:
        """The position of a shard in `.info.json`, which is its `tar_file_id` in sqlite."""
        try:
            return self._shard_ids[shard]
        except KeyError:
            raise PrepError(
                f"{shard} is not a shard of {self.root} (it is not listed in {INFO_JSON})."
            ) from None

    def shard_path(self, shard: str) -> Path:
        return self.root / shard

    def tar_index_path(self, shard: str) -> Path:
        return self.root / tar_index_name(shard)

    def read_tar_index(self, shard: str) -> np.ndarray:
        """A shard's `.tar.idx` as uint64 offsets: sample starts, then the end of the last sample."""
        dtype = np.dtype(f"<u{TAR_INDEX_ENTRY.size}")
        return np.fromfile(self.tar_index_path(shard), dtype=dtype).astype(np.int64)

    # -- sqlite -----------------------------------------------------------------------------------
    @property
    def sqlite_path(self) -> Path:
        return self.meta / INDEX_SQLITE

    def connect(self) -> sqlite3.Connection:
        """A new read-only connection to `index.sqlite`, owned by the caller (one per thread)."""
        if not self.sqlite_path.exists():
            raise PrepError(f"{self.root} has no {META_DIR}/{INDEX_SQLITE}. {RERUN_PREPARE}")
        # immutable: no locks or change checks per query (each costs syscalls); a mount serves a snapshot
        uri = self.sqlite_path.resolve().as_uri() + "?mode=ro&immutable=1"
        try:
            connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
            connection.execute("SELECT 1 FROM samples LIMIT 1").fetchall()
            connection.execute("SELECT 1 FROM sample_parts LIMIT 1").fetchall()
        except sqlite3.DatabaseError as error:
            raise PrepError(
                f"{self.sqlite_path} cannot be read as energon's index ({error}); it needs the tables"
                f" `samples` and `sample_parts`. {RERUN_PREPARE}"
            ) from None
        return connection

    def db(self) -> sqlite3.Connection:
        """A read-only connection to `index.sqlite` for single-threaded use (info, verify, preview).

        A program querying from several threads (the mount) opens one `connect()` per thread instead.
        """
        if self._db is None:
            self._db = self.connect()
        return self._db

    def sample_by_key(self, key: str) -> SampleRow | None:
        row = (
            self.db()
            .execute(
                "SELECT tar_file_id, sample_key, sample_index, byte_offset, byte_size FROM samples"
                " WHERE sample_key = ?",
                (key,),
            )
            .fetchone()
        )
        return None if row is None else SampleRow(*row)

    def samples_of_shard(self, tar_file_id: int, after_index: int = -1) -> Iterator[SampleRow]:
        """The samples of one shard in order, starting after `after_index` (a lazily stepped cursor)."""
        cursor = self.db().execute(
            "SELECT tar_file_id, sample_key, sample_index, byte_offset, byte_size FROM samples"
            " WHERE tar_file_id = ? AND sample_index > ? ORDER BY sample_index",
            (tar_file_id, after_index),
        )
        try:
            for row in cursor:
                yield SampleRow(*row)
        finally:
            cursor.close()

    def parts_of_sample(self, tar_file_id: int, index: int) -> list[tuple[str, PartLocation]]:
        """(part name, location) of every part of one sample, in tar order."""
        rows = (
            self.db()
            .execute(
                "SELECT part_name, content_byte_offset, content_byte_size FROM sample_parts"
                " WHERE tar_file_id = ? AND sample_index = ? ORDER BY content_byte_offset",
                (tar_file_id, index),
            )
            .fetchall()
        )
        return [(name, PartLocation(tar_file_id, offset, size)) for name, offset, size in rows]

    # -- bytes ------------------------------------------------------------------------------------
    def _fd(self, tar_file_id: int) -> int:
        fd = self._fds.get(tar_file_id)
        if fd is None:
            with self._fd_lock:
                fd = self._fds.get(tar_file_id)
                if fd is None:
                    fd = os.open(self.shard_path(self.shards[tar_file_id]), os.O_RDONLY)
                    self._fds[tar_file_id] = fd
        return fd

    def _range(self, location: PartLocation, offset: int, size: int | None) -> tuple[int, int]:
        """The shard offset and length of bytes `offset .. offset+size` of a part, clipped to the part."""
        available = max(location.size - offset, 0)
        return location.offset + offset, available if size is None else min(size, available)

    def read_part(self, location: PartLocation, offset: int = 0, size: int | None = None) -> bytes:
        """Bytes `offset .. offset+size` of a part (all of it by default), read with one `pread`."""
        start, size = self._range(location, offset, size)
        if size == 0:
            return b""
        fd = self._fd(location.tar_file_id)
        data = os.pread(fd, size, start)
        while len(data) < size:  # pread may return short on some filesystems; EOF means a truncated shard
            more = os.pread(fd, size - len(data), start + len(data))
            if not more:
                raise OSError(f"{self.shards[location.tar_file_id]} ends inside a part (truncated shard)")
            data += more
        return data

    def read_part_cached(self, location: PartLocation, offset: int, into: memoryview) -> memoryview:
        """Like `read_part`, into the caller's buffer and only from the page cache: BlockingIOError if
        the disk would be needed. Returns the filled front of `into` (shorter at the part's end).

        A server answering many clients from one thread reads this way into buffers it reuses, and
        hands the reads that would wait to threads that may. On filesystems that cannot tell, every
        call raises BlockingIOError.
        """
        start, size = self._range(location, offset, len(into))
        if not self._nowait_reads:
            raise BlockingIOError(errno.EAGAIN, _CANNOT_TELL)
        if size == 0:
            return into[:0]
        buffer = into[:size]
        try:
            got = os.preadv(self._fd(location.tar_file_id), [buffer], start, os.RWF_NOWAIT)
        except BlockingIOError:
            raise
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._nowait_reads = False
            raise BlockingIOError(errno.EAGAIN, _CANNOT_TELL) from None
        if got < size:  # partly cached, or the shard ends early: the waiting read sorts out which
            raise BlockingIOError(errno.EAGAIN, "part of the range is not in the page cache")
        return buffer

    def close(self) -> None:
        with self._fd_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> PreparedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
