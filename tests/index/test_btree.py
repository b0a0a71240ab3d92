"""index.sqlite written as pages while rows come in order: the same database sqlite makes by inserting
them, checked by sqlite itself (integrity_check compares every index with its table)."""

from __future__ import annotations

import random
import sqlite3
import tracemalloc
from pathlib import Path

import pytest

from prep.index.btree import _groups
from prep.index.rows import ShardRows
from prep.index.sqlite import DuplicateKeyError, SqliteIndexWriter

TABLES = ("samples", "sample_parts")


def shard_rows(
    tar_file_id: int, keys: list[str], parts: tuple[str, ...] = ("txt",), start: int = 0, step: int = 1024
) -> ShardRows:
    """A shard whose samples are `keys` in that order, each with `parts`, `step` bytes apart from `start`."""
    rows = ShardRows(f"shard-{tar_file_id:04d}.tar", tar_file_id)
    rows.set_keys(keys)
    for index in range(len(keys)):
        offset = start + index * step
        rows.sample_starts.append(offset)
        rows.sample_sizes.append(step)
        for number, part in enumerate(parts):
            rows.part_samples.append(index)
            rows.part_names.append(part)
            rows.part_offsets.append(offset + 512 + number * 1024)
            rows.part_sizes.append(number + 1)
    rows.end = start + len(keys) * step
    return rows


def build(path: Path, shards: list[ShardRows], through_sqlite: bool = False) -> bool:
    """Write `shards` into a fresh index at `path`; whether pages were written directly to the end."""
    with SqliteIndexWriter(path, [rows.shard for rows in shards]) as writer:
        if through_sqlite:
            writer._connection()
        for rows in shards:
            writer.add_rows(rows)
        direct = writer.ordered is not None
        writer.finish()
    return direct


def contents(path: Path) -> dict[str, list]:
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        found = {
            table: db.execute(f"SELECT rowid, * FROM {table} ORDER BY rowid").fetchall() for table in TABLES
        }
        found["schema"] = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        return found
    finally:
        db.close()


def assert_same_as_sqlite(folder: Path, shards: list[ShardRows], direct: bool = True) -> dict[str, list]:
    """Build `shards` both ways in a new `folder`: the same database (pages written directly if `direct`)."""
    folder.mkdir()
    assert build(folder / "pages.sqlite", shards) is direct
    build(folder / "inserted.sqlite", shards, through_sqlite=True)
    written = contents(folder / "pages.sqlite")
    assert written == contents(folder / "inserted.sqlite")
    return written


def test_many_shards_of_one_part_samples_make_the_database_sqlite_makes(tmp_path: Path) -> None:
    # 120,000 samples: every tree three levels deep
    shards = [shard_rows(i, [f"{i * 3000 + j:09d}" for j in range(3000)], start=7) for i in range(40)]
    written = assert_same_as_sqlite(tmp_path / "db", shards)
    assert len(written["samples"]) == len(written["sample_parts"]) == 120_000


def test_parts_named_out_of_order_and_keys_of_many_lengths(tmp_path: Path) -> None:
    # part names of different lengths, in tar order rather than name order; keys sorted but not padded
    keys = sorted(f"k{n}" for n in range(20_000))
    parts = ("txt", "json", "jpg", "a.b.cls")
    shards = [shard_rows(i, keys[i * 2000 : (i + 1) * 2000], parts) for i in range(10)]
    assert_same_as_sqlite(tmp_path / "db", shards)


def test_keys_beyond_ascii_and_offsets_of_every_width(tmp_path: Path) -> None:
    keys = sorted(f"{'é' * (n % 5)}ключ-{n:05d}-🙂" for n in range(3000))
    shards = [
        shard_rows(0, keys[:1000], start=0, step=100),
        shard_rows(1, [], start=0),  # a shard without samples
        shard_rows(2, keys[1000:2000], start=2**31 - 5000, step=10),
        shard_rows(3, keys[2000:], start=2**47 + 3, step=2**20),
    ]
    assert_same_as_sqlite(tmp_path / "db", shards)


