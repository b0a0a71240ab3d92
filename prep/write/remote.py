"""`write ... s3://bucket/out` (or `msc://profile/out`): the local write, under `--tmp-path`, uploaded as
it goes (`prep.storage.upload`). Into an empty prefix each shard goes up as soon as it is whole, while
the write goes on (`ShardUploads`), and its local copy is emptied once it is up, so `--tmp-path` needs
room for the shards on their way and the index, not for the dataset; the `.tar.idx` files follow once
the write is done, `.nv-meta` with its `.info.json` last, so the bucket shows no index before all of it
is there. A write that fails, or is interrupted, deletes the shards it sent (a run killed outright leaves
them, under no index: the prefix then needs `--overwrite`). Over objects already there (`--overwrite`)
nothing goes up before the write is done, and the old `.info.json` is withdrawn before the first upload:
a failure in the upload leaves a dataset energon calls not prepared, never a mixed one. A failure before
the upload leaves the bucket as it was. The multipart uploads an earlier run killed mid-upload left for
the objects this one writes are aborted before its upload (`prep.storage.upload.abort_earlier_uploads`).

The prefix must hold no objects, unless `--overwrite`: then what the new dataset does not replace is
deleted once it is whole. Nothing locks the bucket (the local lock covers only the folder under
`--tmp-path`): two writes to one prefix at once are the user's to avoid.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

from prep.errors import PrepError
from prep.storage.address import require_address
from prep.storage.scratch import scratch_folder
from prep.storage.store import ObjectStore, StorageError, open_store
from prep.storage.upload import (
    UPLOAD_THREADS,
    EarlyUpload,
    Note,
    abort_earlier_uploads,
    delete_stale,
    earlier_uploads,
    unheard,
    upload_dataset,
)
from prep.write.options import WriteOptions
from prep.write.run import WriteProgress, WriteSummary, write
from prep.write.sources import Source

#: What a run keeps beside a dataset for itself (the lock, resume checkpoints): not uploaded.
_RUN_FILES_PREFIX = ".shardprep"


def write_remote(
    sources: list[Source],
    address: str,
    options: WriteOptions,
    progress: Callable[[WriteProgress], None] | None = None,
    *,
    tmp_path: str | Path | None = None,
    store: ObjectStore | None = None,
    note: Note = unheard,
) -> WriteSummary:
    """Write `sources` as a prepared dataset at the bucket `address`; the summary names the address.
    `note` is told what the user should hear besides (earlier runs' incomplete uploads aborted)."""
    started = time.perf_counter()
    parsed = require_address(address)
    if options.resume:
        raise PrepError("--resume is for a local OUT_DIR; a bucket dataset is written in one run.")
    store = store or open_store(parsed)
    existing = [info.name for info in store.list()]
    if existing and not options.overwrite:
        raise PrepError(
            f"{address} is not empty ({len(existing)} objects, e.g. {existing[0]}). Give a new prefix, or"
            " --overwrite to replace what is there."
        )
    leftovers = earlier_uploads(store, note)
    with scratch_folder(tmp_path, "write") as out_dir:
        shards = None if existing else ShardUploads(store, out_dir, keep=options.media_filter is not None)
        uploading = False
        try:
            summary = write(sources, out_dir, options, progress, shards.send if shards else None)
            built = sorted(
                path.relative_to(out_dir).as_posix()
                for path in out_dir.rglob("*")
                if path.is_file() and not path.relative_to(out_dir).parts[0].startswith(_RUN_FILES_PREFIX)
            )
            abort_earlier_uploads(store, leftovers, built, note)
            uploading = True
            upload_dataset(store, out_dir, built, shards.early if shards else None)
        except BaseException as error:
            if shards is None:
                raise
            shards.early.withdraw()  # the shards sent: the bucket is left as it was
            if isinstance(error, StorageError) and not uploading:  # a shard's upload stopped the write
                raise StorageError(
                    f"{error} The write stopped, and the shards it had sent were deleted: {address} is as it"
                    " was."
                ) from None
            raise
        delete_stale(store, sorted(set(existing) - set(built)))
        # the run's time is the write's and the upload's (the summary says "Wrote ... in N s")
        summary = dataclasses.replace(summary, seconds=time.perf_counter() - started)
        return _named(summary, out_dir, address)


class ShardUploads:
    """The shards of a write into an empty prefix, each sent up (`EarlyUpload`) as soon as the write has it
    whole, from a hard link beside `out_dir` (the staged file is renamed when the write commits), and
    emptied once up unless `keep` (the write reads its shards again for `--media-metadata-by-*`). Where
    no hard link can be made (a file system without them), the shards go up after the write instead."""

    def __init__(self, store: ObjectStore, out_dir: Path, *, keep: bool) -> None:
        self.out_dir = out_dir
        self.keep = keep
        self.links = out_dir.parent / "uploading"
        self.links.mkdir()
        self.early = EarlyUpload(store, {}, UPLOAD_THREADS)

    def send(self, final: Path, staged: Path) -> None:
        """Begin uploading the shard staged at `staged`, under its name in the dataset (`final`)."""
        link = self.links / str(len(self.early.files))
        try:
            os.link(staged, link)
        except OSError:
            return  # `upload_dataset` sends it with the rest
        self.early.send(final.relative_to(self.out_dir).as_posix(), link, self._sent)

    def _sent(self, link: Path) -> None:
        try:
            if not self.keep:
                os.truncate(link, 0)  # the write's own copy too: the same file
            link.unlink()
        except OSError:  # only room on the disk is lost
            pass


def _named(summary: WriteSummary, out_dir: Path, address: str) -> WriteSummary:
    """The summary with the local folder's paths given as bucket addresses (for the user to read)."""

    def renamed(path: Path | None) -> Path | None:
        if path is None:
            return None
        try:
            inside = path.relative_to(out_dir).as_posix()
        except ValueError:
            return path
        base = address.rstrip("/")
        return base if inside == "." else f"{base}/{inside}"  # type: ignore[return-value]

    return dataclasses.replace(
        summary,
        out_dir=renamed(summary.out_dir),
        dataset=renamed(summary.dataset),
        aux=renamed(summary.aux),
        metadataset=renamed(summary.metadataset),
        rejects_path=renamed(summary.rejects_path),
    )
