"""`prepare` of a dataset in object storage (`s3://bucket/path`, `msc://profile/path`), without downloading it.

The stages, around the local prepare (`prep.prepare.run.prepare`) it reuses as it is:

1. the bucket's shards listed with their sizes (`BucketShards`): every `*.tar`/`*.tgz` object below the
   address, hidden ones left out, in energon's order; the existing `.nv-meta` files (not `index.sqlite`)
   copied into a local folder under `--tmp-path`, so the wizard, `--tar-index-only` and a kept
   dataset.yaml work as for a local dataset;
2. each shard's headers walked by ranged GETs (`shard_rows_from_bucket`: `prep.storage.ranged` under
   `prep.tar.scan.RangedHeaderWalker`), in threads; a shard of small members is read whole instead and
   takes the vectorised scan;
3. the index built and committed in the local folder, exactly as a local prepare builds it;
4. uploaded (`prep.storage.upload`): the `.tar.idx` files, then `.nv-meta`'s files with `.info.json`
   (the file energon's loader looks for to call a dataset prepared) last, so a reader never sees a
   half-written index. A failure before the upload leaves the bucket as it was.

Nothing locks the bucket: the local lock covers only the folder under `--tmp-path`, so two prepares of
one bucket dataset at once are the user's to avoid.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prep.errors import PrepError, ShardError
from prep.index.format import INDEX_SQLITE, META_DIR, SHARD_SUFFIXES, tar_index_name
from prep.index.group import walked_rows
from prep.index.rows import ShardRows
from prep.index.shard_list import exclude_shards, shard_sort_key
from prep.prepare.run import PrepareOptions, ShardProgress, ShardTask, Wizard, prepare
from prep.storage.address import ObjectAddress, parse_address
from prep.storage.ranged import RangedObject
from prep.storage.store import ObjectInfo, ObjectStore, open_store
from prep.storage.upload import upload_dataset
from prep.tar.fields import BLOCK
from prep.tar.scan import HeaderWalker, RangedHeaderWalker, check_not_compressed

#: Shards scanned at once (I/O-bound threads; a shard of small members is held whole while scanned).
SCAN_THREADS = 8


def shard_rows_from_bucket(
    store: ObjectStore, shard: str, size: int, tar_file_id: int, fetched: list[int] | None = None
) -> ShardRows:
    """One shard's index rows, read from the bucket as a local prepare reads them from a file; ShardError
    as there. The bytes fetched are added to `fetched[0]` if given."""
    reader = RangedObject(lambda offset, length: store.read(shard, offset, length), size)
    try:
        check_not_compressed(shard, reader[:BLOCK])
        ranged = RangedHeaderWalker(shard, reader)
        walker = HeaderWalker(shard, reader.whole()) if ranged.mostly_small_members() else ranged
        return walked_rows(walker, shard, tar_file_id)
    finally:
        if fetched is not None:
            fetched[0] += reader.fetched


class BucketShards:
    """The shards of a dataset in a bucket: a `prep.prepare.run.ShardSource`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.objects: dict[str, ObjectInfo] = {}

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
                f"No shards found under {self.store.address}{excluded}: prepare looks for *.tar and *.tgz"
                " objects below it, skipping hidden ones. Point it at the prefix that holds the shards."
            )
        return shards

    def scan(self, tasks: list[ShardTask], workers: int) -> Iterator[ShardRows | ShardError]:
        with ThreadPoolExecutor(max(1, min(SCAN_THREADS, len(tasks))), "shardprep-scan") as pool:
            futures = [pool.submit(self._scan_one, shard, tar_file_id) for _, shard, tar_file_id, _ in tasks]
            try:
                for future in futures:
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()

    def _scan_one(self, shard: str, tar_file_id: int) -> ShardRows | ShardError:
        info = self.objects.get(shard)
        if info is None:
            return ShardError(shard, f"is not in {self.store.address} (listed in .info.json, but missing).")
        try:
            return shard_rows_from_bucket(self.store, shard, info.size, tar_file_id)
        except ShardError as error:
            return error

    def read_part(self, shard: str, offset: int, size: int) -> bytes:
        return self.store.read(shard, offset, size)


def prepare_remote(
    address: str | ObjectAddress,
    options: PrepareOptions,
    wizard: Wizard | None = None,
    progress: ShardProgress | None = None,
    *,
    tmp_path: str | Path | None = None,
    store: ObjectStore | None = None,
) -> dict[str, int] | None:
    """Prepare the dataset at a bucket address, building its index under `tmp_path` (a temporary folder
    by default, removed afterwards) and uploading it; the shard counts, or None if the wizard declined."""
    if isinstance(address, str):
        parsed = parse_address(address)
        if parsed is None:
            raise PrepError(f"{address} is not an s3:// or msc:// address.")
        address = parsed
    if options.resume:
        raise PrepError("--resume is for local datasets; a bucket dataset is prepared in one run.")
    if options.media_filter is not None:
        raise PrepError("--media-metadata-by-... is for local datasets; run it on a local copy.")
    if options.fix_duplicates:
        raise PrepError(
            "--fix-duplicates renames members inside the shards, which objects in a bucket cannot have done"
            " in place; fix a local copy and upload it."
        )
    if options.engine != "local":
        raise PrepError("--engine ray is for local datasets; a bucket dataset is scanned in threads here.")
    store = store or open_store(address)
    source = BucketShards(store)
    if tmp_path is not None:
        Path(tmp_path).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shardprep-remote-", dir=tmp_path))
    try:
        root = work / "dataset"
        root.mkdir()
        _copy_existing_meta(source, root)
        shard_counts = prepare(root, options, wizard, progress, source=source)
        if shard_counts is not None:
            built = [tar_index_name(shard) for shard in shard_counts]
            built += [f"{META_DIR}/{path.name}" for path in (root / META_DIR).iterdir() if path.is_file()]
            upload_dataset(store, root, built)
        return shard_counts
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy_existing_meta(source: BucketShards, root: Path) -> None:
    """The bucket's `.nv-meta` files (all but index.sqlite, which is rebuilt) into `root/.nv-meta`."""
    prefix = META_DIR + "/"
    names = [
        info.name
        for info in source.list_objects()
        if info.name.startswith(prefix) and "/" not in info.name[len(prefix) :]
    ]
    names = [name for name in names if name != prefix + INDEX_SQLITE]
    if not names:
        return
    (root / META_DIR).mkdir()
    for name in names:
        (root / name).write_bytes(source.store.get(name))
