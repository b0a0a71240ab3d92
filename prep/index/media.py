"""The media stage: media parts described (`prep.media`) into a staged `index.sqlite`, in parallel, as
energon 7.4.1 writes them (`prepare --media-metadata-by-*` and `prepare-media`).

- the shards of a WebDataset (`add_media_metadata`): the parts come from the index itself, shard by
  shard (only those the filter considers by name go to the workers); each worker opens its shard once
  and reads only the bytes each part's header needs; rows go in as each shard's come back, in shard
  order, so memory holds a few shards' rows at a time. Where the shards are read from, and by what
  workers, is a `ShardReads` (by default local files, in worker processes; a bucket's shards are read
  by ranged GETs in threads, `prep.prepare.remote_media`): the parts and the rows are the same;
- the files of a folder dataset (`add_folder_media_metadata`), a few hundred per worker task, read as
  a `FileReads` says (local files by default, or a bucket's objects).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prep.errors import PrepError, ShardError, errors_report
from prep.index.sqlite import MediaIndexWriter, keep_media_tables, media_commands
from prep.media.describe import MediaRow, describe_part
from prep.media.filter import AV, MediaFilter
from prep.media.images import MediaError, ReadAt, from_file
from prep.media.pyav import pyav_available
from prep.processes import ordered_map

#: `progress(shards done, shards in all)`, called as each shard's media rows go in.
MediaProgress = Callable[[int, int], None]


@dataclass
class ShardMedia:
    """What one shard's media parts gave: the rows to write, and how many audio/video parts got none."""

    rows: list[MediaRow] = field(default_factory=list)
    skipped_av: int = 0


@dataclass
class MediaSummary:
    """What the media stage wrote: rows in all, and audio/video parts that got no row (as in energon:
    PyAV cannot read them, or they need PyAV and it is not installed)."""

    rows: int = 0
    skipped_av: int = 0


#: One shard's parts to describe: (entry key, content offset, size) each.
Parts = list[tuple[str, int, int]]
#: `open_part(offset, size)`: a ReadAt over the part of `size` bytes at `offset` of one shard.
OpenPart = Callable[[int, int], ReadAt]


def describe_parts(
    shard: str, parts: Parts, media: MediaFilter, open_part: OpenPart
) -> ShardMedia | ShardError:
    """Describe the `parts` of `shard`, each read through `open_part`. A broken media header comes back as
    a ShardError naming the part and its byte offset in the shard; the reader's own errors pass."""
    result = ShardMedia()
    for entry_key, offset, size in parts:
        try:
            kind, row = describe_part(entry_key, open_part(offset, size), size, media)
        except MediaError as error:
            return ShardError(
                shard,
                f"part {entry_key!r} looks like an image but its header cannot be read: {error.problem}.",
                offset=offset + error.offset,
                advice="Replace or remove that part, or leave it out of the media filter.",
            )
        if row is not None:
            result.rows.append(row)
        elif kind == AV:
            result.skipped_av += 1
    return result


def describe_shard_media(path: str, shard: str, parts: Parts, media: MediaFilter) -> ShardMedia | ShardError:
    """Worker task: describe the `parts` of one shard, read from the local file at `path`."""
    try:
        with open(path, "rb") as file:
            descriptor = file.fileno()
            return describe_parts(
                shard, parts, media, lambda offset, size: from_file(descriptor, offset, size)
            )
    except OSError as error:
        return ShardError(shard, f"could not be read for media metadata: {error.strerror or error}.")
    except PrepError as error:  # a missing optional library: the same for every shard
        return ShardError(shard, str(error))


#: `run(describe, tasks, workers)`: `describe(*task)` for every task, results in task order; the tasks (a
#: sequence whose items are made as they are asked for, in the calling thread) are taken a few ahead, and
#: closing the generator ends the work (no task goes on in the background).
RunTasks = Callable[[Callable[..., Any], Sequence[tuple], int], Generator[Any]]
#: The default `run`: in `workers` worker processes (`prep.processes.ordered_map`).
_IN_PROCESSES: RunTasks = functools.partial(ordered_map, what="reading media headers")


@dataclass(frozen=True)
class ShardReads:
    """Where the media stage reads its shards, and in what workers: `describe(place, shard, parts, media)`
    for each shard, `place` being `places[tar_file_id]`, run by `run`."""

    places: Sequence[object]
    describe: Callable[..., ShardMedia | ShardError] = describe_shard_media
    run: RunTasks = _IN_PROCESSES


def shard_files(paths: Sequence[Path]) -> ShardReads:
    """The shards read from the local files at `paths` (one per shard), in worker processes."""
    return ShardReads([str(path) for path in paths])


class _ShardTasks:
    """The media tasks, one per shard, made as the map asks for them (so only a few shards' part lists
    are held at once): the parts the filter considers, by name, read from the index being built."""

    def __init__(
        self, places: Sequence[object], shards: list[str], writer: MediaIndexWriter, media: MediaFilter
    ) -> None:
        self.places, self.shards, self.writer, self.media = places, shards, writer, media

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, tar_file_id: int) -> tuple[object, str, Parts, MediaFilter]:
        if not 0 <= tar_file_id < len(self.shards):
            raise IndexError(tar_file_id)
        parts = []
        for key, part, offset, size in self.writer.named_parts_of_shard(tar_file_id):
            entry_key = f"{key}.{part}"
            if self.media.considers(entry_key):
                parts.append((entry_key, offset, size))
        return self.places[tar_file_id], self.shards[tar_file_id], parts, self.media


