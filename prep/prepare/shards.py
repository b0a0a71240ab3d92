"""Which shards a prepare indexes, and the worker task that indexes one of them.

A full prepare takes every `*.tar`/`*.tgz` below the dataset folder (energon's glob and order); a
`--tar-index-only` run re-indexes the shards the existing `.info.json` lists. Either way `--exclude`
leaves out shards whose path matches. Each shard is then scanned in a worker process (`index_shard`),
which writes its staged `.tar.idx` and hands its rows back to the main process for sqlite.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

from prep.errors import PrepError, ShardError
from prep.index.format import INFO_JSON, META_DIR
from prep.index.group import shard_rows
from prep.index.meta import is_prepared, read_shard_counts
from prep.index.rows import ShardRows, write_tar_index
from prep.index.shard_list import exclude_shards, find_shards

#: How glibc's malloc serves a process that scans shards (`keep_scan_memory`): blocks up to
#: SCAN_MMAP_THRESHOLD from its heap, and up to SCAN_TRIM_THRESHOLD of freed memory kept there for the
#: next shard. With glibc's own thresholds, which move with what was last freed, a scan's temporaries (a
#: few MB a shard of tiny members) went back to the system and were faulted in again every shard: with
#: these, 2,000 shards of 5,000 members cost the workers 1.2 of their 7.6 CPU-s less (page faults 880k ->
#: 147k), and their peak memory is the same.
SCAN_MMAP_THRESHOLD = 32 << 20
SCAN_TRIM_THRESHOLD = 64 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters, from glibc's malloc.h
#: After a shard of this many members or more (or one that failed) a worker hands what its scan freed back
#: to the system (`release_freed_memory`), which costs ~1% of such a scan; a smaller shard leaves it for
#: the next one (handing it back after each of 2,000 shards of 5,000 members cost the workers a sixth of
#: their CPU time, in page faults to take it again).
TRIM_AFTER_PARTS = 100_000


def check_dataset_root(root: Path) -> None:
    if not root.exists():
        raise PrepError(f"{root} does not exist. Give the folder that holds the dataset's shards.")
    if not root.is_dir():
        raise PrepError(f"{root} is not a folder. Give the folder that holds the dataset's shards.")


def list_dataset_shards(root: Path, exclude: str | None = None) -> list[str]:
    """The shards `prepare` indexes under `root`, in energon's order; a PrepError if there are none."""
    check_dataset_root(root)
    shards = exclude_shards(find_shards(root), exclude)
    if not shards:
        excluded = f" (after --exclude {exclude!r})" if exclude else ""
        raise PrepError(
            f"No shards found under {root}{excluded}: prepare looks for *.tar and *.tgz files in it and its"
            " sub-folders, skipping hidden ones. Point it at the folder that holds the shards."
        )
    return shards


def reindexed_shards(root: Path, exclude: str | None = None, name: str | None = None) -> list[str]:
    """The shards --tar-index-only re-indexes: those of the existing `.info.json`, less --exclude (messages
    call the dataset `name`, by default its folder)."""
    check_dataset_root(root)
    name = name or str(root)
    if not is_prepared(root):
        raise PrepError(
            f"{name} has not been prepared yet ({META_DIR}/{INFO_JSON} is missing), so there is no shard list"
            " to re-index. Run prepare without --tar-index-only."
        )
    shards = exclude_shards(list(read_shard_counts(root / META_DIR)), exclude)
    if not shards:
        raise PrepError(f"No shards left to index in {name} after --exclude {exclude!r}.")
    return shards


def index_shard(root: str, shard: str, tar_file_id: int, staged_tar_index: str) -> ShardRows | ShardError:
    """Worker task: index one shard and write its staged `.tar.idx`. The shard's errors come back as
    values, not raised, so the main process can go on and report every bad shard at once; one writing
    the `.tar.idx` (a full disk) is the run's, and raised."""
    return scan_shard(root, shard, tar_file_id, staged_tar_index)


def scan_shard(
    root: str, shard: str, tar_file_id: int, staged_tar_index: str | None = None
) -> ShardRows | ShardError:
    """Index one shard, writing its staged `.tar.idx` if given (a Ray worker on another machine writes
    none: the driver does, from the rows). Errors come and go as from `index_shard`."""
    keep_scan_memory()
    rows = None
    try:
        try:
            rows = shard_rows(os.path.join(root, shard), shard, tar_file_id)
        except ShardError as error:
            return error
        except OSError as error:
            return ShardError(shard, f"could not be indexed: {error.strerror or error}.")
        if staged_tar_index is not None:  # raised: the staging's disk (full, say) is the run's problem
            write_tar_index(Path(staged_tar_index), rows)
        return rows
    finally:
        if rows is None or len(rows.part_sizes) >= TRIM_AFTER_PARTS:
            release_freed_memory()


@functools.cache
def keep_scan_memory() -> None:
    """Have glibc keep the memory shard scans free for the next shard (`SCAN_TRIM_THRESHOLD`), in this
    process, once; nothing where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, SCAN_MMAP_THRESHOLD)
        libc.mallopt(_M_TRIM_THRESHOLD, SCAN_TRIM_THRESHOLD)
    except (OSError, AttributeError):
        pass


def release_freed_memory() -> None:
    """Hand memory freed by a scan back to the system: glibc keeps up to tens of MB of it otherwise, which
    the next shards reuse."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
