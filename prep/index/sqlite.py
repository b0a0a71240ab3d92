"""`index.sqlite`, written and read: the only module with SQL in it.

`SqliteIndexWriter` builds a fresh index from each shard's `ShardRows` (one writer serves `prepare` and
`write`). sqlite makes the file with energon's tables and indexes; while the rows come in the order they
sort in (shard by shard, sample keys ascending: nearly every dataset), `prep.index.btree` writes them as
finished pages, about 3x cheaper than sqlite's inserts (1M samples: 0.34 s against 1.09 s); from the
first shard that does not continue in order or fit the format's simple case (keys that go back, a
duplicate, a key with a NUL, one too long for a page or far longer than the shard's others), sqlite
inserts the rest per shard in bulk, where the table enforces the sample-key uniqueness energon relies on.
The indexes are there from the start: rows land at their end either way, which costs less than sorting
every row into them afterwards, and leaves nothing to do once the last shard is in. `IndexReader` holds
every query anyone runs against an index: row lookups (preview), whole columns (verify, info), and the
joins a mount answers names and listings with, each a named method, over one read-only connection per
thread.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from prep.errors import PrepError
from prep.index.format import (
    MEDIA_FILTERS_TABLE,
    MEDIA_METADATA_TABLE,
    SAMPLE_PARTS_TABLE,
    SAMPLES_TABLE,
    SECONDARY_INDEXES,
)
from prep.index.meta import RERUN_PREPARE, unreadable_error, unreadable_reason
from prep.index.rows import ShardRows
from prep.media.filter import MediaFilter, describe_again

if TYPE_CHECKING:
    import numpy as np

    from prep.index.columns import TextColumn

#: sqlite page cache while rows go in: appends touch few pages, and scanning workers run meanwhile.
INSERT_CACHE_KIB = 2048
#: Rows per `group_concat` query of a column read: bounds each string well below sqlite's 1 GB limit.
COLUMN_CHUNK_ROWS = 1 << 20


#: Why a duplicate key is an error, said after where it is.
UNIQUE_KEYS = (
    "energon needs every sample key to be unique across the dataset (the key is the member path up to the"
    " first dot of its file name)."
)


class DuplicateKeyError(PrepError):
    """The same sample key in two places: energon's index cannot hold it. `places` names the key and
    both places, for a command to give its own advice; the message gives prepare's."""

    def __init__(self, places: str) -> None:
        self.places = places
        super().__init__(
            f"{places} {UNIQUE_KEYS} Rename one of them, e.g. by re-writing the shards with a per-shard"
            " key prefix, leave one shard out with --exclude, or prepare with --fix-duplicates to put each"
            " shard's path in front of its member names in place (as energon does)."
        )

    def __reduce__(self) -> tuple:
        return (self.__class__, (self.places,))


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
        values = [tar_file_id] * (1 + width * (stop - start))
        for place, column in enumerate(columns, 1):  # row-major: each column every `width` places
            values[place::width] = column[start:stop]
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


class NullRowsError(PrepError):
    """Rows of an index table without a value in a column (a hand-damaged index.sqlite): how many, and
    the (tar_file_id, sample_index) of the first, either None if NULL too, for a command to name its
    shard and sample."""

    def __init__(self, table: str, column: str, count: int, first: tuple[int | None, int | None]) -> None:
        self.table, self.column, self.count, self.first = table, column, count, first
        super().__init__(f"{count:,} row(s) of {table} have no {column} (NULL).")

    def __reduce__(self) -> tuple:
        return (self.__class__, (self.table, self.column, self.count, self.first))


class IndexGrowth(Protocol):
    """Told how far the `index.sqlite` being written is final, so that it can be read (uploaded) while it
    grows (`prep.storage.upload.GrowingUpload`)."""

    def settled(self, head: int, end: int) -> None:
        """The file's bytes from `head` to `end` will not change again (those before `head` will)."""

    def unsettled(self) -> None:
        """Any byte of the file may change from now on, up to its `finish`."""


