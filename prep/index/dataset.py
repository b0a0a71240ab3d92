"""A prepared dataset opened for reading: its metadata, its index and its parts' bytes, by byte offset.

A prepared dataset is a folder of shards plus `.nv-meta/` (written by `shardprep prepare`, `shardprep
write` or `energon prepare`). `PreparedDataset` reads `.info.json` (the shard order is the `tar_file_id`
order), the split file and `dataset.yaml` through `prep.index.meta`, the per-shard `.tar.idx` offsets,
`index.sqlite` through an `IndexReader`, and part bytes with `os.pread`, so no caller ever loads more of a
shard than it asked for. It never writes anything.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

import numpy as np

from prep.errors import PrepError
from prep.index.format import (
    DATASET_YAML,
    INDEX_SQLITE,
    META_DIR,
    SPLIT_YAML,
    TAR_INDEX_ENTRY,
    tar_index_name,
)
from prep.index.meta import read_dataset_yaml, read_shard_counts, read_splits, split_file_name
from prep.index.metadataset import metadataset_error, metadataset_file
from prep.index.sqlite import IndexReader, PartLocation
from prep.index.staging import local_path

_CANNOT_TELL = "this filesystem cannot tell whether a read would wait"


class ShardChangedError(OSError):
    """A shard file that is no longer the file it was when `PreparedDataset.expect_unchanged` recorded it
    (replaced or rewritten): the index's offsets do not find its parts. An I/O error (EIO)."""

    def __init__(self, shard: str) -> None:
        super().__init__(errno.EIO, f"{shard} changed after its index was read")
        self.shard = shard


#: Shard files kept open at most: a dataset may have more shards than a process may open files.
OPEN_SHARD_FILES = 256
#: Split files as read (`read_splits`), by path: a long `exclude` list takes seconds to parse, so each is
#: parsed once, by whichever reader of a run (a verify of a metadataset opens each dataset several times).
SplitFilesRead = dict[Path, tuple[dict[str, list[str]], list[str]]]


