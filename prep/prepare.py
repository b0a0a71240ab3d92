"""`prepare`: index existing WebDataset shards and write energon's `.nv-meta`, in parallel and all-or-nothing.

    >>> from prep.prepare import prepare_dataset                    # doctest: +SKIP
    >>> prepare_dataset("/data/my-dataset", split_ratio="8,1,1")      # doctest: +SKIP

The steps are plain functions over plain data: find the shards (`shard_list`), index each one in a worker
(`shard_index`), insert the rows and write the small files into a staging folder (`index_writer`,
`staging`), then put everything in place at once. Questions and printing live in `prepare_cli`.
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing
import os
import signal
import stat
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from prep.errors import PrepError, ShardError
from prep.index_format import INDEX_SQLITE, INDEX_UUID, INFO_JSON, INFO_YAML, META_DIR, SPLIT_YAML
from prep.index_writer import (
    DuplicateKeyError,
    SqliteIndexWriter,
    info_json_text,
    info_yaml_text,
    new_index_uuid,
    split_yaml_text,
)
from prep.shard_index import MAX_PART_NAMES, ShardRows, shard_rows, tar_index_bytes
from prep.shard_list import exclude_shards, find_shards
from prep.split import parse_split_parts, parse_split_ratio, split_by_patterns, split_by_ratio
from prep.staging import Staging

#: How many shard errors one report lists before summarising the rest.
MAX_REPORTED_ERRORS = 10
#: Samples whose parts the wizard shows after indexing (energon shows two).
PREVIEW_SAMPLES = 2


@dataclass
class SplitSpec:
    """How shards are assigned to splits: by ratio (whole shards, optionally shuffled) or by patterns."""

    ratio: list[tuple[str, float]] | None = None
    patterns: list[tuple[str, str]] | None = None
    shuffle_seed: int | None = None

    def assign(self, shards: list[str]) -> dict[str, list[str]]:
        if self.patterns is not None:
            return split_by_patterns(shards, self.patterns)
        if self.ratio is not None:
            return split_by_ratio(shards, self.ratio, self.shuffle_seed)
        raise PrepError("A split is needed: give --split-ratio (e.g. 8,1,1) or --split-parts NAME:REGEX.")


@dataclass
class StagedIndex:
    """A dataset's new index, written to staging but not yet in place: `commit()` or `abort()` it."""

    root: Path
    shards: list[str]
    shard_counts: dict[str, int]
    part_names: list[str]
    staging: Staging
    file_mode: int | None
    #: The first samples of the first shard: [(key, [(part, offset, size)])], for the wizard's preview.
    first_samples: list[tuple[str, list[tuple[str, int, int]]]] = field(default_factory=list)

    def write_meta(self, name: str, text: str) -> None:
        """Write `.nv-meta/NAME` into the staged index, with the permissions energon gives its files."""
        path = self.staging.meta_file(name)
        path.write_text(text)
        if self.file_mode is not None:
            os.chmod(path, self.file_mode)

    def meta_exists(self, name: str) -> bool:
        """Whether `.nv-meta/NAME` exists (carried over from the previous index or written in this run)."""
        return self.staging.meta_file(name).is_file()

    def read_part(self, shard: str, offset: int, size: int) -> bytes:
        with open(self.root / shard, "rb") as file:
            return os.pread(file.fileno(), size, offset)

    def commit(self) -> None:
        self.staging.commit()

    def abort(self) -> None:
        self.staging.abort()


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


def reindexed_shards(root: Path, exclude: str | None = None) -> list[str]:
    """The shards --tar-index-only re-indexes: those of the existing `.info.json`, less --exclude."""
    check_dataset_root(root)
    shards = exclude_shards(indexed_shards(root), exclude)
    if not shards:
        raise PrepError(f"No shards left to index in {root} after --exclude {exclude!r}.")
    return shards


def check_dataset_root(root: Path) -> None:
    if not root.exists():
        raise PrepError(f"{root} does not exist. Give the folder that holds the dataset's shards.")
    if not root.is_dir():
        raise PrepError(f"{root} is not a folder. Give the folder that holds the dataset's shards.")


def is_prepared(root: Path) -> bool:
    """Whether `root` already has an energon index (`.nv-meta/.info.json` or the legacy `.info.yaml`)."""
    return (root / META_DIR / INFO_JSON).is_file() or (root / META_DIR / INFO_YAML).is_file()