class SqliteIndexWriter:
    """Builds a fresh `index.sqlite` at `path` from each shard's ShardRows, shard by shard.

        with SqliteIndexWriter(path, shard_names) as writer:
            for rows in each_shards_rows:
                writer.add_rows(rows)
            writer.finish()

    Leaving the block without `finish` closes the half-built file (the caller's staging removes it). A
    `growth` is told after each shard how much of the file is final.
    """

    def __init__(self, path: Path, shard_names: list[str], growth: IndexGrowth | None = None) -> None:
        from prep.index.btree import OrderedTables  # numpy, only where an index is written

        self.path = path
        self.shard_names = shard_names
        self.growth = growth
        self._finished = False
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute("PRAGMA synchronous = OFF")  # a fresh file in a staging folder (see _connection)
            db.execute("BEGIN")
            db.execute(SAMPLES_TABLE)
            db.execute(SAMPLE_PARTS_TABLE)
            for statement in SECONDARY_INDEXES:
                db.execute(statement)
            db.execute("COMMIT")
        #: Pages written directly while rows come in order; then sqlite, from the first shard that does not.
        self.ordered: OrderedTables | None = OrderedTables(path)
        self.db: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        """sqlite's connection to the index, the directly written pages closed first."""
        if self.db is None:
            if self.ordered is not None:
                if self.growth is not None:
                    self.growth.unsettled()
                self.ordered.close()
                self.ordered = None
            self.db = sqlite3.connect(self.path, isolation_level=None)
            # A fresh file in a staging folder that nobody reads before we finish: no fsync, journal in
            # RAM (per-shard transactions keep it small), a small page cache (rows are mostly appended).
            for pragma in (
                "PRAGMA journal_mode = MEMORY",
                "PRAGMA synchronous = OFF",
                "PRAGMA locking_mode = EXCLUSIVE",
                f"PRAGMA cache_size = -{INSERT_CACHE_KIB}",
            ):
                self.db.execute(pragma)
        return self.db

    def add_rows(self, rows: ShardRows) -> None:
        """Insert one shard's rows straight from their columns (`prepare` scans them with `shard_rows`,
        `write` records them as it writes); a key already in the index raises DuplicateKeyError naming
        both places."""
        if self.ordered is not None:
            columns = _ordered_columns(rows, self.ordered.longest_text)
            if columns is not None and self.ordered.add(columns):
                if self.growth is not None:
                    self.growth.settled(*self.ordered.settled())
                return
        db = self._connection()
        db.execute("BEGIN")
        try:
            samples = [_SampleKeys(rows), range(rows.count), rows.sample_starts, rows.sample_sizes]
            insert_columns(db, "samples", rows.tar_file_id, samples)
        except sqlite3.IntegrityError:
            db.execute("ROLLBACK")
            raise self._duplicate_of(rows) from None
        parts = [rows.part_samples, rows.part_names, rows.part_offsets, rows.part_sizes]
        insert_columns(db, "sample_parts", rows.tar_file_id, parts)
        db.execute("COMMIT")

    def _duplicate_of(self, rows: ShardRows) -> DuplicateKeyError:
        """The first sample of `rows` whose key is already in the index or earlier in `rows`, as an error
        naming both places."""
        db = self._connection()
        earlier: dict[str, int] = {}
        for key, offset in zip(rows.sample_keys, rows.sample_starts, strict=True):
            found = db.execute("SELECT tar_file_id, byte_offset FROM samples WHERE sample_key = ?", (key,))
            row = found.fetchone()
            if row is not None:
                first_shard, first_offset = row
                return DuplicateKeyError(
                    f"Sample key {key!r} appears in {self.shard_names[first_shard]} at byte {first_offset} and"
                    f" again in {rows.shard} at byte {offset}."
                )
            if key in earlier:
                return DuplicateKeyError(
                    f"{rows.shard}: a sample key is not unique: {key!r} appears at byte {earlier[key]} and"
                    f" again at byte {offset}."
                )
            earlier[key] = offset
        return DuplicateKeyError(f"{rows.shard}: a sample key is not unique across the dataset.")

    def finish(self) -> None:
        """Close the finished database."""
        if self.ordered is not None:
            self.ordered.close()
        if self.db is not None:
            self.db.close()
        self._finished = True

    def __enter__(self) -> SqliteIndexWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._finished:
            if self.ordered is not None:
                self.ordered.abandon()
            if self.db is not None:
                self.db.close()


def _ordered_columns(rows: ShardRows, longest: int) -> dict[str, list] | None:
    """A shard's rows as the columns of `samples` and `sample_parts`, for `OrderedTables.add`; None if
    its texts are not for it (a key with a NUL in it, one over `longest` bytes, or one far longer than
    the rest: `prep.index.btree.check_padding`)."""
    import numpy as np

    from prep.index.btree import Unsupported, texts_between_nuls, texts_of

    def ints(values: Sequence[int]) -> np.ndarray:
        return np.frombuffer(values, dtype=np.int64) if len(values) else np.zeros(0, dtype=np.int64)

    try:
        keys = texts_between_nuls(rows.keys_text, rows.count, longest)
        names = texts_of(rows.part_names, longest)
    except Unsupported:
        return None
    shard_samples = np.full(rows.count, rows.tar_file_id, dtype=np.int64)
    shard_parts = np.full(len(rows.part_names), rows.tar_file_id, dtype=np.int64)
    samples = [shard_samples, keys, np.arange(rows.count, dtype=np.int64)]
    samples += [ints(rows.sample_starts), ints(rows.sample_sizes)]
    parts = [shard_parts, ints(rows.part_samples), names, ints(rows.part_offsets), ints(rows.part_sizes)]
    return {"samples": samples, "sample_parts": parts}


