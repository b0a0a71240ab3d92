"""A prepared dataset being written: shards under temporary names, their index rows, then `.nv-meta`.

The shard writer hands over each finished shard's `ShardRows`; its `.tar.idx` goes to the staging area
and its rows to a file beside it at once, so memory stays flat. `finish` numbers the shards in
energon's order and builds `index.sqlite`, `.info.json`, `split.yaml`, `index.uuid` and `dataset.yaml`
with the same index writer `prepare` uses. Nothing looks complete before `commit`: shards are renamed
into place first and `.nv-meta` last.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path

from prep.index_format import DATASET_YAML, INDEX_SQLITE, INDEX_UUID, INFO_JSON, SPLIT_YAML
from prep.index_writer import (
    SqliteIndexWriter,
    info_json_text,
    new_index_uuid,
    split_yaml_text,
)
from prep.shard_index import ShardRows, tar_index_bytes
from prep.shard_list import shard_sort_key
from prep.shard_writer import HeaderMaker, ShardWriter, WrittenShard
from prep.staging import Staging


def write_rows_file(path: Path, rows: ShardRows) -> None:
    """Keep a shard's index rows in a staging file until the index is built.

    Whoever wrote the shard (this process or a worker) saves them; `finish` inserts them with the index
    writer `prepare` uses. A pickle: the columns and keys go as a few buffers (all keys are one string)."""
    path.write_bytes(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))


def read_rows_file(path: Path) -> ShardRows:
    """The rows `write_rows_file` saved (a file this build wrote into its own staging folder)."""
    return pickle.loads(path.read_bytes())


@dataclass
class FinishedShard:
    shard: str
    split: str
    count: int
    bytes: int
    #: The shard's rows (`write_rows_file`), kept on disk in the staging folder until `finish`.
    rows_path: Path


@dataclass
class ShardSlot:
    """A shard reserved for writing elsewhere: its name and where the shard and its index files go."""

    shard: str
    path: Path
    tar_index_path: Path
    rows_path: Path
    split: str


class DatasetBuild:
    """Shards, `.tar.idx` files and `.nv-meta` of one dataset under `root`, staged until `commit`."""

    def __init__(self, root: Path, *, maxcount: int, maxsize: float, pattern: str, mtime: int = 0) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.pattern = pattern
        self.headers = HeaderMaker(mtime)
        self.staging = Staging(root)
        self.token = self.staging.token
        for carried in self.staging.staged_meta.iterdir():
            carried.unlink()  # a write replaces the whole index; nothing of an old one carries over
        self.staged_shards: list[tuple[Path, Path]] = []
        self.finished: list[FinishedShard] = []
        self.writers: dict[str, ShardWriter] = {}
        #: Rows files named so far (shards written here and shards reserved for writing elsewhere).
        self.rows_files = 0

    def temp_name(self, final: Path) -> Path:
        """Where a shard is written until commit: beside its final place, hidden by a temporary suffix."""
        staged = final.with_name(f"{final.name}.shardprep-{self.token}.tmp")
        self.staged_shards.append((staged, final))
        return staged

    def writer(self, split: str, folder: str = "") -> ShardWriter:
        """The shard writer for a split, writing into `root/folder` (e.g. `train/`)."""
        writer = self.writers.get(split)
        if writer is None:
            prefix = f"{folder.strip('/')}/" if folder else ""
            writer = ShardWriter(
                self.root / folder if folder else self.root,
                self.pattern,
                prefix=prefix,
                maxcount=self.maxcount,
                maxsize=self.maxsize,
                temp_name=self.temp_name,
                on_close=lambda written, split=split: self._shard_closed(split, written),
                headers=self.headers,
            )
            self.writers[split] = writer
        return writer

    def _shard_closed(self, split: str, written: WrittenShard) -> None:
        rows = written.rows
        with open(self.staging.tar_index_file(written.shard), "wb") as file:
            file.write(tar_index_bytes(rows.offsets()))
        rows_path = self._rows_path()
        write_rows_file(rows_path, rows)
        self.finished.append(FinishedShard(written.shard, split, rows.count, written.bytes, rows_path))

    def _rows_path(self) -> Path:
        self.rows_files += 1
        return self.staging.meta_file(f"rows-{self.rows_files - 1}.pickle.tmp")

    def reserve_shard(self, split: str) -> ShardSlot:
        """Name the next shard of `split` for a writer elsewhere (another process): where it and its index go.

        The caller writes the shard to `slot.path`, its `.tar.idx` and its rows file, then hands it back
        with `adopt`. Shards reserved this way and written by `writer(split)` share one numbering."""
        writer = self.writer(split)
        writer.finish_shard()
        shard, final = writer.next_shard()
        return ShardSlot(
            shard,
            self.temp_name(final),
            self.staging.tar_index_file(shard),
            self._rows_path(),
            split,
        )

    def adopt(self, slot: ShardSlot, count: int, nbytes: int) -> None:
        """Take in a reserved shard that has been written with its index files; `nbytes` is its tar size."""
        self.finished.append(FinishedShard(slot.shard, slot.split, count, nbytes, slot.rows_path))

    def finish(self, split_names: list[str], dataset_yaml: str | None, extra_meta: dict[str, str] | None = None) -> None:
        """Close every shard and write the index into the staging area (nothing is in place yet)."""
        for writer in self.writers.values():
            writer.close()
        shards = sorted(self.finished, key=lambda shard: shard_sort_key(shard.shard))
        names = [shard.shard for shard in shards]
        writer = SqliteIndexWriter(self.staging.meta_file(INDEX_SQLITE), names)
        try:
            for tar_file_id, shard in enumerate(shards):
                rows = read_rows_file(shard.rows_path)
                rows.tar_file_id = tar_file_id  # the shard's place is known only now
                writer.add_rows(rows)
                shard.rows_path.unlink()
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        splits = {name: [shard.shard for shard in shards if shard.split == name] for name in split_names}
        meta = {
            INDEX_UUID: new_index_uuid(),
            INFO_JSON: info_json_text({shard.shard: shard.count for shard in shards}),
            SPLIT_YAML: split_yaml_text(splits),
        }
        if dataset_yaml is not None:
            meta[DATASET_YAML] = dataset_yaml
        meta.update(extra_meta or {})
        for name, text in meta.items():
            self.staging.meta_file(name).write_text(text)

    def commit(self) -> None:
        """Shards into place, then the `.tar.idx` files, then `.nv-meta` (the step that makes it complete)."""
        for staged, final in self.staged_shards:
            os.replace(staged, final)
        self.staged_shards.clear()
        self.staging.commit()

    def abort(self) -> None:
        """Remove every file this build wrote; whatever was under `root` before stays as it was."""
        folders = {final.parent for _, final in self.staged_shards} - {self.root}
        for writer in self.writers.values():
            writer.abort()
        for staged, _ in self.staged_shards:
            staged.unlink(missing_ok=True)
        self.staged_shards.clear()
        self.staging.abort()
        for folder in folders:
            try:
                folder.rmdir()  # only if this run created it and left it empty
            except OSError:
                pass
