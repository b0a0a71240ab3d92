"""`IndexReader`: every thread reads the file first opened, and an index it cannot read is a PrepError
naming the file, never a raw sqlite error."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.index.format import SAMPLE_PARTS_TABLE, SAMPLES_TABLE, SECONDARY_INDEXES
from prep.index.sqlite import IndexChangedError, IndexReader
from tests.support.damaged_index import zero_leaf_pages


def write_index(path: Path, prefix: str, samples: int = 50) -> Path:
    """An index.sqlite of one shard whose sample keys start with `prefix`, each sample a txt part."""
    with closing(sqlite3.connect(path)) as db:
        for statement in (SAMPLES_TABLE, SAMPLE_PARTS_TABLE, *SECONDARY_INDEXES):
            db.execute(statement)
        db.executemany(
            "INSERT INTO samples VALUES (0, ?, ?, ?, 1024)",
            [(f"{prefix}{i:05d}", i, i * 1024) for i in range(samples)],
        )
        db.executemany(
            "INSERT INTO sample_parts VALUES (0, ?, 'txt', ?, 9)",
            [(i, i * 1024 + 512) for i in range(samples)],
        )
        db.commit()
    return path


def in_new_thread(call: Callable[[], object]) -> object:
    """What `call` returns, or the exception it raises, when called from a thread of its own."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as error:  # noqa: BLE001 - handed back to the test to assert on
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return outcome[0]


def test_a_thread_connecting_after_the_index_was_renamed_over_never_reads_the_new_index(tmp_path):
    # Each thread connected by path: one connecting after `prepare` renamed a new index into place read
    # the new file, whose rowids are other samples, while the others read the old one.
    index = write_index(tmp_path / "index.sqlite", "old-")
    reader = IndexReader(index)
    assert reader.sample_by_rowid(1).key == "old-00000"
    os.replace(write_index(tmp_path / "new.sqlite", "new-"), index)
    late = in_new_thread(lambda: reader.sample_by_rowid(1))
    assert isinstance(late, IndexChangedError), late
    assert f"{index} was replaced after it was opened" in str(late)
    assert reader.sample_by_rowid(1).key == "old-00000"  # a connection made before goes on reading
    reader.close()


#: The reads that went past `_one`/`_all` and raised sqlite's own error: (table damaged, read).
WHOLE_READS: dict[str, tuple[str, Callable[[IndexReader], object]]] = {
    "samples_of_shard": ("samples", lambda reader: list(reader.samples_of_shard(0))),
    "parts_named": ("sample_parts", lambda reader: list(reader.parts_named("txt"))),
    "columns of samples": (
        "samples",
        lambda reader: reader.columns("samples", {"i": "sample_index"}, "sample_key"),
    ),
    "columns of sample_parts": (
        "sample_parts",
        lambda reader: reader.columns("sample_parts", {"o": "content_byte_offset"}, "part_name"),
    ),
}


@pytest.mark.parametrize("read", list(WHOLE_READS))
def test_a_damaged_page_met_by_a_lazy_or_whole_column_read_is_a_prep_error_naming_the_file(tmp_path, read):
    index = write_index(tmp_path / "index.sqlite", "sample-", samples=2000)
    table, call = WHOLE_READS[read]
    zero_leaf_pages(index, table)
    reader = IndexReader(index)
    assert reader.sample_by_rowid(1).key == "sample-00000"  # opening reads the first pages: still fine
    with pytest.raises(PrepError) as raised:
        call(reader)
    assert not isinstance(raised.value, IndexChangedError)  # damaged before it was opened, not since
    assert str(raised.value) == (
        f"{index} cannot be read (database disk image is malformed). Re-run `shardprep prepare` (or"
        " `energon prepare`) on the dataset folder."
    )
    reader.close()
