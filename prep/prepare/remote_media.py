"""`prepare-media` of a dataset in object storage (`s3://bucket/path`, `msc://profile/path`), as `energon
prepare-media` 7.4.1 does it on a remote path: the index built locally, then uploaded.

The stages:

1. the objects below the address listed; the two kinds of dataset told apart as locally
   (`prep.prepare.media`): a prepared WebDataset (`.nv-meta/.info.json`, or the legacy `.info.yaml`), or
   a folder dataset, whose media files are the objects the filter considers by their own names
   (`object_media_files`: the files a local walk would find). An address with no such file is refused,
   saying what to run (`prepare` for shards not yet prepared);
2. for a WebDataset, `.info.json` (the shards, in `tar_file_id` order) and `index.sqlite` downloaded
   into a folder under `--tmp-path` (removed afterwards, whatever ends the run); for a folder dataset,
   its `index.sqlite` where it has one;
3. the media described into that copy of the index as a local `prepare-media` describes it
   (`prep.index.media`), each part or file read by ranged GETs of the bytes its header needs
   (`prep.prepare.remote.bucket_media_reads`, `bucket_file_reads`);
4. the index uploaded whole under its name: the bucket replaces the old object only once the new one is
   complete (one PUT, or a multipart upload completed), so a run that fails anywhere leaves the bucket's
   index as it was. The multipart uploads a killed run left for it are aborted first.

Nothing locks the bucket: a prepare of the same dataset while this runs is the user's to avoid.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from prep.errors import PrepError
from prep.index.format import INDEX_SQLITE, INFO_JSON, INFO_YAML, META_DIR, SHARD_SUFFIXES
from prep.index.media import MediaProgress, MediaSummary, add_folder_media_metadata, add_media_metadata
from prep.index.meta import read_shard_counts
from prep.index.sqlite import copied_index_errors
from prep.media.filter import MediaFilter
from prep.prepare.media import REMAKE_FOLDER_INDEX, PreparedMedia, no_media_files, object_media_files
from prep.prepare.remote import bucket_file_reads, bucket_media_reads
from prep.storage.address import ObjectAddress, require_address
from prep.storage.scratch import named_by_address, scratch_folder
from prep.storage.store import ObjectInfo, ObjectStore, StorageError, open_store
from prep.storage.upload import Note, abort_earlier_uploads, earlier_uploads, unheard

#: The index, by its name below the dataset's address.
INDEX_NAME = f"{META_DIR}/{INDEX_SQLITE}"


def prepare_media_remote(
    address: str | ObjectAddress,
    media: MediaFilter,
    *,
    progress: MediaProgress | None = None,
    tmp_path: str | Path | None = None,
    store: ObjectStore | None = None,
    note: Note = unheard,
) -> PreparedMedia:
    """Describe the media of the dataset at a bucket address into its `index.sqlite` (see the module),
    working under `tmp_path` (the system's temporary folder by default). `note` is told what the user
    should hear besides (earlier runs' incomplete uploads aborted)."""
    address = require_address(address)
    store = store or open_store(address)
    objects = {info.name: info for info in store.list()}
    markers = [f"{META_DIR}/{name}" for name in (INFO_JSON, INFO_YAML) if f"{META_DIR}/{name}" in objects]
    files: list[tuple[str, int]] = []
    if markers and INDEX_NAME not in objects:
        raise PrepError(
            f"{store.url(INDEX_NAME)} is missing. Run `shardprep prepare {shlex.quote(str(address))}` first."
        )
    if not markers:
        files = object_media_files([(info.name, info.size) for info in objects.values()], media)
        if not files:
            raise _nothing_to_describe(store, objects, media)
    with scratch_folder(tmp_path, "prepare-media") as root:
        index = root / INDEX_NAME
        try:
            index.parent.mkdir()
            if markers:
                summary = _webdataset_media(store, objects, markers, index, media, progress)
            else:
                summary = _folder_media(store, objects, files, index, media, progress)
        except PrepError as error:  # named by the address, not the folder (gone when the user reads it)
            if str(root) not in str(error):
                raise
            raise PrepError(named_by_address(str(error), root, address)) from None
        abort_earlier_uploads(store, earlier_uploads(store, note), [INDEX_NAME], note)
        try:
            store.upload_file(INDEX_NAME, index)
        except StorageError as error:
            was = "is as it was" if INDEX_NAME in objects else "was not written"
            raise StorageError(f"{error} {store.url(INDEX_NAME)} {was}; run again.") from None
    return PreparedMedia("webdataset" if markers else "folder", summary)


def _webdataset_media(
    store: ObjectStore,
    objects: dict[str, ObjectInfo],
    markers: list[str],
    index: Path,
    media: MediaFilter,
    progress: MediaProgress | None,
) -> MediaSummary:
    """The media of a prepared WebDataset's shards, added to its index downloaded to `index`."""
    root = index.parent.parent
    for name in markers:
        (root / name).write_bytes(store.get(name))
    shards = list(read_shard_counts(index.parent))
    store.download(INDEX_NAME, index, objects[INDEX_NAME].size)
    sizes = [info.size if (info := objects.get(shard)) else None for shard in shards]
    with copied_index_errors(index):
        return add_media_metadata(
            root, shards, index, media, 1, progress, reads=bucket_media_reads(store, sizes)
        )


def _folder_media(
    store: ObjectStore,
    objects: dict[str, ObjectInfo],
    files: list[tuple[str, int]],
    index: Path,
    media: MediaFilter,
    progress: MediaProgress | None,
) -> MediaSummary:
    """The media of a folder dataset's `files`, added to its index downloaded to `index`, if it has one."""
    if INDEX_NAME in objects:
        store.download(INDEX_NAME, index, objects[INDEX_NAME].size)
    with copied_index_errors(index, REMAKE_FOLDER_INDEX):
        reads = bucket_file_reads(store)
        return add_folder_media_metadata(index.parent.parent, files, index, media, 1, progress, reads=reads)


def _nothing_to_describe(store: ObjectStore, objects: dict[str, ObjectInfo], media: MediaFilter) -> PrepError:
    """What to do about a bucket address without `.info.json` and without a file the filter takes:
    prepare its shards; give another address."""
    address = store.address
    if not objects:
        return PrepError(
            f"Nothing is stored below {store.where()}: give the address of a dataset, the folder that holds"
            f" its shards and {META_DIR}/ (or the media files of a folder dataset).{store.in_other_unicode_form()}"
        )
    if any(name.endswith(SHARD_SUFFIXES) for name in objects):
        return PrepError(
            f"{address} is not a prepared dataset: it has no {META_DIR}/{INFO_JSON}. Prepare it and describe"
            f" its media in one run with `shardprep prepare {shlex.quote(str(address))} {media.option}`."
        )
    return no_media_files(address, media)
