"""A prepared dataset being written: shards under temporary names, their index rows, then `.nv-meta`.

    with DatasetBuild(root, limits=ShardLimits(maxcount=10_000), pattern="shard-%06d.tar") as build:
        build.writer("train").write("000000001", [("txt", b"hello")])
        build.finish(["train"], definition)
        build.commit()

The shard writers hand over each finished shard's `ShardRows`; its `.tar.idx` goes to the staging area
and its rows to a file beside it at once, so memory stays flat. `finish` numbers the shards in
energon's order and builds `index.sqlite`, `.info.json`, `split.yaml`, `index.uuid` and `dataset.yaml`
with the same index writer `prepare` uses. Nothing looks complete before `commit`, which puts shards and
`.tar.idx` files in place and `.nv-meta` last; leaving the `with` block without it removes them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prep.errors import PrepError
from prep.index.dataset_yaml import DatasetDefinition
from prep.index.format import DATASET_YAML, INDEX_SQLITE, INDEX_UUID, INFO_JSON, SAMPLE_LOADER_PY, SPLIT_YAML
from prep.index.media import MediaSummary, add_media_metadata, shard_files
from prep.index.meta import info_json_text, new_index_uuid, split_yaml_text
from prep.index.rows import read_rows_file, write_rows_file, write_tar_index
from prep.index.shard_list import shard_sort_key
from prep.index.sqlite import UNIQUE_KEYS, DuplicateKeyError, SqliteIndexWriter
from prep.index.staging import Staging
from prep.media.filter import MediaFilter
from prep.processes import worker_count
from prep.tar.write import HeaderMaker
from prep.write.shards import ShardLimits, ShardWriter, WrittenShard


@dataclass
class FinishedShard:
    shard: str
    split: str
    count: int
    bytes: int
    #: The shard's rows (`write_rows_file`), kept on disk in the staging folder until `finish`.
    rows_path: Path
    #: Where the shard is staged until `commit`.
    path: Path


@dataclass
class ShardSlot:
    """A shard reserved for writing elsewhere: its name and where the shard and its index files go."""

    shard: str
    path: Path
    tar_index_path: Path
    rows_path: Path
    split: str


#: Told of each shard once it is whole: its final path and where it is staged until `commit`.
ShardWritten = Callable[[Path, Path], None]


class DatasetBuild:
    """Shards, `.tar.idx` files and `.nv-meta` of one dataset under `root`, staged until `commit`;
    `on_shard` is told of each shard as soon as it is whole (a write to a bucket sends it up then)."""

    def __init__(
        self,
        root: Path,
        *,
        limits: ShardLimits,
        pattern: str,
        mtime: int = 0,
        on_shard: ShardWritten | None = None,
    ) -> None:
        self.staging = Staging(root, carry_over=False)  # a write replaces the whole index
        self.root = root
        self.limits = limits
        self.pattern = pattern
        self.headers = HeaderMaker(mtime)
        self.finished: list[FinishedShard] = []
        self.writers: dict[str, ShardWriter] = {}
        #: Rows files named so far (shards written here and shards reserved for writing elsewhere).
        self.rows_files = 0
        self.on_shard = on_shard

    def writer(self, split: str, folder: str = "") -> ShardWriter:
        """The shard writer for a split, writing into `root/folder` (e.g. `train/`)."""
        writer = self.writers.get(split)
        if writer is None:
            writer = ShardWriter(
                self.root / folder if folder else self.root,
                self.pattern,
                prefix=f"{folder.strip('/')}/" if folder else "",
                limits=self.limits,
                temp_name=self.staging.temp_path,
                on_close=lambda written, split=split: self._shard_closed(split, written),
                headers=self.headers,
            )
            self.writers[split] = writer
        return writer

    def _shard_closed(self, split: str, written: WrittenShard) -> None:
        rows = written.rows
        write_tar_index(self.staging.tar_index_file(written.shard), rows)
        rows_path = self._rows_path()
        write_rows_file(rows_path, rows)
        self._finished(
            FinishedShard(written.shard, split, rows.count, written.bytes, rows_path, written.path)
        )

    def _finished(self, shard: FinishedShard) -> None:
        self.finished.append(shard)
        if self.on_shard is not None:
            self.on_shard(self.root / shard.shard, shard.path)

    def _rows_path(self) -> Path:
        self.rows_files += 1
        return self.staging.meta_file(f"rows-{self.rows_files - 1}.pickle")

    def reserve_shard(self, split: str, folder: str = "") -> ShardSlot:
        """Name the next shard of `split` (in `root/folder`) for a writer elsewhere (another process): where
        it and its index go.

        The caller writes the shard to `slot.path`, its `.tar.idx` and its rows file, then hands it back
        with `adopt`. Shards reserved this way and written by `writer(split)` share one numbering."""
        writer = self.writer(split, folder)
        writer.finish_shard()
        shard, final = writer.next_shard()
        staged = self.staging.temp_path(final)
        return ShardSlot(shard, staged, self.staging.tar_index_file(shard), self._rows_path(), split)

    def adopt(self, slot: ShardSlot, count: int, nbytes: int) -> None:
        """Take in a reserved shard that has been written with its index files; `nbytes` is its tar size."""
        self._finished(FinishedShard(slot.shard, slot.split, count, nbytes, slot.rows_path, slot.path))

    def finish(
        self,
        split_names: list[str],
        definition: DatasetDefinition | None,
        media: MediaFilter | None = None,
        num_workers: int | None = None,
    ) -> MediaSummary | None:
        """Close every shard and write the index into the staging area (nothing is in place yet); with a
        media filter, the shards' media parts are described into it too (read where they are staged)."""
        for writer in self.writers.values():
            writer.close()
        shards = sorted(self.finished, key=lambda shard: shard_sort_key(shard.shard))
        with SqliteIndexWriter(
            self.staging.meta_file(INDEX_SQLITE), [shard.shard for shard in shards]
        ) as index:
            for tar_file_id, shard in enumerate(shards):
                rows = read_rows_file(shard.rows_path)
                rows.tar_file_id = tar_file_id  # the shard's place is known only now
                try:
                    index.add_rows(rows)
                except DuplicateKeyError as error:  # the key stage refuses duplicates; this is the backstop
                    raise PrepError(
                        f"{error.places} {UNIQUE_KEYS} Give the samples distinct keys (their --key-column"
                        " values, __key__ fields or file names)."
                    ) from None
                shard.rows_path.unlink()
            index.finish()
        described = None
        if media is not None:
            names = [shard.shard for shard in shards]
            reads = shard_files([shard.path for shard in shards])
            index_path = self.staging.meta_file(INDEX_SQLITE)
            workers = worker_count(num_workers, len(shards))
            described = add_media_metadata(self.root, names, index_path, media, workers, reads=reads)
        splits = {name: [shard.shard for shard in shards if shard.split == name] for name in split_names}
        meta = {
            INDEX_UUID: new_index_uuid(),
            INFO_JSON: info_json_text({shard.shard: shard.count for shard in shards}),
            SPLIT_YAML: split_yaml_text(splits),
        }
        if definition is not None:
            meta[DATASET_YAML] = definition.yaml
            if definition.sample_loader is not None:
                meta[SAMPLE_LOADER_PY] = definition.sample_loader
        for name, text in meta.items():
            self.staging.meta_file(name).write_text(text)
        return described

    def split_counts(self, split_names: list[str]) -> dict[str, int]:
        """Samples written per split."""
        return {
            name: sum(shard.count for shard in self.finished if shard.split == name) for name in split_names
        }

    def commit(self) -> None:
        """Shards and their `.tar.idx` files into place, then `.nv-meta` (the step that makes it complete)."""
        self.staging.commit()

    def abort(self) -> None:
        """Remove every file this build wrote; whatever was under `root` before stays as it was."""
        for writer in self.writers.values():
            writer.abort()
        self.staging.abort()

    def __enter__(self) -> DatasetBuild:
        return self

    def __exit__(self, exc_type: type | None, *exc_info: object) -> None:
        if not self.staging.committed:
            self.abort()
