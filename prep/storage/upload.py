"""A dataset built in a local folder, uploaded to its bucket in the order that keeps readers safe.

energon calls a dataset prepared when `.nv-meta/.info.json` (or the legacy `.info.yaml`) exists, and
reads the `.tar.idx` files and the rest of `.nv-meta` after that. So the shards and other data go up
first, then the `.tar.idx` files, then `.nv-meta`'s other files, and the `.info.json` last: a reader sees
no new index until all of it is in place, and a run that fails on the way leaves no new `.info.json`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prep.index.format import INFO_JSON, INFO_YAML, META_DIR
from prep.storage.store import ObjectStore, StorageError

#: Files uploaded at once.
UPLOAD_THREADS = 16
#: `.nv-meta` files whose presence says "prepared" to energon: uploaded last, in this order.
PREPARED_MARKERS = (INFO_YAML, INFO_JSON)
#: Files suffixed so are the per-shard offsets energon's loader reads.
TAR_INDEX_SUFFIX = ".idx"


def upload_order(names: list[str]) -> list[list[str]]:
    """`names` (relative paths) in batches to upload one after the other: data, `.tar.idx`, `.nv-meta`,
    then each prepared marker alone.

    >>> upload_order([".nv-meta/.info.json", "a.tar.idx", ".nv-meta/index.sqlite", "a.tar"])
    [['a.tar'], ['a.tar.idx'], ['.nv-meta/index.sqlite'], ['.nv-meta/.info.json']]
    """

    def is_meta(name: str) -> bool:
        return name.startswith(META_DIR + "/") or f"/{META_DIR}/" in name

    def marker(name: str) -> bool:
        return is_meta(name) and name.rpartition("/")[2] in PREPARED_MARKERS

    data = [name for name in names if not is_meta(name) and not name.endswith(TAR_INDEX_SUFFIX)]
    offsets = [name for name in names if not is_meta(name) and name.endswith(TAR_INDEX_SUFFIX)]
    meta = [name for name in names if is_meta(name) and not marker(name)]
    last = sorted(
        (name for name in names if marker(name)), key=lambda n: PREPARED_MARKERS.index(n.rpartition("/")[2])
    )
    return [batch for batch in (data, offsets, meta, *([name] for name in last)) if batch]


def upload_dataset(store: ObjectStore, root: Path, names: list[str]) -> None:
    """Upload the files `names` (relative to `root`) to the same names below the store's address, in
    `upload_order`; big files in parts. An error says the new index is not visible."""
    try:
        for batch in upload_order(names):
            with ThreadPoolExecutor(min(UPLOAD_THREADS, len(batch)), "shardprep-upload") as pool:
                for done in [pool.submit(store.upload_file, name, root / name) for name in batch]:
                    done.result()
    except StorageError as error:
        raise StorageError(
            f"{error} The upload stopped before the new {META_DIR}/{INFO_JSON}, so energon does not see the new"
            f" index at {store.address} (a previous {INFO_JSON} there still stands, possibly beside some new"
            " files); run again."
        ) from None
