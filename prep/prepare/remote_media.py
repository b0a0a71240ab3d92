"""`prepare-media` of a WebDataset in object storage (`s3://bucket/path`, `msc://profile/path`), as
`energon prepare-media` 7.4.1 does it on a remote path: the index built locally, then uploaded.

The stages:

1. the objects below the address listed: a dataset without `.nv-meta/.info.json` (or the legacy
   `.info.yaml`) is refused, saying what to run (`prepare` for shards not yet prepared; a local copy for
   a folder dataset of media files, which this does not describe in a bucket);
2. `.info.json` (the shards, in `tar_file_id` order) and `index.sqlite` downloaded into a folder under
   `--tmp-path` (removed afterwards, whatever ends the run);
3. the media parts described into that copy of the index as a local `prepare-media` describes them
   (`prep.index.media.add_media_metadata`), each shard read by ranged GETs of the bytes its parts'
   headers need (`prep.prepare.remote.bucket_media_reads`);
4. the index uploaded whole under its old name: the bucket replaces the old object only once the new one
   is complete (one PUT, or a multipart upload completed), so a run that fails anywhere leaves the
   bucket's index as it was. The multipart uploads a killed run left for it are aborted first.

Nothing locks the bucket: a prepare of the same dataset while this runs is the user's to avoid.
"""

from __future__ import annotations

from pathlib import Path

from prep.errors import PrepError
from prep.index.format import INDEX_SQLITE, INFO_JSON, INFO_YAML, META_DIR, SHARD_SUFFIXES
from prep.index.media import MediaProgress, add_media_metadata
from prep.index.meta import read_shard_counts
from prep.index.sqlite import copied_index_errors
from prep.media.filter import MediaFilter
from prep.prepare.media import PreparedMedia
from prep.prepare.remote import bucket_media_reads
from prep.storage.address import ObjectAddress, require_address
from prep.storage.scratch import scratch_folder
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
    """Describe the media of the prepared WebDataset at a bucket address into its `index.sqlite` (see the
    module), working under `tmp_path` (the system's temporary folder by default). `note` is told what the
    user should hear besides (earlier runs' incomplete uploads aborted)."""
    address = require_address(address)
    store = store or open_store(address)
    objects = {info.name: info for info in store.list()}
    markers = [f"{META_DIR}/{name}" for name in (INFO_JSON, INFO_YAML) if f"{META_DIR}/{name}" in objects]
    if not markers:
        raise PrepError(_not_prepared(store, objects, media))
    if INDEX_NAME not in objects:
        raise PrepError(f"{store.url(INDEX_NAME)} is missing. Run `shardprep prepare {address}` first.")
    with scratch_folder(tmp_path, "prepare-media") as root:
        index = root / INDEX_NAME
        try:
            index.parent.mkdir()
            for name in markers:
                (root / name).write_bytes(store.get(name))
            shards = list(read_shard_counts(index.parent))
            store.download(INDEX_NAME, index, objects[INDEX_NAME].size)
            sizes = [info.size if (info := objects.get(shard)) else None for shard in shards]
            with copied_index_errors(index):
                summary = add_media_metadata(
                    root, shards, index, media, 1, progress, reads=bucket_media_reads(store, sizes)
                )
        except PrepError as error:  # named by the address, not the folder (gone when the user reads it)
            if str(root) not in str(error):
                raise
            raise PrepError(str(error).replace(str(root), str(address))) from None
        abort_earlier_uploads(store, earlier_uploads(store, note), [INDEX_NAME], note)
        try:
            store.upload_file(INDEX_NAME, index)
        except StorageError as error:
            raise StorageError(f"{error} {store.url(INDEX_NAME)} is as it was; run again.") from None
    return PreparedMedia("webdataset", summary)


def _not_prepared(store: ObjectStore, objects: dict[str, ObjectInfo], media: MediaFilter) -> str:
    """What to do about a bucket dataset without `.info.json`: prepare its shards, or, where it has none (a
    folder dataset), describe a local copy."""
    address = store.address
    if not objects:
        return (
            f"Nothing is stored below {address}: give the address of a prepared dataset, the folder that"
            f" holds its shards and {META_DIR}/."
        )
    missing = f"{address} is not a prepared dataset: it has no {META_DIR}/{INFO_JSON}."
    if any(name.endswith(SHARD_SUFFIXES) for name in objects):
        return (
            f"{missing} Prepare it and describe its media in one run with `shardprep prepare {address}"
            f" {media.option}`."
        )
    return (
        f"{missing} It holds no shards either: prepare-media describes a folder dataset (media files keyed"
        " by their paths) only on a local folder. Run it on a local copy and upload the"
        f" {INDEX_NAME} it writes to {store.url(INDEX_NAME)}."
    )
