"""`prepare-media`: the media metadata of a dataset energon reads by file name, as `energon prepare-media`
7.4.1 writes it into `.nv-meta/index.sqlite`.

Two kinds of dataset, told apart as energon does:

1. a prepared WebDataset (`.nv-meta/.info.json`): its shards' media parts, found through the index, are
   described into it (`prep.index.media.add_media_metadata`); nothing else changes;
2. a folder dataset (no `.info.json`), such as the auxiliary side of a polylithic dataset: every file
   below the folder (symbolic links followed, `.nv-meta` left out) that the filter considers by its own
   name, keyed by its path relative to the folder; `index.sqlite` holds only the media tables.

In both, rows already in the index stay (a file described again is replaced), and each filter used is
recorded once, as in energon. The new `index.sqlite` is built from a copy of the old one and put in
place at once (`prep.index.staging`): an interrupted run leaves the old one as it was.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prep.errors import PrepError, plain_io_errors
from prep.index.format import INDEX_SQLITE, META_DIR
from prep.index.lock import LOCK_FILE, dataset_lock
from prep.index.media import MediaSummary, add_folder_media_metadata, add_media_metadata
from prep.index.meta import is_prepared, read_shard_counts
from prep.index.sqlite import copied_index_errors
from prep.index.staging import Staging
from prep.media.filter import MediaFilter
from prep.prepare.shards import check_dataset_root
from prep.processes import worker_count
from prep.storage.address import is_plain_name

#: `progress(done, total)`: shards of a WebDataset, files of a folder dataset.
MediaProgress = Callable[[int, int], None]
#: What to do about a folder dataset's damaged index, which prepare-media alone writes.
REMAKE_FOLDER_INDEX = (
    "It holds only media metadata: remove it and run `shardprep prepare-media` again, with each filter it"
    " was made with."
)


@dataclass(frozen=True)
class PreparedMedia:
    """What `prepare_media` did: the kind of dataset ("webdataset" or "folder") and what it wrote."""

    kind: str
    summary: MediaSummary


def prepare_media(
    root: Path, media: MediaFilter, *, num_workers: int | None = None, progress: MediaProgress | None = None
) -> PreparedMedia:
    """Describe the media of the dataset at `root` into its `.nv-meta/index.sqlite` (see the module)."""
    check_dataset_root(root)
    with plain_io_errors(root, "prepare-media"), dataset_lock(root, "prepare-media"):
        if is_prepared(root):
            return PreparedMedia("webdataset", _webdataset_media(root, media, num_workers, progress))
        return PreparedMedia("folder", _folder_media(root, media, num_workers, progress))


def _webdataset_media(
    root: Path, media: MediaFilter, num_workers: int | None, progress: MediaProgress | None
) -> MediaSummary:
    meta = root / META_DIR
    if not (meta / INDEX_SQLITE).is_file():
        raise PrepError(f"{meta / INDEX_SQLITE} is missing. Run `shardprep prepare {root}` first.")
    shards = list(read_shard_counts(meta))
    root_mode = stat.S_IMODE(root.stat().st_mode)
    with Staging(root, meta_mode=root_mode | 0o700) as staging:
        index = staging.meta_file(INDEX_SQLITE)
        shutil.copyfile(meta / INDEX_SQLITE, index)
        workers = worker_count(num_workers, len(shards))
        with copied_index_errors(meta / INDEX_SQLITE):
            summary = add_media_metadata(root, shards, index, media, workers, progress)
        os.chmod(index, (root_mode | 0o600) & 0o666)
        staging.commit()
    return summary


def _folder_media(
    root: Path, media: MediaFilter, num_workers: int | None, progress: MediaProgress | None
) -> MediaSummary:
    files = media_files(root, media)
    if not files:
        raise no_media_files(root, media)
    root_mode = stat.S_IMODE(root.stat().st_mode)
    with Staging(root, meta_mode=root_mode | 0o700) as staging:
        index, source = staging.meta_file(INDEX_SQLITE), root / META_DIR / INDEX_SQLITE
        if source.is_file():
            shutil.copyfile(source, index)
        workers = worker_count(num_workers, len(files))
        with copied_index_errors(source, REMAKE_FOLDER_INDEX):
            summary = add_folder_media_metadata(root, files, index, media, workers, progress)
        os.chmod(index, (root_mode | 0o600) & 0o666)
        staging.commit()
    return summary


def no_media_files(where: str | Path, media: MediaFilter) -> PrepError:
    """The error for a folder dataset (at `where`, its folder or address) without a file the filter takes."""
    return PrepError(
        f"No media files found under {where} with the {media.strategy.lower()} filter"
        f"{' ' + media.stored_patterns if media.patterns else ''}; nothing was written."
    )


def _left_out_folder(name: str) -> bool:
    """Whether a folder of this name holds no media files of a folder dataset: `.nv-meta`, and
    shardprep's staging folders beside it."""
    return name == META_DIR or name.startswith(META_DIR + ".")


def media_files(root: Path, media: MediaFilter) -> list[tuple[str, int]]:
    """(path relative to `root`, size) of every file the filter considers by its name, sorted: energon's
    walk (symbolic links followed), without `.nv-meta` and shardprep's own lock and staging files."""
    found = []
    for folder, folders, names in os.walk(root, followlinks=True):
        folders[:] = [name for name in folders if not _left_out_folder(name)]
        relative_folder = os.path.relpath(folder, root)
        for name in names:
            if name == LOCK_FILE or not media.considers(name):
                continue
            relative = name if relative_folder == "." else f"{relative_folder}/{name}"
            try:
                size = os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                continue  # a dangling symbolic link: energon's reader would fail on it too
            found.append((relative, size))
    found.sort()
    return found


def object_media_files(objects: list[tuple[str, int]], media: MediaFilter) -> list[tuple[str, int]]:
    """`media_files` of a folder dataset in a bucket, from its objects `(name relative to its address,
    size)`: the same files left out, by the same rules, and those whose keys energon reads as other keys
    (`is_plain_name`: `a//b.png` is `a/b.png` to it), whose rows no lookup would find.

    >>> from prep.media.filter import parse_media_filter
    >>> by_extension = parse_media_filter(glob=None, header=False, extension=True)
    >>> object_media_files([("b/x.png", 3), (".nv-meta/y.png", 1), ("a.txt", 2), ("a.jpg", 5)], by_extension)
    [('a.jpg', 5), ('b/x.png', 3)]
    >>> object_media_files([("b//x.png", 3), ("c/../y.png", 1)], by_extension)
    []
    """
    found = []
    for name, size in objects:
        *folders, file_name = name.split("/")
        if file_name and file_name != LOCK_FILE and media.considers(file_name) and is_plain_name(name):
            if not any(_left_out_folder(folder) for folder in folders):
                found.append((name, size))
    found.sort()
    return found