@pytest.mark.parametrize("seed", range(12))
def test_shard_sizes_that_end_pages_anywhere(tmp_path: Path, seed: int) -> None:
    # leaves and interior pages that end one entry short, exactly full or one over, in every tree
    rng = random.Random(seed)
    shards, first = [], 0
    for i in range(rng.randint(1, 6)):
        count = rng.choice([0, 1, 2, rng.randint(3, 400), rng.randint(400, 9000)])
        width = rng.choice([6, 9, 30, 200])
        keys = [f"{i}-{n:0{width}d}" for n in range(first, first + count)]
        shards.append(
            shard_rows(i, keys, rng.choice([("txt",), ("json", "cls")]), step=rng.choice([1, 4096]))
        )
        first += count
    assert_same_as_sqlite(tmp_path / "db", shards)


def test_interior_pages_each_get_a_cell() -> None:
    assert _groups(4096, [5] * 3) == [(0, 4)]
    assert _groups(4096, [1000] * 5) == [(0, 4), (4, 6)]  # the last page takes one child of the page before
    for count in range(1, 3000, 7):
        groups = _groups(4096, [13] * count)
        assert [first for first, _ in groups[1:]] == [stop for _, stop in groups[:-1]]
        assert groups[0][0] == 0 and groups[-1][1] == count + 1
        assert all(stop - first >= 2 for first, stop in groups)


def test_rows_out_of_order_go_on_through_sqlite(tmp_path: Path) -> None:
    shards = [
        shard_rows(0, [f"b{n:04d}" for n in range(3000)]),
        shard_rows(1, [f"a{n:04d}" for n in range(3000)]),  # keys below the first shard's
        shard_rows(2, [f"c{n:04d}" for n in range(3000)]),
    ]
    assert_same_as_sqlite(tmp_path / "across", shards, direct=False)
    # within a shard, keys in any order: the unique index is sorted, the rows stay in tar order
    shuffled = [f"{n:05d}" for n in range(5000)]
    random.Random(1).shuffle(shuffled)
    assert_same_as_sqlite(tmp_path / "within", [shard_rows(0, shuffled)])


def test_keys_pages_cannot_hold_go_through_sqlite(tmp_path: Path) -> None:
    long_keys = [shard_rows(0, ["a"]), shard_rows(1, ["b" * 2000, "c"])]  # over an index page's share
    assert_same_as_sqlite(tmp_path / "long", long_keys, direct=False)
    nul_keys = [shard_rows(0, ["a", "b\0c", "d"])]  # a PAX name can hold a NUL
    assert_same_as_sqlite(tmp_path / "nul", nul_keys, direct=False)


