"""Write the index files of a prepared dataset: `index.sqlite`, `.info.json`, `split.yaml`, `index.uuid`.

One writer serves `prepare` and `write`. The sqlite rows go in per shard in bulk with the secondary
indexes created at the end; the sample-key uniqueness that energon relies on is enforced by the table.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

from prep.brace import collapse
from prep.errors import PrepError
from prep.index_format import (
    ENERGON_FORMAT_VERSION,
    INSERT_PART,
    INSERT_SAMPLE,
    SAMPLE_PARTS_TABLE,
    SAMPLES_TABLE,
    SECONDARY_INDEXES,
)
from prep.shard_index import ShardIndex


class DuplicateKeyError(PrepError):
    """The same sample key in two places: energon's index cannot hold it."""


class SqliteIndexWriter:
    """Builds a fresh `index.sqlite` at `path` from ShardIndex results, shard by shard."""

    def __init__(self, path: Path, shard_names: list[str]) -> None:
        self.path = path
        self.shard_names = shard_names
        self.db = sqlite3.connect(path, isolation_level=None)
        # A fresh file built in a staging folder: no journal needed, nobody reads it before we finish.
        for pragma in (
            "PRAGMA journal_mode = OFF",
            "PRAGMA synchronous = OFF",
            "PRAGMA locking_mode = EXCLUSIVE",
            "PRAGMA temp_store = MEMORY",
            "PRAGMA cache_size = -65536",
        ):
            self.db.execute(pragma)
        self.db.execute(SAMPLES_TABLE)
        self.db.execute(SAMPLE_PARTS_TABLE)
        self.db.execute("BEGIN")

    def add_shard(self, shard: ShardIndex) -> None:
        """Insert one shard's rows; a key already in the index raises DuplicateKeyError naming both places."""
        self.db.execute("SAVEPOINT shard")
        try:
            self.db.executemany(INSERT_SAMPLE, shard.samples)
        except sqlite3.IntegrityError:
            self.db.execute("ROLLBACK TO shard")
            raise self._duplicate(shard) from None
        self.db.execute("RELEASE shard")
        self.db.executemany(INSERT_PART, shard.parts)

    def _duplicate(self, shard: ShardIndex) -> DuplicateKeyError:
        for _, key, _, offset, _ in shard.samples:
            row = self.db.execute(
                "SELECT tar_file_id, byte_offset FROM samples WHERE sample_key = ?", (key,)
            ).fetchone()
            if row is not None:
                first = self.shard_names[row[0]]
                return DuplicateKeyError(
                    f"Sample key {key!r} appears in {first} at byte {row[1]} and again in {shard.shard} at"
                    f" byte {offset}. energon needs every sample key to be unique across the dataset (the"
                    " key is the member path up to the first dot of its file name). Rename one of them,"
                    " e.g. by re-writing the shards with a per-shard key prefix, or exclude one shard with"
                    " --exclude."
                )
        return DuplicateKeyError(f"{shard.shard}: a sample key is not unique across the dataset.")

    def finish(self) -> None:
        """Create the secondary indexes and close the database."""
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
