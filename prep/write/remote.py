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

With `--resume`, the dataset is written in a folder kept for a rerun (`resume_folder_for`) until it is
uploaded, and nothing goes up before the write is done.

The prefix must hold no objects, unless `--overwrite`: then what the new dataset does not replace is
deleted once it is whole; or `--resume` where an interrupted run left its folder: then the objects must
be ones the write writes. Nothing locks the bucket (the local lock covers only the folder under
`--tmp-path`): two writes to one prefix at once are the user's to avoid.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from prep.errors import PrepError
from prep.storage.address import require_address
from prep.storage.scratch import resume_folder_for, scratch_folder
from prep.storage.store import ObjectStore, StorageError, open_store
from prep.storage.upload import (
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
#: The kind of the folder a write with --resume keeps its work in (`resume_folder_for`).
WRITE_RESUME = "write-resume"


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
    address = str(parsed)  # as energon reads it (`x/../out` is `out`): where the objects go
    store = store or open_store(parsed)
    existing = [info.name for info in store.list()]
    kept = resume_folder_for(parsed, tmp_path, WRITE_RESUME) if options.resume else None
    # --resume over objects: those an interrupted run of this write uploaded, if one left its work here
    if existing and not (options.overwrite or (kept is not None and kept.is_dir())):
        raise PrepError(
            f"{address} is not empty ({len(existing)} objects, e.g. {existing[0]}). Give a new prefix, or"
            " --overwrite to replace what is there."
        )
    leftovers = earlier_uploads(store, note)
    with _local_folder(kept, tmp_path) as out_dir:
        streams = not existing and not options.resume
        shards = ShardUploads(store, out_dir, keep=options.media_filter is not None) if streams else None
        # the local folder is the run's own: what a --resume run there finished is redone or reused
        local = dataclasses.replace(options, overwrite=True) if options.resume else options
        uploading = False
        try:
            summary = write(
                sources, out_dir, local, progress, shards.send if shards else None, keep_checkpoint=True
            )
            built = sorted(
                path.relative_to(out_dir).as_posix()
                for path in out_dir.rglob("*")
                if path.is_file() and not path.relative_to(out_dir).parts[0].startswith(_RUN_FILES_PREFIX)
            )
            strangers = sorted(set(existing) - set(built))
            if strangers and not options.overwrite:  # --resume: only what an interrupted upload left
                raise PrepError(
                    f"{address} holds objects this write does not write ({len(strangers)}, e.g."
                    f" {strangers[0]}): not what an interrupted run of it uploaded. Give --overwrite to"
                    " replace them (what this run wrote is kept for the rerun)."
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
        delete_stale(store, strangers)
        # the run's time is the write's and the upload's (the summary says "Wrote ... in N s")
        summary = dataclasses.replace(summary, seconds=time.perf_counter() - started)
        return _named(summary, out_dir, address)


@contextmanager
def _local_folder(kept: Path | None, tmp_path: str | Path | None) -> Iterator[Path]:
    """Where the dataset is written before it goes up: a scratch folder under `tmp_path`, removed however
    the run ends; with --resume, `kept`, the folder of this user's named by the address
    (`resume_folder_for`), kept for a rerun unless the run succeeds."""
    if kept is None:
        with scratch_folder(tmp_path, "write") as folder:
            yield folder
        return
    folder = kept
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = folder.lstat()
    except OSError as error:
        raise PrepError(
            f"Cannot make {folder} ({error.strerror}): write --resume keeps a bucket dataset's local files"
            " there. Give --tmp-path a folder you can write to, with room for the dataset."
        ) from None
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise PrepError(
            f"{folder} is not a folder of yours alone (mode {stat.filemode(found.st_mode)}): write --resume"
            " keeps its work there for a rerun, and will not read or write one others can change. Remove"
            " it, or give another --tmp-path."
        )
    yield folder
    shutil.rmtree(folder, ignore_errors=True)  # the dataset is up: nothing is left to resume


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
        self.early = EarlyUpload(store)

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