def test_one_long_key_among_short_ones_goes_through_sqlite_in_little_memory(tmp_path: Path) -> None:
    # Padding every key to the long one would take 50,000 x 990 bytes, and 8 times that to lay them out
    # (a second reader's case: a 1M-sample shard with one such key needed ~17 GB, a longer one raised
    # MemoryError); sqlite takes the shard instead.
    keys = [f"{n:08d}" for n in range(50_000)] + ["z" * 990]
    tracemalloc.start()
    try:
        assert_same_as_sqlite(
            tmp_path / "one-long", [shard_rows(0, ["0"]), shard_rows(1, keys)], direct=False
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20, f"peak {peak:,} B"
    # a key no page holds (over the 4,061 bytes of a table leaf's record) among many: refused before
    # anything is padded
    keys = [f"{n:06d}" for n in range(2000)] + ["y" * 300_000]
    assert_same_as_sqlite(tmp_path / "too-long", [shard_rows(0, keys)], direct=False)
    # part names likewise: one long name among short ones
    rows = shard_rows(0, [f"{n:06d}" for n in range(20_000)])
    rows.part_names[-1] = "p" * 900
    assert_same_as_sqlite(tmp_path / "long-part", [rows], direct=False)


def test_duplicate_key_after_written_pages_names_both_places(tmp_path: Path) -> None:
    shards = [
        shard_rows(0, [f"{n:05d}" for n in range(4000)]),
        shard_rows(1, [f"{n:05d}" for n in range(4000, 8000)]),
        shard_rows(2, ["09000", "01234"], start=512),
    ]
    with SqliteIndexWriter(tmp_path / "index.sqlite", [rows.shard for rows in shards]) as writer:
        writer.add_rows(shards[0])
        writer.add_rows(shards[1])
        assert writer.ordered is not None
        with pytest.raises(DuplicateKeyError) as raised:
            writer.add_rows(shards[2])
    message = str(raised.value)
    assert (
        "'01234' appears in shard-0000.tar at byte 1263616 and again in shard-0002.tar at byte 1536"
        in message
    )


def test_a_key_twice_in_one_shard_is_a_duplicate(tmp_path: Path) -> None:
    rows = shard_rows(0, ["a", "b", "b", "c"])
    with SqliteIndexWriter(tmp_path / "index.sqlite", [rows.shard]) as writer:
        with pytest.raises(DuplicateKeyError, match="shard-0000.tar: a sample key is not unique"):
            writer.add_rows(rows)


def test_a_half_built_index_is_closed_when_the_run_stops(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), SqliteIndexWriter(tmp_path / "index.sqlite", ["a.tar"]) as writer:
        writer.add_rows(shard_rows(0, ["a", "b"]))
        raise RuntimeError("stopped")
    assert writer.ordered is not None and writer.ordered.out.file.closed


def test_an_index_past_one_gib_leaves_sqlites_lock_byte_page_out(tmp_path: Path) -> None:
    # sqlite never uses the page holding the byte at 1 GiB; long keys reach it with few rows
    prefix = "k" * 900
    shards = [shard_rows(i, [f"{prefix}{i:03d}{n:04d}" for n in range(5000)]) for i in range(110)]
    path = tmp_path / "index.sqlite"
    assert build(path, shards)
    assert path.stat().st_size > 1 << 30
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert db.execute("SELECT count(*) FROM samples").fetchone() == (550_000,)
        found = db.execute(
            "SELECT tar_file_id, sample_index FROM samples WHERE sample_key = ?", (f"{prefix}1094321",)
        )
        assert found.fetchall() == [(109, 4321)]
    finally:
        db.close()


class SettledBytes:
    """An `IndexGrowth` that keeps what the writer called final, to compare with the finished file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.settled_bytes: list[tuple[int, bytes]] = []
        self.unsettled_after: int | None = None

    def settled(self, head: int, end: int) -> None:
        assert self.unsettled_after is None, "settled after unsettled"
        self.settled_bytes.append((head, self.path.read_bytes()[head:end]))
        assert len(self.settled_bytes[-1][1]) == end - head, "bytes called final are not in the file yet"

    def unsettled(self) -> None:
        self.unsettled_after = len(self.settled_bytes)


def test_bytes_the_writer_calls_final_stay_as_they_are(tmp_path: Path) -> None:
    """The contract a bucket prepare uploads index.sqlite by while it is written: after each shard, the
    bytes from the head (the pages sqlite made, rewritten at the end) to the end of the pages written
    are those of the finished file."""
    path = tmp_path / "index.sqlite"
    growth = SettledBytes(path)
    shards = [shard_rows(i, [f"k{i:03d}-{n:05d}" for n in range(3000)], ("jpg", "json")) for i in range(6)]
    with SqliteIndexWriter(path, [rows.shard for rows in shards], growth) as writer:
        for rows in shards:
            writer.add_rows(rows)
        writer.finish()
    final = path.read_bytes()
    assert len(growth.settled_bytes) == len(shards) and growth.unsettled_after is None
    head = growth.settled_bytes[0][0]
    assert 0 < head < 64 * 1024, "only the first pages are written over at the end"
    assert len(growth.settled_bytes[-1][1]) > len(final) // 2
    for start, settled in growth.settled_bytes:
        assert start == head and final[head : head + len(settled)] == settled
    assert contents(path) == contents(build_inserted(tmp_path, shards))


def test_a_writer_that_hands_over_to_sqlite_says_the_file_is_no_longer_final(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    growth = SettledBytes(path)
    shards = [shard_rows(0, ["b", "c"]), shard_rows(1, ["a"])]  # keys going back: sqlite takes over
    with SqliteIndexWriter(path, [rows.shard for rows in shards], growth) as writer:
        for rows in shards:
            writer.add_rows(rows)
        writer.finish()
    assert growth.unsettled_after == 1


def build_inserted(folder: Path, shards: list[ShardRows]) -> Path:
    path = folder / "inserted.sqlite"
    build(path, shards, through_sqlite=True)
    return path