def indexed_shards(root: Path) -> list[str]:
    """The shards of an existing index, in its `.info.json` order (what --tar-index-only re-indexes)."""
    import json

    info_json, info_yaml = root / META_DIR / INFO_JSON, root / META_DIR / INFO_YAML
    try:
        if info_json.is_file():
            info = json.loads(info_json.read_text())
        elif info_yaml.is_file():
            import yaml

            info = yaml.safe_load(info_yaml.read_text())
        else:
            raise PrepError(
                f"{root} has not been prepared yet ({META_DIR}/{INFO_JSON} is missing), so there is no shard"
                " list to re-index. Run prepare without --tar-index-only."
            )
        return list(info["shard_counts"])
    except (ValueError, KeyError, TypeError) as error:
        raise PrepError(f"{root / META_DIR} holds an unreadable shard list ({error}). Run a full prepare.") from None


def _index_task(root: str, shard: str, tar_file_id: int, staged_tar_index: str) -> ShardRows | ShardError:
    """Worker: index one shard and write its staged `.tar.idx`. Errors come back as values, not raises."""
    try:
        rows = shard_rows(os.path.join(root, shard), shard, tar_file_id)
        with open(staged_tar_index, "wb") as file:
            file.write(tar_index_bytes(rows.offsets()))
        return rows
    except ShardError as error:
        return error
    except OSError as error:
        return ShardError(shard, f"could not be indexed: {error.strerror or error}.")
    finally:
        _release_freed_memory()


def _release_freed_memory() -> None:
    """Hand memory freed after a shard back to the system (glibc keeps it otherwise), so a long run's
    footprint is that of one shard, not of the fragments of all of them."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _worker_start() -> None:
    """Workers leave Ctrl-C and SIGTERM to the main process, which stops them and cleans up. Each loads
    the scanner (and numpy, without BLAS threads it never uses) as it starts, while the main process,
    which needs neither, goes on preparing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import prep.tar_scan  # noqa: F401


def _index_in_parallel(tasks: list[tuple], workers: int) -> Iterator[ShardRows | ShardError]:
    """Results in shard order, with at most a few shards in flight so memory stays flat.

    A worker that dies (killed, out of memory) ends the run with an error instead of a hang, and on any
    exit the workers are stopped before the caller removes the staged files they write.
    """
    if workers <= 1 or len(tasks) <= 1:
        for task in tasks:
            yield _index_task(*task)
        return
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_start)
    try:
        pending: deque = deque()
        upcoming = iter(tasks)
        for task in islice(upcoming, workers + 1):
            pending.append(executor.submit(_index_task, *task))
        while pending:
            try:
                result = pending.popleft().result()
            except BrokenProcessPool:
                raise PrepError(
                    "A process indexing shards died unexpectedly (killed, or out of memory?). Nothing was"
                    " written; run prepare again, with fewer --num-workers if memory is short."
                ) from None
            for task in islice(upcoming, 1):
                pending.append(executor.submit(_index_task, *task))
            yield result
    finally:
        for process in list(getattr(executor, "_processes", {}).values()):
            process.terminate()
        executor.shutdown(wait=True, cancel_futures=True)


def _permissions(root: Path, first_shard: Path) -> tuple[int | None, int | None]:
    """energon's permissions for new index files: the folder's mode plus rwx for the owner, the first
    shard's mode plus rw for the owner."""
    try:
        meta_mode = stat.S_IMODE(root.stat().st_mode) | 0o700
        file_mode = stat.S_IMODE(first_shard.stat().st_mode) | 0o600
        return meta_mode, file_mode
    except OSError:
        return None, None


def _shard_errors_report(errors: list[PrepError]) -> PrepError:
    if len(errors) == 1:
        return errors[0]
    lines = [f"{len(errors)} problems; nothing was written and the previous index is untouched:"]
    lines += [f"  - {error}" for error in errors[:MAX_REPORTED_ERRORS]]
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"  ... and {len(errors) - MAX_REPORTED_ERRORS} more.")
    return PrepError("\n".join(lines))


def stage_index(
    root: Path,
    shards: list[str],
    *,
    split: SplitSpec | None,
    num_workers: int | None = None,
    progress: Callable[[Iterator, int], Iterator] | None = None,
) -> StagedIndex:
    """Index `shards` under `root` into a staging area: `.tar.idx` files, `index.sqlite`, `index.uuid`,
    `.info.json` and, when `split` is given, `split.yaml`. Nothing is in place until `commit()`.

    With `split=None` (energon's --tar-index-only) `.info.json` and `split.yaml` are not rewritten.
    """
    if not shards:
        raise PrepError(f"No shards to index under {root}.")
    workers = max(1, min(num_workers or len(os.sched_getaffinity(0)), len(shards)))
    meta_mode, file_mode = _permissions(root, root / shards[0])
    staging = Staging(root, meta_mode)
    try:
        staged = StagedIndex(root, shards, {}, [], staging, file_mode)
        _index_into(staged, split, workers, progress)
        return staged
    except BaseException:
        staging.abort()
        raise