class PreparedDataset:
    """A prepared dataset opened for reading.

    Metadata is read once at construction; `index` queries `index.sqlite` (opened on first use), and
    shard files are opened lazily and kept open, so concurrent `read_part` calls share one descriptor per
    shard (`pread` has no file position to fight over). At most OPEN_SHARD_FILES stay open (fewer if the
    process may open no more files): the least recently read one no read is using is closed first. Each
    split file is parsed once, into `split_files_read` where the caller shares one between datasets.
    """

    def __init__(self, root: str | os.PathLike[str], split_files_read: SplitFilesRead | None = None) -> None:
        self.root = Path(root)
        self.meta = self.root / META_DIR
        metadataset = metadataset_file(self.root)
        if metadataset is not None:
            raise metadataset_error(self.root, metadataset)
        if not self.root.is_dir():
            raise PrepError(
                f"{self.root} is not a folder. Give the folder that holds the shards and {META_DIR}/."
            )
        if not self.meta.is_dir():
            raise PrepError(
                f"{self.root} is not a prepared dataset: it has no {META_DIR}/ folder. Prepare it first with"
                f" `shardprep prepare {self.root}`."
            )
        self.shard_counts = read_shard_counts(self.meta)
        self.shards = list(self.shard_counts)
        self._shard_ids = {name: index for index, name in enumerate(self.shards)}
        self.index = IndexReader(self.sqlite_path)
        #: tar_file_id -> open descriptor, least recently read first; descriptor -> reads using it now.
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._fd_users: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        self._nowait_reads = hasattr(os, "RWF_NOWAIT")
        #: tar_file_id -> (size, mtime in ns) each shard file must still have when opened; None: no check.
        self._shard_files: dict[int, tuple[int, int]] | None = None
        #: tar_file_ids whose files had changed already when `expect_unchanged` looked: never read.
        self._changed_before: set[int] = set()
        #: Each split file as read, once (`SplitFilesRead`, which the caller may share between datasets).
        self._split_files: SplitFilesRead = {} if split_files_read is None else split_files_read

    # -- metadata ---------------------------------------------------------------------------------
    def splits(self, split_file: str = SPLIT_YAML) -> dict[str, list[str]]:
        """Split name -> shard names, as energon resolves them from the split file."""
        return {split: list(shards) for split, shards in self._read_splits(split_file)[0].items()}

    def split_file(self, split_config: str = SPLIT_YAML) -> str:
        """The split file of `.nv-meta` energon reads when told `split_config` (`split_file_name`)."""
        return split_file_name(self.meta, split_config)

    def _read_splits(self, split_file: str) -> tuple[dict[str, list[str]], list[str]]:
        path = self.meta / self.split_file(split_file)
        if path not in self._split_files:
            self._split_files[path] = read_splits(path)
        return self._split_files[path]

    def excluded_samples(self, split_file: str = SPLIT_YAML) -> dict[int, set[str]]:
        """The samples the split file's `exclude` drops one by one (`SHARD/KEY`, as energon matches
        them), as keys by `tar_file_id`; excluded shards are left out of `splits` already."""
        excluded: dict[int, set[str]] = {}
        for entry in self._read_splits(split_file)[1]:
            slash = entry.find("/")
            while slash >= 0:  # a shard name may itself hold slashes: try each cut
                tar_file_id = self._shard_ids.get(entry[:slash])
                if tar_file_id is not None:
                    excluded.setdefault(tar_file_id, set()).add(entry[slash + 1 :])
                    break
                slash = entry.find("/", slash + 1)
        return excluded

    def excluded_shards(self, split_file: str = SPLIT_YAML) -> set[str]:
        """The shards the split file's `exclude` drops whole (they are in no split by the user's choice)."""
        return {entry for entry in self._read_splits(split_file)[1] if entry in self._shard_ids}

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

    def dataset_config(self, name: str = DATASET_YAML) -> dict | None:
        """The parsed `dataset.yaml` (or the dataset config called `name`), or None if there is none;
        PrepError if it cannot be read or parsed."""
        path = self.meta / name
        if not path.exists():
            return None
        return read_dataset_yaml(path)

    def tar_file_id(self, shard: str) -> int:
        """The position of a shard in `.info.json`, which is its `tar_file_id` in sqlite."""
        try:
            return self._shard_ids[shard]
        except KeyError:
            raise PrepError(
                f"{shard} is not a shard of {self.root} (it is not listed in .info.json)."
            ) from None

    def shard_path(self, shard: str) -> Path:
        """The shard's file: at its `local_path`, the shard's own name for any name a local file can
        have, and the name a bucket dataset's local mirror holds it under for a longer one."""
        return self.root / local_path(shard)

    def tar_index_path(self, shard: str) -> Path:
        """The shard's `.tar.idx`, at its `local_path` (see `shard_path`)."""
        return self.root / local_path(tar_index_name(shard))

    def read_tar_index(self, shard: str) -> np.ndarray:
        """A shard's `.tar.idx` as uint64 offsets: sample starts, then the end of the last sample."""
        dtype = np.dtype(f"<u{TAR_INDEX_ENTRY.size}")
        return np.fromfile(self.tar_index_path(shard), dtype=dtype).astype(np.int64)

    @property
    def sqlite_path(self) -> Path:
        return self.meta / INDEX_SQLITE

    def other_dataset_configs(self, name: str = DATASET_YAML) -> list[str]:
        """The YAML files of `.nv-meta` besides `name` and the split file that hold a `sample_type` (or a
        crude dataset's `__class__`): dataset configs written under another name (`prepare
        --dataset-yaml-name`, which may name a sub-folder: `configs/x.yaml`), which energon loads when told
        (`dataset_config=`); named relative to `.nv-meta`, those at its top first."""
        found = []
        relative = (path.relative_to(self.meta).as_posix() for path in self.meta.rglob("*.yaml"))
        for config_name in sorted(relative, key=lambda text: (text.count("/"), text)):
            if config_name in (name, SPLIT_YAML):
                continue
            try:
                config = read_dataset_yaml(self.meta / config_name)
            except PrepError:
                continue
            if ("sample_type" in config or "__class__" in config) and "splits" not in config:
                found.append(config_name)
        return found

    # -- bytes ------------------------------------------------------------------------------------
    def _take_fd(self, tar_file_id: int) -> int:
        """An open descriptor of a shard, not closed until handed back with `_give_back_fd`."""
        with self._fd_lock:
            fd = self._fds.get(tar_file_id)
            if fd is None:
                fd = self._open_shard(tar_file_id)
                self._fds[tar_file_id] = fd
            else:
                self._fds.move_to_end(tar_file_id)
            self._fd_users[fd] = self._fd_users.get(fd, 0) + 1
        return fd

    def _give_back_fd(self, fd: int) -> None:
        with self._fd_lock:
            users = self._fd_users.pop(fd) - 1
            if users:
                self._fd_users[fd] = users

    def expect_unchanged(self, shards: Iterable[str]) -> dict[str, tuple[int, int]]:
        """Record the size and modification time of these shards' files now (one stat each; a shard that
        cannot be stat'ed, when it first opens). From then on a shard file that opens with others (it was
        replaced or rewritten) raises ShardChangedError instead of being read at the index's offsets. A
        descriptor opened before keeps reading its own file, the one the index describes.

        Returns the shards already changed since they were indexed, as far as their size tells (shorter
        than their last sample's end: truncated, or another file in their place), as shard -> (file size,
        end of its last sample); reading them raises ShardChangedError too. A shard rewritten in place to
        the same size or longer is not seen, here or later."""
        ends = self.index.shard_ends(len(self.shards))
        recorded: dict[int, tuple[int, int]] = {}
        short: dict[str, tuple[int, int]] = {}
        for shard in shards:
            try:
                found = os.stat(self.shard_path(shard))
            except OSError:
                continue
            tar_file_id = self.tar_file_id(shard)
            end = ends[tar_file_id]
            if end is not None and found.st_size < end and stat.S_ISREG(found.st_mode):
                short[shard] = (found.st_size, end)
                self._changed_before.add(tar_file_id)
            recorded[tar_file_id] = (found.st_size, found.st_mtime_ns)
        self._shard_files = recorded
        return short

    def _open_shard(self, tar_file_id: int) -> int:
        """Open a shard file, closing unused ones to stay within OPEN_SHARD_FILES and the process's limit
        of open files, and check it is the file `expect_unchanged` recorded. Called with `_fd_lock` held."""
        if tar_file_id in self._changed_before:
            raise ShardChangedError(self.shards[tar_file_id])
        path = self.shard_path(self.shards[tar_file_id])
        if len(self._fds) >= OPEN_SHARD_FILES:
            self._close_unused(1)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as error:
            if error.errno != errno.EMFILE or not self._close_unused(len(self._fds)):
                raise
            fd = os.open(path, os.O_RDONLY)
        if self._shard_files is not None:
            found = os.fstat(fd)
            recorded = self._shard_files.setdefault(tar_file_id, (found.st_size, found.st_mtime_ns))
            if recorded != (found.st_size, found.st_mtime_ns):
                os.close(fd)
                raise ShardChangedError(self.shards[tar_file_id])
        return fd

    def _close_unused(self, count: int) -> int:
        """Close up to `count` shard files no read is using, least recently read first; how many."""
        unused = list(islice((shard for shard, fd in self._fds.items() if fd not in self._fd_users), count))
        for shard in unused:
            os.close(self._fds.pop(shard))
        return len(unused)

    def _range(self, location: PartLocation, offset: int, size: int | None) -> tuple[int, int]:
        """The shard offset and length of bytes `offset .. offset+size` of a part, clipped to the part."""
        available = max(location.size - offset, 0)
        return location.offset + offset, available if size is None else min(size, available)

    def read_part(self, location: PartLocation, offset: int = 0, size: int | None = None) -> bytes:
        """Bytes `offset .. offset+size` of a part (all of it by default), read with one `pread`."""
        start, size = self._range(location, offset, size)
        if size == 0:
            return b""
        fd = self._take_fd(location.tar_file_id)
        try:
            data = os.pread(fd, size, start)
            while len(data) < size:  # pread may return short on some filesystems; EOF: a truncated shard
                more = os.pread(fd, size - len(data), start + len(data))
                if not more:
                    raise OSError(f"{self.shards[location.tar_file_id]} ends inside a part (truncated shard)")
                data += more
        finally:
            self._give_back_fd(fd)
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
        fd = self._take_fd(location.tar_file_id)
        try:
            got = os.preadv(fd, [buffer], start, os.RWF_NOWAIT)
        except BlockingIOError:
            raise
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self._nowait_reads = False
            raise BlockingIOError(errno.EAGAIN, _CANNOT_TELL) from None
        finally:
            self._give_back_fd(fd)
        if got < size:  # partly cached, or the shard ends early: the waiting read sorts out which
            raise BlockingIOError(errno.EAGAIN, "part of the range is not in the page cache")
        return buffer

    def close(self) -> None:
        with self._fd_lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        self.index.close()

    def __enter__(self) -> PreparedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