class MediaIndexWriter:
    """Adds media metadata to a finished `index.sqlite` (energon's `media_metadata` and `media_filters`),
    reading the parts it describes through the same connection:

        with MediaIndexWriter(path) as media:
            media.add_media(rows)
            media.add_media_filter(strategy, patterns)
            media.commit()

    Leaving the block without `commit` rolls everything back. A later row for the same entry key replaces
    the earlier one, as in energon.
    """

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = MEMORY")
        self.db.execute("PRAGMA synchronous = OFF")
        self.db.execute("BEGIN")
        self.db.execute(MEDIA_METADATA_TABLE)
        self.db.execute(MEDIA_FILTERS_TABLE)

    def named_parts_of_shard(self, tar_file_id: int) -> list[tuple[str, str, int, int]]:
        """(sample key, part name, content offset, content size) of every part of one shard, in tar order."""
        rows = self.db.execute(
            "SELECT s.sample_key, sp.part_name, sp.content_byte_offset, sp.content_byte_size FROM sample_parts sp"
            " JOIN samples s ON s.tar_file_id = sp.tar_file_id AND s.sample_index = sp.sample_index"
            " WHERE sp.tar_file_id = ? ORDER BY sp.sample_index, sp.content_byte_offset",
            (tar_file_id,),
        )
        return rows.fetchall()

    def add_media(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Insert `media_metadata` rows: (entry_key, metadata_type, metadata_json)."""
        self.db.executemany("INSERT OR REPLACE INTO media_metadata VALUES (?, ?, ?)", rows)

    def add_media_filter(self, strategy: str, patterns: str) -> None:
        """Record the media filter the metadata was made with (once per strategy and patterns)."""
        self.db.execute(
            "INSERT OR IGNORE INTO media_filters (strategy, patterns) VALUES (?, ?)", (strategy, patterns)
        )

    def commit(self) -> None:
        self.db.execute("COMMIT")

    def __enter__(self) -> MediaIndexWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")
        self.db.close()


def keep_media_tables(old: Path, new: Path) -> str | None:
    """Copy the media tables of the index at `old`, where it has them, into the new index at `new`, as
    they are (filter ids and times too): energon's prepare drops and rebuilds only `samples` and
    `sample_parts`, in place, so its index keeps them. None once done (or nothing to keep), else why
    `old` could not be read (damaged, unreadable): a full disk or a failed write is sqlite's error."""
    with closing(sqlite3.connect(new.resolve().as_uri(), uri=True, isolation_level=None)) as db:
        try:
            db.execute("ATTACH DATABASE ? AS old", (old.resolve().as_uri() + "?mode=ro",))
            tables = _table_names(db, "old")
            if "media_metadata" not in tables:
                return None
            db.execute("BEGIN")
            db.execute(MEDIA_METADATA_TABLE)
            db.execute(MEDIA_FILTERS_TABLE)
            db.execute(
                "INSERT INTO media_metadata SELECT entry_key, metadata_type, metadata_json FROM old.media_metadata"
            )
            if "media_filters" in tables:
                db.execute(
                    "INSERT INTO media_filters SELECT filter_id, strategy, patterns, created_at_utc FROM old.media_filters"
                )
                db.execute("DELETE FROM sqlite_sequence WHERE name = 'media_filters'")
                db.execute(
                    "INSERT INTO sqlite_sequence SELECT * FROM old.sqlite_sequence WHERE name = 'media_filters'"
                )
            db.execute("COMMIT")
        except sqlite3.DatabaseError as error:
            if error.sqlite_errorcode & 0xFF not in _UNREADABLE:
                raise
            return str(error)
    return None


def may_have_media_tables(path: Path) -> bool:
    """Whether the index at `path` may have media tables to keep (`keep_media_tables`): False only where
    its schema reads and names none. `path` may hold only the index's first bytes: sqlite reads its
    schema from page 1 on, so these tell, unless the schema runs past them (then True: look at all of it).
    """
    try:
        with closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as db:
            return "media_metadata" in _table_names(db, "main")
    except sqlite3.Error:
        return True


def _table_names(db: sqlite3.Connection, schema: str) -> set[str]:
    """The tables of the database attached to `db` as `schema`."""
    return {name for (name,) in db.execute(f"SELECT name FROM {schema}.sqlite_master WHERE type = 'table'")}


def media_commands(path: Path, dataset: str | Path) -> str | None:
    """The commands that describe the media of `dataset` (its folder, or a bucket dataset's address) again
    as the index at `path` records `prepare-media` described them (`describe_again`); None where it
    records no media filter, or they cannot be read (a damaged file: a hint, never an error)."""
    try:
        uri = path.resolve().as_uri() + "?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as db:
            rows = db.execute("SELECT strategy, patterns FROM media_filters ORDER BY filter_id").fetchall()
    except (sqlite3.Error, OSError):
        return None
    filters = [MediaFilter.stored(strategy, patterns) for strategy, patterns in rows]
    return describe_again(dataset, filters) if filters else None


def rerun_prepare_advice(path: Path) -> str:
    """What to do about the damaged index at `path`: prepare again, then, where it records media filters,
    describe the media again as it was described."""
    commands = media_commands(path, path.parent.parent)
    return (
        RERUN_PREPARE if commands is None else f"{RERUN_PREPARE} Then run {commands} for its media metadata."
    )


class PartLocation(NamedTuple):
    """Where one part's bytes live: shard position (`tar_file_id`), data offset and length.

    A named tuple, not a dataclass: the mount makes one per file it serves, and tuples are made faster.
    """

    tar_file_id: int
    offset: int
    size: int


class SampleRow(NamedTuple):
    """One row of the `samples` table."""

    tar_file_id: int
    key: str
    index: int
    offset: int
    size: int


#: One part of a sample with what finds it again, as the sample-parts joins give it: (sample rowid,
#: sample key, part name, part rowid, tar_file_id, content offset, content size). A plain tuple: the
#: mount reads one per file it shows.
PartRow = tuple[int, str, str, int, int, int, int]


_SAMPLE = "SELECT tar_file_id, sample_key, sample_index, byte_offset, byte_size FROM samples"
# A sample's parts with what finds them again (PartRow), in the order of the covering index, so a repeated
# part name's last row is its last member.
_SAMPLE_PARTS = (
    "SELECT s.rowid, s.sample_key, sp.part_name, sp.rowid, sp.tar_file_id, sp.content_byte_offset,"
    " sp.content_byte_size FROM samples s"
    " JOIN sample_parts sp ON sp.tar_file_id = s.tar_file_id AND sp.sample_index = s.sample_index"
    " WHERE {where}{shards} ORDER BY s.rowid, sp.part_name, sp.content_byte_offset"
)
# A part no later member of its sample has the same name as: the one energon's loader keeps, each later
# member of a name replacing the one before.
_LAST_OF_ITS_NAME = (
    " AND NOT EXISTS (SELECT 1 FROM sample_parts later WHERE later.tar_file_id = sp.tar_file_id"
    " AND later.sample_index = sp.sample_index AND later.part_name = sp.part_name"
    " AND later.content_byte_offset > sp.content_byte_offset)"
)
# The samples a reader made with `excluded` leaves out, in each connection's own temporary database.
_EXCLUDED_TABLE = (
    "CREATE TEMP TABLE excluded_samples (tar_file_id INTEGER, sample_index INTEGER,"
    " PRIMARY KEY (tar_file_id, sample_index)) WITHOUT ROWID"
)
_EXCLUDE_SAMPLE = (
    "INSERT OR IGNORE INTO temp.excluded_samples SELECT tar_file_id, sample_index FROM main.samples"
    " WHERE sample_key = ? AND tar_file_id = ?"
)
_NOT_EXCLUDED = " AND ({0}tar_file_id, {0}sample_index) NOT IN (SELECT tar_file_id, sample_index FROM temp.excluded_samples)"
_PART_FILES_PAGE = (
    "SELECT s.sample_key || '.' || sp.part_name, sp.rowid, sp.content_byte_size FROM sample_parts sp"
    " JOIN samples s ON s.tar_file_id = sp.tar_file_id AND s.sample_index = sp.sample_index"
    " WHERE sp.rowid > ?{shards}" + _LAST_OF_ITS_NAME + " ORDER BY sp.rowid LIMIT ?"
)
_SHARD_ENDS = (
    "WITH RECURSIVE shard(id) AS (SELECT 0 WHERE ?1 >= 0 UNION ALL SELECT id + 1 FROM shard WHERE id < ?1)"
    " SELECT id, (SELECT byte_offset + byte_size FROM samples WHERE tar_file_id = id"
    " ORDER BY sample_index DESC LIMIT 1) FROM shard"
)
_PART_PLACE = (
    "SELECT s.sample_key, sp.part_name, sp.tar_file_id FROM sample_parts sp"
    " JOIN samples s ON s.tar_file_id = sp.tar_file_id AND s.sample_index = sp.sample_index WHERE sp.rowid = ?"
)


class DamagedIndexError(PrepError):
    """An index sqlite fails to read (a page overwritten, the file cut short, not energon's tables): the
    file, what is wrong with it (`problem`), and what to do (`advice`; by default `rerun_prepare_advice`)."""

    def __init__(self, path: Path, problem: str, advice: str | None = None) -> None:
        if advice is None:
            advice = rerun_prepare_advice(path)
        self.path, self.problem, self.advice = path, problem, advice
        super().__init__(f"{path} {problem}. {advice}")

    def __reduce__(self) -> tuple:
        return (self.__class__, (self.path, self.problem, self.advice))

    @classmethod
    def from_sqlite(
        cls, path: Path, error: sqlite3.DatabaseError, advice: str | None = None
    ) -> DamagedIndexError:
        """sqlite's `error`, met reading the index at `path` (or a copy of it), with its reason."""
        return cls(path, f"cannot be read ({error})", advice)


#: sqlite's primary result codes for a file that is not a sound database.
_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
#: ... and for one that cannot be read at all.
_UNREADABLE = _DAMAGED | {sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM}


@contextmanager
def copied_index_errors(source: Path, advice: str | None = None) -> Iterator[None]:
    """Work on a byte-for-byte copy of the index at `source`: a damaged file met in the block is a
    DamagedIndexError naming `source`, the user's file (`advice`: what to do about it). Other errors,
    such as a full disk, pass as they are."""
    try:
        yield
    except sqlite3.DatabaseError as error:
        if error.sqlite_errorcode & 0xFF not in _DAMAGED:
            raise
        raise DamagedIndexError.from_sqlite(source, error, advice) from None


class IndexChangedError(PrepError):
    """An index that changed after it was opened: truncated or rewritten in place (`change` says how, with
    sqlite's error), or replaced by another file under its name."""

    def __init__(self, path: Path, change: str) -> None:
        self.path, self.change = path, change
        super().__init__(
            f"{path} {change}. Open the dataset anew (a mount: unmount it and mount again) once what writes"
            " the index is done."
        )

    def __reduce__(self) -> tuple:
        return (self.__class__, (self.path, self.change))


#: How an index renamed over the one a reader opened is told (sqlite opens files by name only).
REPLACED = (
    "was replaced after it was opened (another file renamed into place, as `shardprep prepare` does): a"
    " new connection would read the new file, whose row numbers name other samples and parts, so none is"
    " made; connections made before go on reading the old one"
)


def _identity(found: os.stat_result) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns) of a file: its first two say which file it is."""
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)


class IndexReader:
    """Every query of a prepared dataset's `index.sqlite`, read-only, safe to use from several threads.

    Each thread queries through its own connection, opened on first use. A reader made with `shards`
    sees only the samples (and their parts) of those `tar_file_id`s, and one made with `excluded` (keys by
    `tar_file_id`, as `PreparedDataset.excluded_samples` gives them) none of those samples, as a mount of
    one split does: each connection holds the excluded samples in a temporary table of its own.

    The file is read with read(), never memory-mapped: another process may truncate it in place (a
    mounted dataset prepared again by a tool that rewrites the index instead of replacing it), and a
    mapped page past the new end kills the reader with SIGBUS. Read, such an index is a query that fails
    with an `IndexChangedError` saying what happened (and the pages already read still answer).

    Every connection reads the file the first one opened, until `close`. sqlite opens a file only by
    name (it resolves `/proc/self/fd/N` to the name too, which after a rename is gone or another file),
    so the reader holds a descriptor of that file, which keeps its inode from being reused, and a
    connection made once the name is another file's (`shardprep prepare` renames a new index into
    place) is refused with an `IndexChangedError`: its rowids would be other samples than the rest's.
    """

    def __init__(
        self,
        path: Path,
        *,
        shards: Collection[int] | None = None,
        excluded: Mapping[int, Collection[str]] | None = None,
    ) -> None:
        self.path = path
        #: A descriptor of the file the first connection opened, held until `close`, and its identity then.
        self._held: int | None = None
        self._opened: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._excluded = [(key, int(shard)) for shard, keys in (excluded or {}).items() for key in keys]
        in_shards = "" if shards is None else ",".join(str(int(shard)) for shard in sorted(shards))
        self._view = "" if shards is None else f" AND {{0}}tar_file_id IN ({in_shards})"
        if self._excluded:
            self._view += _NOT_EXCLUDED
        self._parts_by_key = _SAMPLE_PARTS.format(where="s.sample_key = ?", shards=self._in_view("s."))
        self._parts_between = _SAMPLE_PARTS.format(
            where="s.rowid >= ? AND s.rowid < ?", shards=self._in_view("s.")
        )
        self._part_files_page = _PART_FILES_PAGE.format(shards=self._in_view("sp."))

    def _in_view(self, table: str) -> str:
        return self._view.format(table)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            with self._lock:
                self._connections.append(db)
        return db

    def _connect(self) -> sqlite3.Connection:
        if not self.path.exists():
            raise PrepError(f"{self.path} is missing. {RERUN_PREPARE}")
        unreadable = unreadable_reason(self.path)
        if unreadable is not None:  # sqlite would only say "unable to open database file"
            raise unreadable_error(self.path, unreadable)
        # immutable: no locks or change checks per query (each costs syscalls); readers see a snapshot
        uri = self.path.resolve().as_uri() + "?mode=ro&immutable=1"
        with self._lock:
            if self._held is None:
                self._held = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                self._opened = _identity(os.fstat(self._held))
        try:
            connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
            connection.execute("SELECT 1 FROM samples LIMIT 1").fetchall()
            connection.execute("SELECT 1 FROM sample_parts LIMIT 1").fetchall()
        except sqlite3.DatabaseError as error:
            raise DamagedIndexError(
                self.path,
                f"cannot be read as energon's index ({error}); it needs the tables `samples` and `sample_parts`",
            ) from None
        try:  # after sqlite has read it: the name then was this file's when sqlite opened it too
            named = _identity(os.stat(self.path))
        except OSError:
            named = (0, 0, 0, 0)
        if named[:2] != self._opened[:2]:
            connection.close()
            raise IndexChangedError(self.path, REPLACED)
        if self._excluded:
            try:
                connection.execute(_EXCLUDED_TABLE)
                connection.executemany(_EXCLUDE_SAMPLE, self._excluded)
                connection.commit()
            except sqlite3.DatabaseError as error:
                connection.close()
                raise self._read_error(error) from None
        return connection

    def _one(self, query: str, parameters: Sequence[object] = ()) -> tuple | None:
        """The first row `query` gives, or None."""
        try:
            return self._db().execute(query, parameters).fetchone()
        except sqlite3.DatabaseError as error:
            raise self._read_error(error) from None

    def _all(self, query: str, parameters: Sequence[object] = ()) -> list:
        """Every row `query` gives."""
        try:
            return self._db().execute(query, parameters).fetchall()
        except sqlite3.DatabaseError as error:
            raise self._read_error(error) from None

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, for queries read a row at a time or in several steps: one that
        fails is a PrepError (`_read_error`), as in `_one` and `_all`."""
        db = self._db()
        try:
            yield db
        except sqlite3.DatabaseError as error:
            raise self._read_error(error) from None

    def _read_error(self, error: sqlite3.DatabaseError) -> PrepError:
        """What a query that failed with `error` says: the file changed in place since it was opened,
        or it is damaged."""
        try:
            changed = self._held is not None and _identity(os.fstat(self._held)) != self._opened
        except OSError:  # closed meanwhile
            changed = False
        if changed:
            return IndexChangedError(
                self.path, f"changed while it was read (truncated or rewritten in place; sqlite: {error})"
            )
        return DamagedIndexError.from_sqlite(self.path, error)

    def excluded_places(self) -> list[tuple[int, int]]:
        """(tar_file_id, sample_index) of each sample a reader made with `excluded` leaves out: those of
        the keys it was given that the index holds in their shard."""
        if not self._excluded:
            return []
        return self._all("SELECT tar_file_id, sample_index FROM temp.excluded_samples")

    def check(self) -> None:
        """Open and close a connection, so an unreadable index is reported before any work (and before a
        fork: connections are opened where they are used)."""
        self._connect().close()

    def close(self) -> None:
        """Close every thread's connection and let go of the file: a later query opens the one named then."""
        with self._lock:
            connections, self._connections = self._connections, []
            held, self._held = self._held, None
        for db in connections:
            db.close()
        if held is not None:
            os.close(held)
        self._local = threading.local()

    # -- samples ----------------------------------------------------------------------------------------
    def sample_by_key(self, key: str) -> SampleRow | None:
        row = self._one(f"{_SAMPLE} WHERE sample_key = ?{self._in_view('')}", (key,))
        return None if row is None else SampleRow(*row)

    def sample_by_rowid(self, rowid: int) -> SampleRow | None:
        row = self._one(f"{_SAMPLE} WHERE rowid = ?{self._in_view('')}", (rowid,))
        return None if row is None else SampleRow(*row)

    def sample_place(self, key: str) -> tuple[int, int] | None:
        """(rowid, tar_file_id) of the sample called `key`, or None."""
        query = f"SELECT rowid, tar_file_id FROM samples WHERE sample_key = ?{self._in_view('')}"
        return self._one(query, (key,))

    def shard_ends(self, shards: int) -> list[int | None]:
        """Where the last sample of each of the first `shards` tar_file_ids ends in its shard (None for
        a shard without samples): how long each shard file must be at least. One index seek per shard."""
        rows = self._all(_SHARD_ENDS, (shards - 1,))
        return [end for _, end in rows]

    def sample_shard(self, rowid: int) -> int | None:
        """The tar_file_id of the sample with this rowid, or None."""
        query = f"SELECT tar_file_id FROM samples WHERE rowid = ?{self._in_view('')}"
        row = self._one(query, (rowid,))
        return None if row is None else row[0]

    def samples_of_shard(self, tar_file_id: int, after_index: int = -1) -> Iterator[SampleRow]:
        """The samples of one shard in order, starting after `after_index` (a lazily stepped cursor)."""
        with self._reading() as db:
            cursor = db.execute(
                f"{_SAMPLE} WHERE tar_file_id = ? AND sample_index > ? ORDER BY sample_index",
                (tar_file_id, after_index),
            )
            try:
                for row in cursor:
                    yield SampleRow(*row)
            finally:
                cursor.close()

    def samples_page(self, after_rowid: int, limit: int) -> list[tuple[str, int]]:
        """(key, rowid) of up to `limit` samples after `after_rowid`, in rowid order."""
        query = (
            f"SELECT sample_key, rowid FROM samples WHERE rowid > ?{self._in_view('')} ORDER BY rowid LIMIT ?"
        )
        return self._all(query, (after_rowid, limit))

    def shard_samples_page(
        self, tar_file_id: int, after_index: int, limit: int
    ) -> list[tuple[str, int, int]]:
        """(key, rowid, sample_index) of up to `limit` samples of one shard after `after_index`."""
        query = (
            "SELECT sample_key, rowid, sample_index FROM samples WHERE tar_file_id = ? AND sample_index > ?"
            f"{self._in_view('')} ORDER BY sample_index LIMIT ?"
        )
        return self._all(query, (tar_file_id, after_index, limit))

    # -- parts --------------------------------------------------------------------------------------------
    def parts_of_sample(self, tar_file_id: int, index: int) -> list[tuple[str, PartLocation]]:
        """(part name, location) of every part of one sample, in tar order."""
        rows = self._all(
            "SELECT part_name, content_byte_offset, content_byte_size FROM sample_parts"
            " WHERE tar_file_id = ? AND sample_index = ? ORDER BY content_byte_offset",
            (tar_file_id, index),
        )
        return [(name, PartLocation(tar_file_id, offset, size)) for name, offset, size in rows]

    def parts_by_key(self, key: str) -> list[PartRow]:
        """Every part of the sample called `key` (none if there is no such sample), by name."""
        return self._part_rows(self._parts_by_key, (key,))

    def parts_between(self, first_rowid: int, stop_rowid: int) -> list[PartRow]:
        """Every part of the samples with rowids `first_rowid` to `stop_rowid` (exclusive), sample by
        sample and by name within a sample."""
        return self._part_rows(self._parts_between, (first_rowid, stop_rowid))

    def _part_rows(self, query: str, parameters: tuple) -> list[PartRow]:
        return self._all(query, parameters)

    def part_location(self, part_rowid: int) -> PartLocation | None:
        query = "SELECT tar_file_id, content_byte_offset, content_byte_size FROM sample_parts WHERE rowid = ?"
        row = self._one(query, (part_rowid,))
        return None if row is None else PartLocation(*row)

    def part_place(self, part_rowid: int) -> tuple[str, str, int] | None:
        """(sample key, part name, tar_file_id) of the part with this rowid, or None."""
        return self._one(_PART_PLACE, (part_rowid,))

    def part_files_page(self, after_rowid: int, limit: int) -> list[tuple[str, int, int]]:
        """(`KEY.PART`, part rowid, size) of up to `limit` parts after `after_rowid`, in rowid order; of
        a part name a sample holds more than once, only its last member (the one energon loads)."""
        return self._all(self._part_files_page, (after_rowid, limit))

    def parts_named(self, part_name: str) -> Iterator[tuple[str, PartLocation]]:
        """(sample key, location) of every part called `part_name`, shard by shard in tar order."""
        with self._reading() as db:
            cursor = db.execute(
                "SELECT s.sample_key, sp.tar_file_id, sp.content_byte_offset, sp.content_byte_size"
                " FROM sample_parts sp"
                " JOIN samples s ON s.tar_file_id = sp.tar_file_id AND s.sample_index = sp.sample_index"
                f" WHERE sp.part_name = ?{self._in_view('sp.')} ORDER BY sp.tar_file_id, sp.content_byte_offset",
                (part_name,),
            )
            try:
                for key, tar_file_id, offset, size in cursor:
                    yield key, PartLocation(tar_file_id, offset, size)
            finally:
                cursor.close()

    def entry_names(self) -> set[str]:
        """Every part's name as energon looks an auxiliary dataset's file up: `KEY.PART`."""
        query = (
            "SELECT s.sample_key || '.' || sp.part_name FROM sample_parts sp"
            " JOIN samples s ON s.tar_file_id = sp.tar_file_id AND s.sample_index = sp.sample_index"
            f" WHERE 1{self._in_view('sp.')}"
        )
        return {name for (name,) in self._all(query)}

    def part_usage(self) -> tuple[int, int]:
        """(total bytes, count) of the parts `part_files_page` lists."""
        query = "SELECT COALESCE(SUM(sp.content_byte_size), 0), COUNT(*) FROM sample_parts sp WHERE 1"
        total, count = self._one(query + self._in_view("sp.") + _LAST_OF_ITS_NAME)
        return int(total), int(count)

    # -- whole columns ------------------------------------------------------------------------------------
    def columns(
        self, table: str, integers: dict[str, str], text: str | None = None, *, null_is_error: bool = False
    ) -> tuple[dict[str, np.ndarray], TextColumn | None]:
        """Every row of `table` in storage (rowid) order: integer columns as int64 arrays (NULL reads as
        0, or empty text, or with `null_is_error` is a NullRowsError counting such rows and placing the
        first), named as `integers` maps names to columns, and the `text` column if one is named.

        sqlite joins each column of a million rows at a time into one string, which numpy parses: far
        cheaper than a Python tuple per row. Raises PrepError when a column holds something else than
        its type, or the file cannot be read (`_read_error`).
        """
        import numpy as np

        from prep.index.columns import TEXT_SEPARATOR, TextColumn, parse_integers

        names = [*integers.values(), *([text] if text else [])]
        aggregates = ", ".join(
            [f"group_concat(ifnull({name}, 0))" for name in integers.values()]
            + ([f"group_concat(ifnull({text}, ''), char(0))"] if text else [])
            + ([f"total({name} IS NULL)" for name in names] if null_is_error else [])
        )
        with self._reading() as db:
            chunks = []
            try:  # rowid order is storage order, the cheapest to scan; chunks keep each string small
                query = (
                    f"SELECT count(*), max(row), {aggregates} FROM (SELECT rowid AS row, {', '.join(names)}"
                    f" FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT {COLUMN_CHUNK_ROWS})"
                )
                last = None
                while not chunks or chunks[-1][0] == COLUMN_CHUNK_ROWS:
                    count, last, *values = db.execute(
                        query, (-(1 << 63) if last is None else last,)
                    ).fetchone()
                    chunks.append((count, *values))
            except sqlite3.OperationalError:  # a table without rowid: one query for all of it
                chunks = [db.execute(f"SELECT count(*), {aggregates} FROM {table}").fetchone()]
            chunks = [chunk for chunk in chunks if chunk[0]]
            if null_is_error:
                nulls = [sum(int(chunk[-len(names) + i]) for chunk in chunks) for i in range(len(names))]
                chunks = [chunk[: -len(names)] for chunk in chunks]
                for column, count in zip(names, nulls, strict=True):
                    if count:
                        first = db.execute(
                            f"SELECT tar_file_id, sample_index FROM {table} WHERE {column} IS NULL LIMIT 1"
                        ).fetchone()
                        raise NullRowsError(table, column, count, tuple(first))
        columns = {
            name: np.concatenate(
                [np.zeros(0, np.int64)] + [parse_integers(chunk[1 + i], chunk[0], column) for chunk in chunks]
            )
            for i, (name, column) in enumerate(integers.items())
        }
        if not text:
            return columns, None
        joined = TEXT_SEPARATOR.join(chunk[-1] for chunk in chunks)
        return columns, TextColumn.from_joined(joined, sum(chunk[0] for chunk in chunks))
