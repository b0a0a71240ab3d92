"""`prepare` of a dataset in object storage (`s3://bucket/path`, `msc://profile/path`), without downloading it.

The stages, around the local prepare (`prep.prepare.run.prepare`) it reuses as it is:

1. the bucket's shards listed with their sizes (`BucketShards`): every `*.tar`/`*.tgz` object below the
   address, hidden ones left out, in energon's order; the existing `.nv-meta` files (not `index.sqlite`)
   copied into a local folder under `--tmp-path`, so the wizard, `--tar-index-only` and a kept
   dataset.yaml work as for a local dataset; `index.sqlite` too where it has the media tables
   `prepare-media` adds, which a prepare keeps (as energon's, which copies the index down first): its
   first OLD_INDEX_HEAD bytes say whether it has them, so one of gigabytes without them is not downloaded
   (nor any, with `--media-metadata-by-*`: the media is then described anew, as by a local prepare);
2. each shard's headers walked by ranged GETs (`shard_rows_from_bucket`: `prep.storage.ranged` under
   `prep.tar.scan.RangedHeaderWalker`); a shard of small members is read whole instead and takes the
   vectorised scan. Finding that out costs two small requests before the whole read, so only the first
   shard is probed (`has_small_members`), before any is scanned: when its members are small, every shard
   (those of a dataset are alike) is read whole in one request, and one that has big members after all
   is indexed all the same, at the cost of its bytes. The walk waits on the network and then on the
   GIL, so shards go in batches to `--num-workers` processes (`prep.processes.ordered_map`), each
   scanning its batch in a few threads with a client of its own; a small run, or one worker, stays in
   this process's threads. With `--engine ray` every batch is a Ray task instead, on any node of the
   cluster, its client made there (`ObjectStore.for_other_machines`: with the keys this machine found);
3. the index built and committed in the local folder, exactly as a local prepare builds it (a file whose
   name has a part too long for a local file at its `local_path`); with `--media-metadata-by-*`, its
   media parts described into it as a local prepare describes them, each shard read by ranged GETs of
   the bytes its parts' headers need (`bucket_media_reads`), a few shards at a time in threads.
   `index.sqlite` (1.2 GB for 10M samples) goes up while it is written: its parts in a multipart upload
   as the pages in them are written for good, while the shards are still scanned
   (`prep.storage.upload.GrowingUpload`); the upload is completed in its turn below, and nothing is
   visible under its name before (an index that gets media tables goes up whole: `adds_media`);
4. uploaded (`prep.storage.upload`): the `.tar.idx` files, then `.nv-meta`'s files with `.info.json`
   (the file energon's loader looks for to call a dataset prepared) last, so a reader never sees a
   half-written index; over an index already there, its `.info.json` is withdrawn first, so a failure
   in the upload leaves a dataset energon calls not prepared, never a mixed one. Where the bucket holds
   no index, the `.tar.idx` files go up as soon as every shard is indexed (`BucketShards.indexed`),
   beside `index.sqlite` and the rest, and a run that fails before its upload deletes them again (with
   any an earlier failed run had left under their names): a failure before the upload leaves none of
   the run's files in the bucket. Before any of it goes up, the multipart uploads an earlier run killed
   mid-upload left for these files are aborted (`prep.storage.upload.abort_earlier_uploads`, from a
   listing taken at the start, before this run uploads anything).

Nothing locks the bucket: the local lock covers only the folder under `--tmp-path`, so two prepares of
one bucket dataset at once are the user's to avoid.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from prep.engines import LOCAL, RAY
from prep.errors import PrepError, ShardError
from prep.index.format import INDEX_SQLITE, META_DIR, SHARD_SUFFIXES, tar_index_name
from prep.index.group import walked_rows
from prep.index.media import (
    FileReads,
    FilesMedia,
    Parts,
    RunTasks,
    ShardMedia,
    ShardReads,
    broken_file,
    describe_parts,
)
from prep.index.rows import ShardRows
from prep.index.shard_list import exclude_shards, shard_sort_key
from prep.index.sqlite import may_have_media_tables
from prep.index.staging import local_path
from prep.media.describe import MediaRow, describe_part
from prep.media.filter import AV, MediaFilter
from prep.media.images import MediaError, ReadAt
from prep.prepare.resume import FORMAT, ShardCheckpoint
from prep.prepare.run import PrepareOptions, ShardProgress, ShardTask, Wizard, prepare
from prep.processes import ordered_map
from prep.storage.address import ObjectAddress, is_plain_name, require_address
from prep.storage.ranged import FIRST_WINDOW, RangedObject
from prep.storage.scratch import resume_folder_for, scratch_folder
from prep.storage.store import IncompleteUpload, ObjectInfo, ObjectStore, OneVersion, StorageError, open_store
from prep.storage.upload import (
    EarlyUpload,
    GrowingUpload,
    Note,
    abort_earlier_uploads,
    earlier_uploads,
    unheard,
    upload_dataset,
    upload_early,
)
from prep.tar.fields import BLOCK
from prep.tar.scan import HeaderWalker, RangedHeaderWalker, check_not_compressed

#: Shards scanned at once in one process (I/O-bound threads; a shard of small members is held whole
#: while scanned).
SCAN_THREADS = 8
#: A shard of small members up to this size is read whole (one request, the vectorised scan); a bigger
#: one is walked by ranged reads all the same, which read it through a window of bounded size: the memory
#: a scan holds stays this times the threads, whatever the shards' size.
WHOLE_SHARD_BYTES = 32 * 1024 * 1024
#: Threads in each worker process, which is also the shards in each of its batches.
WORKER_THREADS = 4
#: Shards smaller than this in all are scanned in this process's threads, where they go quicker: the
#: workers pay for their own clients and for sending rows back (measured on moto: 49 and 53 MB of shards
#: went 20% quicker in threads, 205 and 489 MB 13% quicker in 2 workers).
MIN_BYTES_FOR_WORKERS = 128 * 1024 * 1024
#: The first bytes of an old `index.sqlite` read to tell whether it has media tables: its first page
#: whole, whatever the page size (sqlite's largest), where its schema begins (`may_have_media_tables`).
OLD_INDEX_HEAD = 64 * 1024
#: A shard to scan: (name, size, or None if the bucket does not have it, tar_file_id, read it whole at
#: once rather than probe its first members, its ETag as listed).
ScanJob = tuple[str, "int | None", int, bool, str]
#: The first read at a media part far from the last one read (a new request): an image's header is in it
#: (a JPEG's size after a long EXIF segment takes one request more); parts closer together than
#: READ_THROUGH are read through, in growing windows, as the header walk reads a shard.
MEDIA_WINDOW = 16 * 1024

T = TypeVar("T")


def shard_rows_from_bucket(
    store: ObjectStore,
    shard: str,
    size: int,
    tar_file_id: int,
    fetched: list[int] | None = None,
    whole: bool = False,
    etag: str | None = None,
) -> ShardRows:
    """One shard's index rows, read from the bucket as a local prepare reads them from a file; ShardError
    as there. With `whole`, a shard up to WHOLE_SHARD_BYTES is read whole in one request, without first
    probing whether its members are small. Every read is of the shard's version listed with `etag` (or
    else of the first read's): a StorageError if it changes. The bytes fetched are added to `fetched[0]`
    if given."""
    reader = _ranged(store, shard, size, version=OneVersion(store.url(shard), etag))
    try:
        if whole and size <= WHOLE_SHARD_BYTES:
            data = reader.whole()
            check_not_compressed(shard, data[:BLOCK])
            return walked_rows(HeaderWalker(shard, data), shard, tar_file_id)
        check_not_compressed(shard, reader[:BLOCK])
        ranged = RangedHeaderWalker(shard, reader)
        small = size <= WHOLE_SHARD_BYTES and ranged.mostly_small_members()
        walker = HeaderWalker(shard, reader.whole()) if small else ranged
        return walked_rows(walker, shard, tar_file_id)
    finally:
        if fetched is not None:
            fetched[0] += reader.fetched


def _ranged(
    store: ObjectStore, shard: str, size: int, window: int = FIRST_WINDOW, version: OneVersion | None = None
) -> RangedObject:
    """`shard` in `store`, read through ranged GETs as a bytes buffer (of one `version`, if given)."""
    return RangedObject(
        lambda offset, length: store.read(shard, offset, length, size, version),
        size,
        window=window,
        name=shard,
    )


def bucket_media_reads(store: ObjectStore, sizes: Sequence[int | None]) -> ShardReads:
    """The media stage's reads (`prep.index.media.ShardReads`) of shards in `store` of `sizes` (one per
    shard, None for one the bucket does not have): each shard through one RangedObject, in SCAN_THREADS
    threads; a shard being described when the run ends (an error, an interrupt) stops at its next part."""
    stop = threading.Event()
    return ShardReads(sizes, functools.partial(_describe_bucket_shard, store, stop), _threads_until(stop))


def _threads_until(stop: threading.Event) -> RunTasks:
    """The media stage's `run` in SCAN_THREADS threads of this process (its `workers` unused), setting
    `stop` when the run ends (`_in_threads`)."""
    return lambda describe, tasks, _: _in_threads(describe, tasks, SCAN_THREADS, stop)


def _missing(store: ObjectStore, shard: str) -> ShardError:
    """The error of a shard that `.info.json` names and the bucket does not have."""
    return ShardError(shard, f"is not in {store.address} (listed in .info.json, but missing).")


class _Stopped(Exception):
    """The run ended while this shard was described: what it found is not wanted."""


def _describe_bucket_shard(
    store: ObjectStore, stop: threading.Event, size: int | None, shard: str, parts: Parts, media: MediaFilter
) -> ShardMedia | ShardError:
    """One shard's media parts described from the bucket, as `describe_shard_media` describes a local
    file's, until `stop` is set; a StorageError (the bucket unreachable for good) is raised."""
    if size is None:
        return _missing(store, shard)
    reader = _ranged(store, shard, size, MEDIA_WINDOW)

    def open_part(offset: int, length: int) -> ReadAt:
        if stop.is_set():
            raise _Stopped(shard)
        return _read_at(reader, offset, length)

    try:
        return describe_parts(shard, parts, media, open_part)
    except StorageError:
        raise
    except PrepError as error:  # a missing optional library: the same for every shard
        return ShardError(shard, str(error))


