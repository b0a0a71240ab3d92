"""Write the index files of a prepared dataset: `index.sqlite`, `.info.json`, `split.yaml`, `index.uuid`.

One writer serves `prepare` and `write`. The sqlite rows go in per shard in bulk with the secondary
indexes created at the end; the sample-key uniqueness that energon relies on is enforced by the table.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from itertools import chain
from pathlib import Path

from prep.brace import collapse
from prep.errors import PrepError
from prep.index_format import (
    ENERGON_FORMAT_VERSION,
    SAMPLE_PARTS_TABLE,
    SAMPLES_TABLE,
    SECONDARY_INDEXES,
)
from prep.shard_index import ShardRows

#: sqlite page cache while rows go in: appends touch few pages, and scanning workers run meanwhile.
INSERT_CACHE_KIB = 2048
#: sqlite page cache for building the secondary indexes at the end (the sorter works in it).
INDEX_BUILD_CACHE_KIB = 16384


class DuplicateKeyError(PrepError):
    """The same sample key in two places: energon's index cannot hold it."""


def insert_columns(db: sqlite3.Connection, table: str, tar_file_id: int, columns: list[Sequence]) -> None:
    """Bulk-insert rows `(tar_file_id, *columns[.][i])` with multi-row INSERT statements, straight from the
    columns: only one statement's rows exist as Python values at a time."""
    count = len(columns[0])
    if not count:
        return
    width = len(columns)
    per_statement = max(1, min(2000, (db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) - 1) // width))
    row_marks = "(?1," + ",".join("?" * width) + ")"  # each "?" numbers itself after the largest so far
    statement = ""
    for start in range(0, count, per_statement):
        stop = min(count, start + per_statement)
        if stop - start != per_statement or not statement:
            statement = f"INSERT INTO {table} VALUES " + ",".join([row_marks] * (stop - start))
        values = [tar_file_id]
        values += chain.from_iterable(zip(*(column[start:stop] for column in columns), strict=True))
        db.execute(statement, values)


class _SampleKeys:
    """The sample keys of a ShardRows as a column of `insert_columns`, cut into str objects a statement's
    worth at a time."""

    def __init__(self, rows: ShardRows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return self.rows.count

    def __getitem__(self, rows: slice) -> list[str]:
        return self.rows.keys_between(rows.start, rows.stop)


class SqliteIndexWriter:
    """Builds a fresh `index.sqlite` at `path` from each shard's ShardRows, shard by shard."""

    def __init__(self, path: Path, shard_names: list[str]) -> None:
        self.path = path
        self.shard_names = shard_names
        self.db = sqlite3.connect(path, isolation_level=None)
        # A fresh file in a staging folder that nobody reads before we finish: no fsync, journal in RAM
        # (per-shard transactions keep it small). Index builds sort in temp files, so memory stays flat.
        # A small page cache while rows go in (they are appended); a bigger one for the index builds.
        for pragma in (
            "PRAGMA journal_mode = MEMORY",
            "PRAGMA synchronous = OFF",
            "PRAGMA locking_mode = EXCLUSIVE",
            f"PRAGMA cache_size = -{INSERT_CACHE_KIB}",
        ):
            self.db.execute(pragma)
        self.db.execute(SAMPLES_TABLE)
        self.db.execute(SAMPLE_PARTS_TABLE)

    def add_rows(self, rows: ShardRows) -> None:
        """Insert one shard's rows straight from their columns (`prepare` scans them with `shard_rows`,
        `write` records them as it writes); a key already in the index raises DuplicateKeyError naming
        both places."""
        self.db.execute("BEGIN")
        try:
            samples = [_SampleKeys(rows), range(rows.count), rows.sample_starts, rows.sample_sizes]
            insert_columns(self.db, "samples", rows.tar_file_id, samples)
        except sqlite3.IntegrityError:
            self.db.execute("ROLLBACK")
            raise self._duplicate_of(rows) from None
        parts = [rows.part_samples, rows.part_names, rows.part_offsets, rows.part_sizes]
        insert_columns(self.db, "sample_parts", rows.tar_file_id, parts)
        self.db.execute("COMMIT")

    def _duplicate_of(self, rows: ShardRows) -> DuplicateKeyError:
        """The first sample of `rows` whose key is already in the index, as an error naming both places."""
        for key, offset in zip(rows.sample_keys, rows.sample_starts, strict=True):
            found = self.db.execute("SELECT tar_file_id, byte_offset FROM samples WHERE sample_key = ?", (key,))
            row = found.fetchone()
            if row is not None:
                return self._duplicate_error(key, row[0], row[1], rows.shard, offset)
        return DuplicateKeyError(f"{rows.shard}: a sample key is not unique across the dataset.")

    def _duplicate_error(
        self, key: str, first_shard: int, first_offset: int, shard_name: str, offset: int
    ) -> DuplicateKeyError:
        return DuplicateKeyError(
            f"Sample key {key!r} appears in {self.shard_names[first_shard]} at byte {first_offset} and again"
            f" in {shard_name} at byte {offset}. energon needs every sample key to be unique across the"
            " dataset (the key is the member path up to the first dot of its file name). Rename one of them,"
            " e.g. by re-writing the shards with a per-shard key prefix, or leave one shard out with --exclude."
        )

    def finish(self) -> None:
        """Create the secondary indexes and close the database."""
        self.db.execute(f"PRAGMA cache_size = -{INDEX_BUILD_CACHE_KIB}")
        self.db.execute("BEGIN")
        for statement in SECONDARY_INDEXES:
            self.db.execute(statement)
        self.db.execute("COMMIT")
        self.db.close()

    def abort(self) -> None:
        self.db.close()


def info_json_text(shard_counts: dict[str, int]) -> str:
    """`.info.json` exactly as energon writes it: format version, then shard counts in shard order."""
    info = {"energon_version": ENERGON_FORMAT_VERSION, "shard_counts": shard_counts}
    return json.dumps(info, indent=2)


def info_yaml_text(shard_counts: dict[str, int]) -> str:
    """The legacy `.info.yaml`, kept in sync when a dataset still has one (energon does the same)."""
    import yaml

    return yaml.dump({"energon_version": ENERGON_FORMAT_VERSION, "shard_counts": shard_counts})


def split_yaml_text(splits: dict[str, list[str]]) -> str:
    """`split.yaml`: each split's shards, brace-collapsed in order, and an empty exclude list."""
    import yaml

    document = {"split_parts": {name: collapse(shards) for name, shards in splits.items()}, "exclude": []}
    return yaml.dump(document, sort_keys=False)


def new_index_uuid() -> str:
    """A fresh dataset identity, as energon writes one on every re-index."""
    return str(uuid.uuid4())