def _index_into(
    staged: StagedIndex,
    split: SplitSpec | None,
    workers: int,
    progress: Callable[[Iterator, int], Iterator] | None,
) -> None:
    root, shards, staging = staged.root, staged.shards, staged.staging
    tasks = [(str(root), shard, i, str(staging.tar_index_file(shard))) for i, shard in enumerate(shards)]
    writer = SqliteIndexWriter(staging.meta_file(INDEX_SQLITE), shards)
    errors: list[PrepError] = []
    part_names: set[str] = set()
    try:
        results = _index_in_parallel(tasks, workers)
        if progress is not None:
            results = progress(results, len(tasks))
        for result in results:
            _release_freed_memory()  # the previous shard's rows are gone now
            if isinstance(result, ShardError):
                errors.append(result)
                continue
            if errors:
                continue  # keep scanning to report every bad shard, but stop building
            try:
                writer.add_rows(result)
            except DuplicateKeyError as error:
                errors.append(error)
                continue
            staged.shard_counts[result.shard] = result.count
            if len(part_names) < MAX_PART_NAMES:
                part_names.update(result.distinct_part_names())
            if result.tar_file_id == 0:
                staged.first_samples = result.first_samples(PREVIEW_SAMPLES)
        if errors:
            raise _shard_errors_report(errors)
        # sqlite builds the indexes without holding the GIL: meanwhile load what writes the YAML files.
        loading = threading.Thread(target=importlib.import_module, args=("yaml",), daemon=True)
        loading.start()
        writer.finish()
        loading.join()
    except BaseException:
        writer.abort()
        raise
    if staged.file_mode is not None:
        os.chmod(staging.meta_file(INDEX_SQLITE), staged.file_mode)
    _chmod_tar_indexes(staged)
    staged.part_names = sorted(part_names)
    staged.write_meta(INDEX_UUID, new_index_uuid())
    counts = staged.shard_counts
    if split is None:
        info_yaml = staging.meta_file(INFO_YAML)
        if info_yaml.is_file() and not staging.meta_file(INFO_JSON).is_file():
            import json

            import yaml

            staged.write_meta(INFO_JSON, json.dumps(yaml.safe_load(info_yaml.read_text()), indent=2))
        return
    staged.write_meta(INFO_JSON, info_json_text(counts))
    if staging.meta_file(INFO_YAML).is_file():
        staged.write_meta(INFO_YAML, info_yaml_text(counts))
    staged.write_meta(SPLIT_YAML, split_yaml_text(split.assign(shards)))


def _chmod_tar_indexes(staged: StagedIndex) -> None:
    """Each `.tar.idx` gets its shard's mode plus rw for the owner, as energon does."""
    for (staged_path, _), shard in zip(staged.staging.staged_indexes, staged.shards, strict=True):
        try:
            os.chmod(staged_path, stat.S_IMODE((staged.root / shard).stat().st_mode) | 0o600)
        except OSError:
            pass


def prepare_dataset(
    root: str | Path,
    *,
    split_ratio: str | None = None,
    split_parts: list[str] | None = None,
    shuffle_seed: int | None = 42,
    exclude: str | None = None,
    num_workers: int | None = None,
    tar_index_only: bool = False,
    dataset_yaml: str | None = None,
    dataset_yaml_name: str = "dataset.yaml",
) -> dict[str, int]:
    """Prepare the dataset at `root` non-interactively and return its shard counts.

    `split_ratio` ("8,1,1") assigns whole shards, shuffled with `random.Random(shuffle_seed)` (None keeps
    the sorted order); `split_parts` (["train:train/.*", ...]) assigns by brace-expanded regex instead.
    `dataset_yaml` is the text of `.nv-meta/<dataset_yaml_name>` to write with the index, if any.
    """
    root = Path(root)
    if tar_index_only:
        shards = reindexed_shards(root, exclude)
        split = None
    else:
        shards = list_dataset_shards(root, exclude)
        if split_parts:
            split = SplitSpec(patterns=parse_split_parts(split_parts))
        else:
            split = SplitSpec(ratio=parse_split_ratio(split_ratio or "1,0,0"), shuffle_seed=shuffle_seed)
    staged = stage_index(root, shards, split=split, num_workers=num_workers)
    try:
        if dataset_yaml is not None:
            staged.write_meta(dataset_yaml_name, dataset_yaml)
        staged.commit()
    except BaseException:
        staged.abort()
        raise
    return staged.shard_counts