def _read_at(reader: RangedObject, offset: int, size: int) -> ReadAt:
    """A ReadAt over the `size` bytes at `offset` of what `reader` reads."""

    def read(at: int, count: int) -> bytes:
        count = max(0, min(count, size - at))
        return reader[offset + at : offset + at + count] if count else b""

    return read


def bucket_file_reads(store: ObjectStore) -> FileReads:
    """The media stage's reads (`prep.index.media.FileReads`) of a folder dataset's files in `store`: each
    object through a RangedObject of its own, batches of files in SCAN_THREADS threads."""
    stop = threading.Event()
    return FileReads(store, functools.partial(_describe_bucket_files, stop), _threads_until(stop))


def _describe_bucket_files(
    stop: threading.Event, store: ObjectStore, files: list[tuple[str, int]], media: MediaFilter
) -> FilesMedia | PrepError:
    """`prep.index.media.describe_files` of objects in the bucket, until `stop` is set; a StorageError is
    raised."""
    rows: list[MediaRow] = []
    skipped_av = 0
    for name, size in files:
        if stop.is_set():
            raise _Stopped(name)
        reader = _ranged(store, name, size, MEDIA_WINDOW // 2)  # (read from its start: the window doubles)
        try:
            kind, row = describe_part(
                name, _read_at(reader, 0, size), size, media, name=name.rpartition("/")[2]
            )
        except MediaError as error:
            return broken_file(store.url(name), error)
        except StorageError:
            raise
        except PrepError as error:  # a missing optional library
            return error
        if row is not None:
            rows.append(row)
        elif kind == AV:
            skipped_av += 1
    return rows, skipped_av


def has_small_members(store: ObjectStore, shard: str, size: int | None) -> bool:
    """Whether the first members of `shard` are small (`mostly_small_members`), from a small read or two
    at its start: then shards like it are best read whole. False for a shard that cannot tell (missing,
    compressed, not a tar): its scan says what is wrong with it."""
    if size is None:
        return False
    reader = _ranged(store, shard, size)
    try:
        check_not_compressed(shard, reader[:BLOCK])
        return RangedHeaderWalker(shard, reader).mostly_small_members()
    except ShardError:
        return False


class BucketShards:
    """The shards of a dataset in a bucket: a `prep.prepare.run.ShardSource`. `--resume` keeps their rows
    in `resume_folder`, a local folder that stays the same for the same address and `--tmp-path`."""

    def __init__(
        self,
        store: ObjectStore,
        resume_folder: Path | None = None,
        *,
        engine: str = LOCAL,
        ray_address: str | None = None,
    ) -> None:
        self.store = store
        #: Where the shards are scanned (`--engine`): this machine's threads and processes, or Ray tasks.
        self.engine, self.ray_address = engine, ray_address
        self.name = str(store.address)
        self.objects: dict[str, ObjectInfo] = {}
        self.resume_folder = resume_folder or resume_folder_for(store.address, None)
        #: A local folder for `indexed` to link the `.tar.idx` files into (None: they go up at the end).
        self.early_folder: Path | None = None
        #: The `.tar.idx` files on their way up beside the rest of the index, if `indexed` began that.
        self.early: EarlyUpload | None = None
        #: `index.sqlite` on its way up while it is written, if `index_growth` began that.
        self.growing: GrowingUpload | None = None
        #: Whether media tables are added to the new index once it is built (the old index's, copied
        #: down, or those `--media-metadata-by-*` describes): sqlite writes their pages where it chooses,
        #: so the new index goes up whole at the end.
        self.adds_media = False

    def list_objects(self) -> list[ObjectInfo]:
        listed = self.store.list()
        self.objects = {info.name: info for info in listed}
        return listed

    def list_shards(self, exclude: str | None) -> list[str]:
        if not self.objects:
            self.list_objects()
        found = [
            name
            for name in self.objects
            if name.endswith(SHARD_SUFFIXES) and not any(part.startswith(".") for part in name.split("/"))
        ]
        shards = exclude_shards(sorted(found, key=shard_sort_key), exclude)
        if not shards:
            excluded = f" (after --exclude {exclude!r})" if exclude else ""
            raise PrepError(
                f"No shards found under {self.store.where()}{excluded}: prepare looks for *.tar and *.tgz"
                " objects below it, skipping hidden ones. Point it at the prefix that holds the shards."
                + ("" if self.objects else self.store.in_other_unicode_form())
            )
        return shards

    def scan(self, tasks: list[ShardTask], workers: int) -> Generator[ShardRows | ShardError]:
        jobs: list[ScanJob] = []
        for _, shard, tar_file_id, _ in tasks:
            info = self.objects.get(shard)
            size, etag = (None, "") if info is None else (info.size, info.etag)
            jobs.append((shard, size, tar_file_id, False, etag))
        if not jobs:
            return
        whole = has_small_members(self.store, *jobs[0][:2])  # then the dataset's shards are read whole
        jobs = [(shard, size, tar_file_id, whole, etag) for shard, size, tar_file_id, _, etag in jobs]
        if self.engine == RAY:
            yield from self._scanned_by_ray(jobs, workers)
            return
        total = sum(size or 0 for _, size, _, _, _ in jobs)
        if workers <= 1 or len(jobs) <= WORKER_THREADS or total < MIN_BYTES_FOR_WORKERS:
            yield from _scanned_in_threads(self.store, jobs, SCAN_THREADS)
            return
        batches = [(self.store, jobs[at : at + WORKER_THREADS]) for at in range(0, len(jobs), WORKER_THREADS)]
        what = f"scanning shards in {self.store.address}"
        for results in ordered_map(
            _scan_batch, batches, min(workers, len(batches)), what=what, preload="prep.tar.scan"
        ):
            yield from results

    def _scanned_by_ray(self, jobs: list[ScanJob], workers: int) -> Iterator[ShardRows | ShardError]:
        """The jobs' results in job order, scanned by Ray tasks (`prep.engines.ray_cluster`), each a batch
        of shards in its threads as a worker process scans them: on whichever node runs it, with the
        store's client made there (from the same address and credentials)."""
        from prep.engines.ray_cluster import RayEngine  # Ray is slow to import: only for --engine ray

        store = self.store.for_other_machines()
        batches = [(store, jobs[at : at + WORKER_THREADS]) for at in range(0, len(jobs), WORKER_THREADS)]
        with RayEngine(self.ray_address, workers) as cluster:
            for results in cluster.ordered_map(
                _scan_batch,
                batches,
                what=f"scanning shards in {self.store.address}",
                name=lambda batch: ", ".join(job[0] for job in batch[1]),
            ):
                yield from results

    def read_part(self, shard: str, offset: int, size: int) -> bytes:
        return self.store.read(shard, offset, size)

    def indexed(self, tar_indexes: dict[str, Path]) -> None:
        """Begin uploading the `.tar.idx` files, beside the rest of the index, where the bucket holds no
        prepared dataset (`upload_early`); they are read from hard links in `early_folder`, since the staged
        files are renamed when the index is committed. Without links (another file system), they go up at
        the end."""
        if self.early_folder is None:
            return
        links = {}
        try:
            for name, staged in tar_indexes.items():
                links[name] = self.early_folder / local_path(name)
                links[name].parent.mkdir(parents=True, exist_ok=True)
                os.link(staged, links[name])
        except OSError:
            return
        self.early = upload_early(self.store, self.objects)
        if self.early is not None:
            for name, link in links.items():
                self.early.send(name, link)

    def media_reads(self, shards: list[str]) -> ShardReads:
        return bucket_media_reads(
            self.store, [info.size if (info := self.objects.get(shard)) else None for shard in shards]
        )

    def index_growth(self, path: Path) -> GrowingUpload | None:
        """`index.sqlite`'s upload, begun while it is written (`GrowingUpload`): on a dataset of 10M
        samples the file is 1.2 GB, which would otherwise go up after everything else. None where the old
        index is to get media tables (`adds_media`)."""
        if self.adds_media:
            return None
        self.growing = GrowingUpload(self.store, f"{META_DIR}/{INDEX_SQLITE}", path)
        return self.growing

    def checkpoint(self) -> ShardCheckpoint:
        """The shards' rows kept in `resume_folder`, each keyed by the shard's size and ETag as listed."""

        def key(shard: str) -> tuple[int, str, int, int | str]:
            info = self.objects.get(shard)
            if info is None:
                raise FileNotFoundError(shard)  # the scan says what is wrong with it
            return (FORMAT, shard, info.size, info.etag)

        return ShardCheckpoint(self.resume_folder, key=key)


def _scanned_in_threads(
    store: ObjectStore, jobs: Sequence[ScanJob], threads: int
) -> Iterator[ShardRows | ShardError]:
    """Each job's rows (or ShardError), in job order, scanned in up to `threads` threads of this process;
    a StorageError (the bucket unreachable for good) is raised, and the jobs not started are dropped."""
    return _in_threads(_scan_one, [(store, *job) for job in jobs], threads)


def _in_threads(
    function: Callable[..., T], tasks: Sequence[tuple], threads: int, stop: threading.Event | None = None
) -> Generator[T]:
    """`function(*task)` for each task, results in task order, in up to `threads` threads of this process.
    The tasks are taken in the calling thread (they may be made as they are asked for), at most twice
    `threads` ahead of the result given; an error is raised as its task's result comes. When the caller
    stops taking results (an error, an interrupt: it closes the generator), the tasks not started are
    dropped, `stop` is set for those running, and they are waited for."""
    with ThreadPoolExecutor(max(1, min(threads, len(tasks))), "shardprep-bucket") as pool:
        futures: deque[Future[T]] = deque()
        try:
            for task in tasks:
                if len(futures) >= 2 * threads:
                    yield futures.popleft().result()
                futures.append(pool.submit(function, *task))
            while futures:
                yield futures.popleft().result()
        finally:
            if stop is not None:
                stop.set()
            for future in futures:
                future.cancel()


def _scan_batch(store: ObjectStore, jobs: Sequence[ScanJob]) -> list[ShardRows | ShardError]:
    """A worker process's task: a batch of shards scanned in its threads, one shard each."""
    return list(_scanned_in_threads(store, jobs, len(jobs)))


def _scan_one(
    store: ObjectStore, shard: str, size: int | None, tar_file_id: int, whole: bool, etag: str
) -> ShardRows | ShardError:
    if size is None:
        return _missing(store, shard)
    try:
        return shard_rows_from_bucket(store, shard, size, tar_file_id, whole=whole, etag=etag)
    except ShardError as error:
        return error


def prepare_remote(
    address: str | ObjectAddress,
    options: PrepareOptions,
    wizard: Wizard | None = None,
    progress: ShardProgress | None = None,
    media_progress: ShardProgress | None = None,
    *,
    tmp_path: str | Path | None = None,
    store: ObjectStore | None = None,
    note: Note = unheard,
) -> dict[str, int] | None:
    """Prepare the dataset at a bucket address, building its index under `tmp_path` (a temporary folder
    by default, removed afterwards) and uploading it; the shard counts, or None if the wizard declined.
    `media_progress` is told of the media stage's shards, as `progress` is of the indexing; `note` is told
    what the user should hear besides (earlier runs' incomplete uploads aborted)."""
    address = require_address(address)
    if options.fix_duplicates:
        raise PrepError(
            "--fix-duplicates renames members inside the shards, which objects in a bucket cannot have done"
            " in place; fix a local copy and upload it."
        )
    store = store or open_store(address)
    source = BucketShards(
        store, resume_folder_for(address, tmp_path), engine=options.engine, ray_address=options.ray_address
    )
    with scratch_folder(tmp_path, "prepare") as root:
        source.early_folder = root.parent / "uploading"
        _copy_existing_meta(source, root, keep_media=options.media_filter is None)
        source.adds_media = source.adds_media or options.media_filter is not None
        leftovers = earlier_uploads(store, note)
        try:
            return _prepare_and_upload(
                root, options, wizard, progress, media_progress, source, leftovers, note
            )
        finally:
            if source.growing is not None:  # (what it did not finish: a failure, or --tar-index-only)
                source.growing.close()


def _prepare_and_upload(
    root: Path,
    options: PrepareOptions,
    wizard: Wizard | None,
    progress: ShardProgress | None,
    media_progress: ShardProgress | None,
    source: BucketShards,
    leftovers: list[IncompleteUpload],
    note: Note,
) -> dict[str, int] | None:
    """`prepare_remote`'s index built in `root` and uploaded."""
    store = source.store
    try:
        shard_counts = prepare(root, options, wizard, progress, media_progress, source=source)
    except BaseException:
        if source.early is not None:  # a bucket that held no index holds none of this run's files
            source.early.withdraw()
        raise
    if shard_counts is not None:
        built = [tar_index_name(shard) for shard in shard_counts]
        built += [  # sub-folders too: --dataset-yaml-name configs/x.yaml
            path.relative_to(root).as_posix()
            for path in sorted((root / META_DIR).rglob("*"))
            if path.is_file()
        ]
        abort_earlier_uploads(store, leftovers, built, note)
        upload_dataset(store, root, built, source.early, source.growing)
        source.checkpoint().remove()  # what an interrupted run kept is for an index now uploaded
        shutil.rmtree(source.resume_folder, ignore_errors=True)
    return shard_counts


def _copy_existing_meta(source: BucketShards, root: Path, keep_media: bool = True) -> None:
    """The bucket's `.nv-meta` files, in its sub-folders too (index.sqlite only where it has media tables to
    keep, unless not `keep_media`: the rest of it is rebuilt), into `root/.nv-meta`; not objects whose keys
    energon does not read as theirs (`is_plain_name`: a folder marker `.nv-meta/`, a `..` part that would
    leave `root`)."""
    prefix = META_DIR + "/"
    listed = source.list_objects()
    names = [info.name for info in listed if info.name.startswith(prefix) and is_plain_name(info.name)]
    names = [name for name in names if name != prefix + INDEX_SQLITE]
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)  # a sub-folder: configs/x.yaml
        (root / name).write_bytes(source.store.get(name))
    if keep_media:
        _copy_old_index_with_media(source, root)


def _copy_old_index_with_media(source: BucketShards, root: Path) -> None:
    """The bucket's `index.sqlite` into `root/.nv-meta`, where it has (or may have) media tables; its
    first OLD_INDEX_HEAD bytes tell, at their place in a sparse file of its size beside `root` (sqlite
    refuses a file shorter than its header says)."""
    name = f"{META_DIR}/{INDEX_SQLITE}"
    info = source.objects.get(name)
    if info is None:  # a first prepare
        return
    head = root.parent / f"old-{INDEX_SQLITE}-head"
    with open(head, "wb") as file:
        file.write(source.store.read(name, 0, OLD_INDEX_HEAD, info.size))
        file.truncate(info.size)
    try:
        if not may_have_media_tables(head):
            return
    finally:
        head.unlink()
    (root / META_DIR).mkdir(exist_ok=True)
    source.store.download(name, root / name, info.size)
    source.adds_media = True