def add_media_metadata(
    root: Path,
    shards: list[str],
    index_path: Path,
    media: MediaFilter,
    workers: int,
    progress: MediaProgress | None = None,
    *,
    reads: ShardReads | None = None,
) -> MediaSummary:
    """Describe the media parts of `shards` (in `tar_file_id` order) into the index at `index_path` and
    record the filter; every bad shard is reported, in one error, and then nothing is added. The shards
    are read as `reads` says: by default, the files `root / shard`."""
    summary = MediaSummary()
    errors: list[ShardError] = []
    if reads is None:
        reads = shard_files([root / shard for shard in shards])
    with MediaIndexWriter(index_path) as writer:
        tasks = _ShardTasks(reads.places, shards, writer, media)
        with closing(reads.run(reads.describe, tasks, workers)) as results:  # its workers end with it
            for done, result in enumerate(results, 1):
                if progress is not None:
                    progress(done, len(tasks))
                if isinstance(result, ShardError):
                    errors.append(result)
                elif not errors:
                    writer.add_media(result.rows)
                    summary.rows += len(result.rows)
                    summary.skipped_av += result.skipped_av
        if errors:
            raise errors_report(errors, "shards have unreadable media; nothing was written:")
        writer.add_media_filter(media.strategy, media.stored_patterns)
        writer.commit()
    return summary


def skipped_av_warning(count: int) -> str:
    """The one warning for audio/video parts left without a row; what it says depends on whether PyAV
    is installed here (the workers run in this same environment)."""
    if pyav_available():
        return (
            f"{count} audio/video part(s) got no media metadata: PyAV cannot read them the way energon 7.4.1"
            " does (a broken or cut file, a format FFmpeg does not know, or a FLAC of a single frame, on which"
            " FFmpeg cannot seek), and energon writes no row for them either."
        )
    return (
        f"{count} audio/video part(s) got no media metadata: shardprep reads WAV and FLAC headers itself,"
        " and other formats (or unusual WAV/FLAC files) need PyAV, which is not installed; energon 7.4.1"
        " without PyAV writes no row for them either. Install it (pip install 'shardprep[media]') and run"
        " again to describe them."
    )


#: Files of a folder dataset per worker task: enough to make a task's round trip cheap.
FILES_PER_TASK = 256
#: What a batch of a folder dataset's files gave: the rows, and how many audio/video files got none.
FilesMedia = tuple[list[MediaRow], int]


def describe_files(root: str, files: list[tuple[str, int]], media: MediaFilter) -> FilesMedia | PrepError:
    """Worker task: describe the files `(path relative to root, size)` of a folder dataset, each judged
    by its own file name and keyed by its relative path; (rows, audio/video files skipped), or the
    error naming the first broken file."""
    rows: list[MediaRow] = []
    skipped_av = 0
    for relative, size in files:
        path = os.path.join(root, relative)
        try:
            with open(path, "rb") as file:
                read = from_file(file.fileno(), 0, size)
                kind, row = describe_part(relative, read, size, media, name=os.path.basename(relative))
        except MediaError as error:
            return broken_file(path, error)
        except OSError as error:
            return PrepError(f"{path} could not be read for media metadata: {error.strerror or error}.")
        except PrepError as error:
            return error
        if row is not None:
            rows.append(row)
        elif kind == AV:
            skipped_av += 1
    return rows, skipped_av


def broken_file(name: str, error: MediaError) -> PrepError:
    """The error for a folder dataset's file `name` (its path or address) whose media header is broken."""
    return PrepError(
        f"{name} at byte {error.offset}: looks like an image but its header cannot be read: {error.problem}."
        " Replace or remove the file, or leave it out of the media filter."
    )


@dataclass(frozen=True)
class FileReads:
    """Where the media stage reads a folder dataset's files, and in what workers: `describe(place, files,
    media)` for each batch of files `(relative path, size)`, run by `run`."""

    place: object
    describe: Callable[..., FilesMedia | PrepError] = describe_files
    run: RunTasks = _IN_PROCESSES


def add_folder_media_metadata(
    root: Path,
    files: list[tuple[str, int]],
    index_path: Path,
    media: MediaFilter,
    workers: int,
    progress: MediaProgress | None = None,
    *,
    reads: FileReads | None = None,
) -> MediaSummary:
    """Describe the files `(relative path, size)` into the index at `index_path` (made if missing; rows
    already there stay, as in energon) and record the filter; the first broken file stops the run. The
    files are read as `reads` says: by default, below the folder `root`."""
    summary = MediaSummary()
    if reads is None:
        reads = FileReads(str(root))
    tasks = [
        (reads.place, files[start : start + FILES_PER_TASK], media)
        for start in range(0, len(files), FILES_PER_TASK)
    ]
    with MediaIndexWriter(index_path) as writer:
        with closing(reads.run(reads.describe, tasks, workers)) as results:  # its workers end with it
            for done, result in enumerate(results, 1):
                if isinstance(result, PrepError):
                    raise result
                rows, skipped_av = result
                writer.add_media(rows)
                summary.rows += len(rows)
                summary.skipped_av += skipped_av
                if progress is not None:
                    progress(min(done * FILES_PER_TASK, len(files)), len(files))
        writer.add_media_filter(media.strategy, media.stored_patterns)
        writer.commit()
    return summary


def keep_old_media(dataset: str | Path, old: Path, new: Path) -> str | None:
    """Carry the media metadata of the old index at `old` into the new one at `new` (a prepare that
    describes no media keeps it, as energon's does); None once done, else the one warning that the old
    index's media metadata could not be read and is gone, and the commands that describe it again (of
    `dataset`: its folder, or a bucket dataset's address)."""
    problem = keep_media_tables(old, new)
    commands = None if problem is None else media_commands(old, dataset)
    if commands is None:  # nothing kept, or an index too damaged to say whether it held any
        return None
    return (
        f"the media metadata of the old index could not be read ({problem}) and is gone: run {commands} to"
        " describe the media again."
    )
