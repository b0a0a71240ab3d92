"""A dataset built in a local folder, uploaded to its bucket in the order that keeps readers safe.

energon calls a dataset prepared when `.nv-meta/.info.json` (or the legacy `.info.yaml`) exists, and
reads the `.tar.idx` files and the rest of `.nv-meta` after that; a polylithic dataset is loaded through
its `metadataset.yaml`. These are the markers. An upload over a dataset already in the bucket first
deletes the old markers it is going to replace (so from then on the dataset reads as not prepared, never
as an old `.info.json` beside new shards and a new `index.sqlite`); then the shards and other data go
up, then the `.tar.idx` files, then `.nv-meta`'s other files, and the markers last, `metadataset.yaml`
after every `.info.json`. A run that fails on the way leaves a dataset energon refuses as not prepared
(run again), never a mixed one.

A run that fails aborts its own multipart uploads; one killed outright (SIGKILL, a lost machine) cannot,
and the parts it sent stay on the server (billed, on AWS, until aborted). So a run lists the incomplete
uploads below the dataset before it uploads anything (`earlier_uploads`: all of them are then an earlier
run's, whatever the server's clock says) and aborts those of the objects it is about to write
(`abort_earlier_uploads`); it leaves any other alone, as another writer's or someone else's to finish.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from prep.index.format import INFO_JSON, INFO_YAML, META_DIR, METADATASET_YAML
from prep.index.staging import local_path
from prep.storage.store import MAX_PARTS, PART_THREADS, IncompleteUpload, ObjectStore, StorageError

#: Files uploaded at once.
UPLOAD_THREADS = 16
#: `.nv-meta` files whose presence says "prepared" to energon: uploaded last, in this order.
PREPARED_MARKERS = (INFO_YAML, INFO_JSON)
#: What a polylithic dataset is loaded through: uploaded after every dataset's markers.
LAST_MARKER = METADATASET_YAML
#: Files suffixed so are the per-shard offsets energon's loader reads.
TAR_INDEX_SUFFIX = ".idx"
#: Says a line to the user (a note, not an error: the run goes on).
Note = Callable[[str], None]


def unheard(line: str) -> None:
    """The `Note` of a caller with no user to tell."""


def upload_order(names: list[str]) -> list[list[str]]:
    """`names` (relative paths) in batches to upload one after the other: data, `.tar.idx`, `.nv-meta`,
    then each marker alone (`markers`).

    >>> upload_order(["metadataset.yaml", ".nv-meta/.info.json", "a.tar.idx", ".nv-meta/index.sqlite", "a.tar"])
    [['a.tar'], ['a.tar.idx'], ['.nv-meta/index.sqlite'], ['.nv-meta/.info.json'], ['metadataset.yaml']]
    """
    last = markers(names)
    data = [name for name in names if not _is_meta(name) and not name.endswith(TAR_INDEX_SUFFIX)]
    data = [name for name in data if name not in last]
    offsets = [name for name in names if not _is_meta(name) and name.endswith(TAR_INDEX_SUFFIX)]
    meta = [name for name in names if _is_meta(name) and name not in last]
    return [batch for batch in (data, offsets, meta, *([name] for name in last)) if batch]


def markers(names: list[str]) -> list[str]:
    """The markers among `names`, in the order they go up: each dataset's `.info.yaml`/`.info.json`, then
    `metadataset.yaml`."""

    def rank(name: str) -> int:
        base = name.rpartition("/")[2]
        return PREPARED_MARKERS.index(base) if _is_meta(name) else len(PREPARED_MARKERS)

    found = [
        name
        for name in names
        if (_is_meta(name) and name.rpartition("/")[2] in PREPARED_MARKERS) or name == LAST_MARKER
    ]
    return sorted(found, key=rank)


def _is_meta(name: str) -> bool:
    return name.startswith(META_DIR + "/") or f"/{META_DIR}/" in name


def _replaced_markers(names: list[str]) -> list[str]:
    """The markers an upload of `names` replaces, with the other spelling of each prepared marker (an old
    `.info.yaml` where a `.info.json` goes up would still say "prepared")."""
    replaced = []
    for name in markers(names):
        if name == LAST_MARKER:
            replaced.append(name)
        else:
            folder = name.rpartition("/")[0]
            replaced += [f"{folder}/{marker}" for marker in PREPARED_MARKERS]
    return replaced


def delete_stale(store: ObjectStore, names: list[str]) -> None:
    """Delete the objects `names` (an old dataset's files the new one did not replace): its markers first,
    `metadataset.yaml` before each `.info.json`, so that no index is left naming a file already deleted
    (a run stopped on the way leaves files no marker names, never a marker naming files that are gone)."""
    withdrawn = list(reversed(markers(names)))
    for name in [*withdrawn, *sorted(set(names) - set(withdrawn))]:
        store.delete(name)


class EarlyUpload:
    """Files uploaded in threads while the caller goes on (a bucket prepare sends its `.tar.idx` files up
    while the rest of the index is written and uploaded; a bucket write sends each shard up as soon as it
    is written), each given to `send`;
    `upload_dataset` waits for them before the markers, and a run that fails before its upload calls
    `withdraw`."""

    def __init__(self, store: ObjectStore, threads: int = UPLOAD_THREADS) -> None:
        self.store = store
        #: The files sent: object name -> local path.
        self.files: dict[str, Path] = {}
        self._pool = ThreadPoolExecutor(threads, "shardprep-upload")
        self._uploads: dict[str, Future[None]] = {}
        #: Set by `withdraw`: the multipart uploads on their way send no further part.
        self._stopping = threading.Event()
        #: The first upload's failure, for `send` to raise.
        self._failure: BaseException | None = None

    def send(self, name: str, path: Path, then: Callable[[Path], None] | None = None) -> None:
        """Begin uploading one more file, `path`, as object `name`; `then(path)` once it is up. The first
        StorageError of an upload already over is raised here, so that the caller stops early."""
        if self._failure is not None:
            raise self._failure
        self.files[name] = path
        self._submit(name, path, then)

    def _submit(self, name: str, path: Path, then: Callable[[Path], None] | None = None) -> None:
        def upload() -> None:
            try:
                self.store.upload_file(name, path, self._stopping)
            except BaseException as error:
                self._failure = self._failure or error
                raise
            if then is not None:
                then(path)

        self._uploads[name] = self._pool.submit(upload)

    def wait(self) -> None:
        """Return once every file is up; the first StorageError is raised."""
        try:
            for upload in self._uploads.values():
                upload.result()
        finally:
            self.stop()

    def stop(self) -> None:
        """Upload no more of the files, and return once those on their way are up (or failed)."""
        self._pool.shutdown(cancel_futures=True)

    def withdraw(self) -> None:
        """Stop (a multipart upload on its way sends no further part), and delete what went up (as far as
        the bucket lets: this runs on the way out of a failed run, whose own error is the one to report)."""
        self._stopping.set()
        self.stop()
        for name, upload in self._uploads.items():
            if upload.done() and not upload.cancelled() and upload.exception() is None:
                try:
                    self.store.delete(name)
                except StorageError:
                    pass


class GrowingUpload:
    """A local file going up as one object while it is still being written, for a file that, past its
    first bytes, only grows at its end: the `index.sqlite` that `prep.index.btree` writes by appending
    pages (it tells a `prep.index.sqlite.IndexGrowth` how far the file is final). Each whole part after
    the first goes up in threads as soon as the file holds it for good (`settled`), while the shards are
    still being scanned; `finish` sends the first part (holding the first pages, which the writer rewrites
    at the end) and those left, then completes the object, when `upload_dataset` comes to its name.
    Nothing is visible under the name before that: an object already there stays as it is until then.

    Where the file may change anywhere (`unsettled`: sqlite took over the writing), a part fails for
    good, or the file needs more than MAX_PARTS parts, the parts sent are dropped and `finish` uploads the
    file whole, as `ObjectStore.upload_file` does; `close` drops whatever was not finished."""

    def __init__(self, store: ObjectStore, name: str, path: Path) -> None:
        self.store = store
        self.name = name
        self.part_size = store.part_size
        self._path = path
        self._pool = ThreadPoolExecutor(PART_THREADS, "shardprep-index-part")
        #: The file (opened at the first part to send: the writer makes it) and the upload, once begun.
        self._fd: int | None = None
        self._upload_id: str | None = None
        self._parts: list[Future[dict]] = []
        self._streaming = True

    @property
    def streamed_parts(self) -> int:
        """The parts sent, or on their way, while the file was being written."""
        return len(self._parts)

    def settled(self, head: int, end: int) -> None:
        """Bytes `head` to `end` of the file will not change again: send the whole parts among them, but
        the first."""
        if not self._streaming:
            return
        if head > self.part_size:
            self._give_up()
            return
        while (len(self._parts) + 2) * self.part_size <= end:
            number = len(self._parts) + 2
            if number >= MAX_PARTS:  # (room for the last part)
                self._give_up()
                return
            if self._upload_id is None:
                try:
                    self._fd = os.open(self._path, os.O_RDONLY)
                    self._upload_id = self.store.start_multipart(self.name)
                except (OSError, StorageError):  # the whole file goes up at the end, or says why not
                    self._give_up()
                    return
            offset = (number - 1) * self.part_size
            args = (self.name, self._upload_id, number, self._fd, offset, self.part_size)
            self._parts.append(self._pool.submit(self.store.send_part, *args))

    def unsettled(self) -> None:
        """Any byte of the file may change from now on: `finish` uploads it whole."""
        self._give_up()

    def finish(self, path: Path, stop: threading.Event | None = None) -> None:
        """Complete the object from the finished file (the one the parts were read from, which may have been
        renamed to `path` since): the parts not sent yet, then the request that joins them. A StorageError
        as `ObjectStore.upload_file` raises it, which `stop` stops as there."""
        try:
            answers = self._sent_answers()
            if answers is None:
                self.close()
                self.store.upload_file(self.name, path, stop)
                return
            assert self._fd is not None and self._upload_id is not None
            size = os.fstat(self._fd).st_size
            rest = [1, *range(len(answers) + 2, -(-size // self.part_size) + 1)]
            answers += self.store.send_parts(
                self.name, self._upload_id, self._fd, rest, size, self.part_size, stop
            )
            if stop is not None and stop.is_set():
                raise StorageError(
                    f"The upload of {self.store.url(self.name)} was stopped before it was finished."
                )
            self.store.finish_multipart(self.name, self._upload_id, answers)
            self._upload_id = None
        finally:
            self.close()

    def _sent_answers(self) -> list[dict] | None:
        """What the parts sent so far answered, or None where the file is not streamed (any more): a part
        that failed for good (maybe only for a while), or a file of more parts than S3 takes (it goes up in
        bigger ones), gives the streaming up."""
        if not self._streaming or self._fd is None:
            return None
        if -(-os.fstat(self._fd).st_size // self.part_size) > MAX_PARTS:
            self._give_up()
            return None
        try:
            return [part.result() for part in self._parts]
        except StorageError:
            self._give_up()
            return None

    def close(self) -> None:
        """Send no more parts, drop an upload not finished, and let go of the file."""
        self._give_up()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _give_up(self) -> None:
        """Stream no more: no part is sent after this, and those sent are dropped with their upload."""
        self._streaming = False
        self._pool.shutdown(cancel_futures=True)
        if self._upload_id is not None:
            self.store.drop_multipart(self.name, self._upload_id)
            self._upload_id = None


def upload_early(store: ObjectStore, present: Iterable[str]) -> EarlyUpload | None:
    """An upload for `.tar.idx` files to `send` before the rest of their index is finished, if that cannot
    mislead a reader: only where no marker is among the names `present` in the bucket (a prepared
    dataset's old `.tar.idx` files must stay until its markers are withdrawn; without markers nothing
    reads them). None otherwise."""
    return None if markers(list(present)) else EarlyUpload(store)


def upload_dataset(
    store: ObjectStore,
    root: Path,
    names: list[str],
    early: EarlyUpload | None = None,
    growing: GrowingUpload | None = None,
) -> None:
    """Upload the files `names` (relative to `root`, at their `local_path`) to the same names below the
    store's address: the old markers it replaces deleted first, then `upload_order`; big files in parts.
    Those `early` is uploading go on meanwhile and are waited for before the markers; the file `growing`
    has begun to send is finished by it in its place. An error says what a reader now sees."""
    try:
        if early is not None:
            names = [name for name in names if name not in early.files]
        for name in _replaced_markers(names):
            if store.exists(name):
                store.delete(name)
        last = set(markers(names))
        for batch in upload_order(names):
            if early is not None and batch[0] in last:
                early.wait()
                early = None
            _upload_batch(store, root, batch, growing)
        if early is not None:
            early.wait()
    except StorageError as error:
        raise StorageError(
            f"{error} The upload stopped before the new {META_DIR}/{INFO_JSON}: energon sees no prepared"
            f" dataset at {store.address} (an older index there was withdrawn first, so none is mixed with"
            " the new files); run again."
        ) from None
    finally:
        if early is not None:  # stopped by a failure: no more of its files go up
            early.stop()


def earlier_uploads(store: ObjectStore, note: Note) -> list[IncompleteUpload]:
    """The multipart uploads below the store's address left incomplete, to call before this run uploads
    anything (so that none is its own). A server that will not list them (it refuses, or does not have
    the request) costs the run nothing but a `note`, and none are aborted."""
    try:
        return store.incomplete_uploads()
    except StorageError as error:
        note(f"Note: {error} Any an earlier run left there stay (a lifecycle rule can abort them).")
        return []


def abort_earlier_uploads(
    store: ObjectStore, uploads: Sequence[IncompleteUpload], names: Iterable[str], note: Note
) -> None:
    """Abort those of `uploads` (`earlier_uploads`) whose object is among `names`, the files this run
    writes, and say so in one `note`, naming them in `upload_order`; leave the rest alone. Those that
    cannot be aborted are named in one more note: the run goes on, its objects whole all the same."""
    order = {
        name: at for at, name in enumerate(name for batch in upload_order(list(names)) for name in batch)
    }
    aborted: list[str] = []
    failed: list[str] = []
    first_error: StorageError | None = None
    for upload in sorted((upload for upload in uploads if upload.name in order), key=lambda u: order[u.name]):
        try:
            store.abort(upload)
        except StorageError as error:
            failed.append(upload.name)
            first_error = first_error or error
        else:
            aborted.append(upload.name)
    if aborted:
        plural = "s" if len(aborted) > 1 else ""
        note(f"Aborted {len(aborted)} incomplete upload{plural} an earlier run left: {', '.join(aborted)}")
    if first_error is not None:
        note(
            f"Note: {first_error} Not aborted: {', '.join(failed)}; their parts stay on the server until"
            " they are (a lifecycle rule can do it)."
        )


def _upload_batch(store: ObjectStore, root: Path, batch: list[str], growing: GrowingUpload | None) -> None:
    """Upload the files `batch` at once, `UPLOAD_THREADS` at a time (the one `growing` has begun, through
    it). A failure or an interruption (Ctrl-C, SIGTERM) stops the rest: files not begun are not sent,
    multipart uploads under way send no further part, and only requests already on their way are waited
    for."""
    stop = threading.Event()

    def upload(name: str) -> None:
        if growing is not None and name == growing.name:
            growing.finish(root / local_path(name), stop)
        else:
            store.upload_file(name, root / local_path(name), stop)

    pool = ThreadPoolExecutor(min(UPLOAD_THREADS, len(batch)), "shardprep-upload")
    try:
        for done in [pool.submit(upload, name) for name in batch]:
            done.result()
    finally:
        stop.set()  # everything is up by now, unless the run is failing
        pool.shutdown(cancel_futures=True)
