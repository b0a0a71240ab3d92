"""The folder trees a mounted dataset shows, answered from sqlite one node at a time.

Three views of the same parts:

- `flat`: every part in the root as `/KEY.PART` (energon's default mount);
- `sample`: a folder per sample, `/KEY/PART` (energon's `mount -s`);
- `shard`: a folder per shard holding sample folders, `/SHARD.tar/KEY/PART`.

The kernel names files by node id, so every node's id says what it is: the low two bits are its
kind (folder, sample folder, part file) and the rest is a number that finds it again — a folder's
position in the small table of shard folders, a sample's or a part's sqlite `rowid`. Nothing here
builds a table of all files: a lookup is one indexed query, a listing is a page of rows after a
cookie, so memory does not grow with the dataset. Names are made safe before they are shown: a key
may hold `/` and could spell `..`, so every name is one path component in which `%`, `/` and NUL are
percent-escaped, and `.`, `..` and the empty name are escaped whole. This module does not touch FUSE.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from dataclasses import dataclass
from enum import StrEnum
from itertools import groupby
from operator import itemgetter
from typing import NamedTuple

from prep.dataset_reader import PartLocation, PreparedDataset
from prep.errors import PrepError
from prep.index_format import split_member_name

#: Cookies 1 and 2 are `.` and `..`; a listing's own entries start at this cookie.
FIRST_COOKIE = 3
FOLDER, SAMPLE, PART = 1, 2, 3  # node kinds; the listing queries below compute node ids in SQL
ROOT = (0 << 2) | FOLDER  # the kernel's root node id is 1
#: Part locations remembered between the lookup of a name and the reads of its file.
LOCATION_CACHE_SIZE = 8192
#: Samples visited in index order (sample folders listed one after another, as `ls -R` and `find` do;
#: flat files opened in tar order, as `cp -r` does) have their parts read this many samples at a time.
SAMPLES_AHEAD = 128
INDEX_MAP_BYTES = 64 << 20

_ESCAPE = {"%": "%25", "/": "%2F", "\0": "%00"}
_UNESCAPE_RE = re.compile(r"%(25|2F|00|2E)")
_UNESCAPE = {"25": "%", "2F": "/", "00": "\0", "2E": "."}

# A sample's part files with what finds them again: (sample rowid, key, part name, part rowid, shard,
# offset, size), in the order of the covering index, so a repeated part name's first row is its first member.
_NAMED_PARTS = (
    "SELECT s.rowid, s.sample_key, sp.part_name, sp.rowid, sp.tar_file_id, sp.content_byte_offset,"
    " sp.content_byte_size FROM samples s"
    " JOIN sample_parts sp ON sp.tar_file_id = s.tar_file_id AND sp.sample_index = s.sample_index"
    " WHERE {where} ORDER BY s.rowid, sp.part_name, sp.content_byte_offset"
)
_PARTS_OF_SAMPLE = _NAMED_PARTS.format(where="s.rowid = ?")
_PARTS_OF_SAMPLES = (
    f"SELECT s.rowid, sp.part_name, (sp.rowid << 2) | {PART}, sp.content_byte_size FROM samples s"
    " JOIN sample_parts sp ON sp.tar_file_id = s.tar_file_id AND sp.sample_index = s.sample_index"
    " WHERE s.rowid >= ? AND s.rowid < ? ORDER BY s.rowid, sp.content_byte_offset"
)
_ALL_PARTS = (
    f"SELECT s.sample_key || '.' || sp.part_name, (sp.rowid << 2) | {PART}, sp.content_byte_size,"
    f" sp.rowid + {FIRST_COOKIE} FROM sample_parts sp"
    " JOIN samples s ON s.tar_file_id = sp.tar_file_id AND s.sample_index = sp.sample_index"
    " WHERE sp.rowid > ?{filter} ORDER BY sp.rowid LIMIT ?"
)
_ALL_SAMPLES = (
    f"SELECT sample_key, (rowid << 2) | {SAMPLE}, rowid + {FIRST_COOKIE} FROM samples"
    " WHERE rowid > ?{filter} ORDER BY rowid LIMIT ?"
)
_SAMPLES_OF_SHARD = (
    f"SELECT sample_key, (rowid << 2) | {SAMPLE}, sample_index + {FIRST_COOKIE} FROM samples"
    " WHERE tar_file_id = ? AND sample_index > ? ORDER BY sample_index LIMIT ?"
)
_PART_LOCATION = (
    "SELECT tar_file_id, content_byte_offset, content_byte_size FROM sample_parts WHERE rowid = ?"
)


class View(StrEnum):
    FLAT = "flat"
    SAMPLE = "sample"
    SHARD = "shard"


def escape_name(name: str) -> str:
    """One safe path component for any key, part or shard-folder name; `unescape_name` inverts it.

    >>> escape_name("../etc/passwd"), escape_name(".."), escape_name(""), escape_name("a%b")
    ('..%2Fetc%2Fpasswd', '%2E%2E', '%', 'a%25b')
    """
    if name == "":
        return "%"
    if name in (".", ".."):
        return "%2E" * len(name)
    if "%" not in name and "/" not in name and "\0" not in name:
        return name
    return "".join(_ESCAPE.get(char, char) for char in name)


def unescape_name(name: str) -> str:
    """The original name behind a shown name.

    >>> unescape_name("..%2Fetc%2Fpasswd"), unescape_name("%2E%2E"), unescape_name("%")
    ('../etc/passwd', '..', '')
    """
    if name == "%":
        return ""
    if "%" not in name:
        return name
    return _UNESCAPE_RE.sub(lambda match: _UNESCAPE[match.group(1)], name)


def node_id(kind: int, number: int) -> int:
    """The node id of the `number`-th node of a kind (FOLDER, SAMPLE or PART).

    >>> node_id(FOLDER, 0) == ROOT, node_id(PART, 5)
    (True, 23)
    """
    return (number << 2) | kind


class Node(NamedTuple):
    """What a name leads to: a folder, or a part file of `size` bytes (a tuple: one is made per lookup)."""

    id: int
    is_dir: bool
    size: int = 0


@dataclass(frozen=True, slots=True)
class Listing:
    """A page of one folder's entries, all folders or all files (no view mixes them in one folder).

    Each entry is `(shown name, node id, size, cookie)`, the cookie being where a listing resumes after
    it; plain tuples, since a big folder lists hundreds of thousands of them.
    """

    is_dir: bool
    entries: list[tuple[str, int, int, int]]


def _page(entries: list[tuple[str, int, int]], start: int, limit: int) -> list[tuple[str, int, int, int]]:
    """Up to `limit` of a folder's `(name, node, size)` entries held in memory, after position `start`
    (-1: from the first), each with its cookie.

    >>> _page([("a", 5, 0), ("b", 9, 0), ("c", 13, 0)], 0, 5)
    [('b', 9, 0, 4), ('c', 13, 0, 5)]
    """
    first = start + 1
    return [(name, node, size, position + FIRST_COOKIE)
            for position, (name, node, size) in enumerate(entries[first : first + limit], first)]  # fmt: skip


class MountTree:
    """Resolves names and lists folders of one view of a prepared dataset, optionally one split only.

    Safe to use from several threads: each thread queries through its own read-only connection.
    """

    def __init__(self, dataset: PreparedDataset, view: View = View.FLAT, split: str | None = None) -> None:
        self.dataset = dataset
        self.view = View(view)
        self.flat = self.view is View.FLAT
        self.split = split
        shard_names = dataset.split_shards(split)
        self.allowed: frozenset[int] | None = None
        sample_filter = ""
        if split is not None:
            self.allowed = frozenset(dataset.tar_file_id(name) for name in shard_names)
            sample_filter = " AND {}tar_file_id IN (" + ",".join(map(str, sorted(self.allowed))) + ")"
        self._parts_of_key = _NAMED_PARTS.format(where="s.sample_key = ?" + sample_filter.format("s."))
        self._parts_of_keys_ahead = _NAMED_PARTS.format(
            where="s.rowid >= ? AND s.rowid < ?" + sample_filter.format("s.")
        )
        self._part_filter = sample_filter.format("sp.")
        self._all_parts = _ALL_PARTS.format(filter=self._part_filter)
        self._all_samples = _ALL_SAMPLES.format(filter=sample_filter.format(""))
        # The shard view's folders (shards number thousands, not millions): children by shown name, and
        # for a shard's own folder the shard's tar_file_id. Folder 0 is the root.
        self._folders: list[dict[str, int]] = [{}]
        self._folder_shard: list[int | None] = [None]
        if self.view is View.SHARD:
            for name in shard_names:
                self._add_shard_folder(name, dataset.tar_file_id(name))
        self._local = threading.local()
        # Plain dicts: single get/set calls are atomic, and a full cache is simply started afresh.
        self._locations: dict[int, PartLocation] = {}
        # A sample's part files by part name, under its key (flat view) or rowid (a sample folder): a
        # sample's parts are usually read together, and one query for all costs little more than one.
        self._named_parts: dict[str | int, dict[str, Node]] = {}
        # Flat lookups that go through the samples in index order (as `cp -r` or a reader of whole shards
        # does) read the parts of the next SAMPLES_AHEAD samples in one query: the sample rowid that,
        # looked up next, starts that.
        self._keys_ahead_from = -1
        # Sample rowid -> its parts (shown name, node id, size), and where a sequential scan would go on.
        self._sample_parts: dict[int, list[tuple[str, int, int]]] = {}
        self._ahead_from = -1
        self._connections_lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []

    def _add_shard_folder(self, shard: str, tar_file_id: int) -> None:
        folder = 0
        components = [escape_name(component) for component in shard.split("/")]
        for depth, component in enumerate(components):
            child = self._folders[folder].get(component)
            if child is None:
                child = node_id(FOLDER, len(self._folders))
                self._folders[folder][component] = child
                self._folders.append({})
                self._folder_shard.append(tar_file_id if depth == len(components) - 1 else None)
            folder = child >> 2

    # -- sqlite and the location cache ---------------------------------------------------------------
    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self.dataset.connect()
            # Lookups read the index's B-trees through a mapping, not a read() per page: about half the
            # time per query. The mapping is bounded, so memory still does not grow with the dataset.
            db.execute(f"PRAGMA mmap_size={INDEX_MAP_BYTES}")
            with self._connections_lock:
                self._connections.append(db)
        return db

    def _remember(self, part_rowid: int, location: PartLocation) -> None:
        if len(self._locations) >= LOCATION_CACHE_SIZE:
            self._locations = {}
        self._locations[part_rowid] = location

    def location(self, node: int) -> PartLocation | None:
        """Where a part file's bytes are, or None if `node` is not a part."""
        if node & 3 != PART:
            return None
        rowid = node >> 2
        location = self._locations.get(rowid)
        if location is None:
            row = self._db().execute(_PART_LOCATION, (rowid,)).fetchone()
            if row is None:
                return None
            location = PartLocation(*row)
            self._remember(rowid, location)
        return location

    def _sample_allowed(self, tar_file_id: int) -> bool:
        return self.allowed is None or tar_file_id in self.allowed

    # -- lookups -------------------------------------------------------------------------------------
    def lookup(self, parent: int, name: str) -> Node | None:
        """The node called `name` in folder `parent`, or None if there is none."""
        if parent == ROOT and self.flat:  # the hot path: a file of the flat view
            member = split_member_name(unescape_name(name))
            if member is None:
                return None
            key, part = member
            parts = self._named_parts.get(key)
            return (self._parts_of_key_read(key) if parts is None else parts).get(part)
        kind, number = parent & 3, parent >> 2
        if kind == SAMPLE:
            parts = self._named_parts.get(number)
            return (self._parts_of_sample_read(number) if parts is None else parts).get(unescape_name(name))
        if kind != FOLDER or number >= len(self._folders):
            return None
        if number == 0 and self.view is View.SAMPLE:
            return self._sample_node(unescape_name(name), None)
        shard = self._folder_shard[number]
        if shard is not None:
            return self._sample_node(unescape_name(name), shard)
        child = self._folders[number].get(name)
        return None if child is None else Node(child, True)

    def _parts_of_key_read(self, key: str) -> dict[str, Node]:
        """The part files of the sample called `key` by part name (none if it is not in the view), read
        with those of the next SAMPLES_AHEAD samples when lookups go through the samples in order."""
        db = self._db()
        rows = db.execute(self._parts_of_key, (key,)).fetchall()
        self._make_room()
        if rows and rows[0][0] == self._keys_ahead_from:
            self._keys_ahead_from = rows[0][0] + 1 + SAMPLES_AHEAD
            rows += db.execute(self._parts_of_keys_ahead, (rows[0][0] + 1, self._keys_ahead_from))
        elif rows:
            self._keys_ahead_from = rows[0][0] + 1
        self._named_parts[key] = {}
        self._keep(rows, by_key=True)
        return self._named_parts[key]

    def _parts_of_sample_read(self, sample: int) -> dict[str, Node]:
        """The part files of a sample folder (a sample already in the view) by part name."""
        rows = self._db().execute(_PARTS_OF_SAMPLE, (sample,)).fetchall()
        self._make_room()
        self._named_parts[sample] = {}
        self._keep(rows, by_key=False)
        return self._named_parts[sample]

    def _make_room(self) -> None:
        """Start the lookup caches afresh when a read-ahead might not fit, rather than half-way through."""
        if len(self._named_parts) > LOCATION_CACHE_SIZE - 2 * SAMPLES_AHEAD:
            self._named_parts = {}
        if len(self._locations) > LOCATION_CACHE_SIZE - 8 * SAMPLES_AHEAD:
            self._locations = {}

    def _keep(self, rows: list[tuple], by_key: bool) -> None:
        """Remember the part files of the samples in `rows` (as `_NAMED_PARTS` gives them) under each
        sample's key or rowid, and where each part is."""
        for (sample, key), group in groupby(rows, key=itemgetter(0, 1)):
            parts: dict[str, Node] = {}
            for _, _, part, rowid, tar_file_id, offset, size in group:
                if part not in parts:
                    self._remember(rowid, PartLocation(tar_file_id, offset, size))
                    parts[part] = Node(node_id(PART, rowid), False, size)
            self._named_parts[key if by_key else sample] = parts

    def _sample_node(self, key: str, tar_file_id: int | None) -> Node | None:
        row = (
            self._db()
            .execute("SELECT rowid, tar_file_id FROM samples WHERE sample_key = ?", (key,))
            .fetchone()
        )
        if row is None or not self._sample_allowed(row[1]):
            return None
        if tar_file_id is not None and row[1] != tar_file_id:
            return None
        return Node(node_id(SAMPLE, row[0]), True)

    def node(self, node: int) -> Node | None:
        """The node behind an id the kernel holds (for its attributes), or None if there is none."""
        kind, number = node & 3, node >> 2
        if kind == FOLDER:
            return Node(node, True) if number < len(self._folders) else None
        if kind == SAMPLE:
            row = self._db().execute("SELECT tar_file_id FROM samples WHERE rowid = ?", (number,)).fetchone()
            return Node(node, True) if row is not None and self._sample_allowed(row[0]) else None
        location = self.location(node)
        return None if location is None else Node(node, False, location.size)

    # -- listings ------------------------------------------------------------------------------------
    def list_dir(self, folder: int, after: int = 0, limit: int = 1024) -> Listing:
        """Up to `limit` entries of a folder after cookie `after` (0: from the start; `.` and `..` excluded).

        Raises NotADirectoryError for a part file and FileNotFoundError for an id that is no folder.
        """
        kind, number = folder & 3, folder >> 2
        start = max(after - FIRST_COOKIE, -1)
        db = self._db
        if kind == PART:
            raise NotADirectoryError(folder)
        if kind == SAMPLE:
            return Listing(False, _page(self._parts_of_sample(number), start, limit))
        if number >= len(self._folders):
            raise FileNotFoundError(folder)
        if number == 0 and self.view is View.FLAT:
            rows = db().execute(self._all_parts, (max(start, 0), limit)).fetchall()
            return Listing(
                False, [(escape_name(name), node, size, cookie) for name, node, size, cookie in rows]
            )
        if number == 0 and self.view is View.SAMPLE:
            rows = db().execute(self._all_samples, (max(start, 0), limit)).fetchall()
            return Listing(True, [(escape_name(key), node, 0, cookie) for key, node, cookie in rows])
        shard = self._folder_shard[number]
        if shard is not None:
            rows = db().execute(_SAMPLES_OF_SHARD, (shard, start, limit)).fetchall()
            return Listing(True, [(escape_name(key), node, 0, cookie) for key, node, cookie in rows])
        children = [(name, child, 0) for name, child in self._folders[number].items()]
        return Listing(True, _page(children, start, limit))

    def _parts_of_sample(self, number: int) -> list[tuple[str, int, int]]:
        """A sample folder's entries. Reading folders in rowid order reads ahead, so a scan of every
        sample folder costs one query per SAMPLES_AHEAD folders; the cache is bounded."""
        parts = self._sample_parts.get(number)
        if parts is not None:
            return parts
        end = number + (SAMPLES_AHEAD if number == self._ahead_from else 1)
        if len(self._sample_parts) >= LOCATION_CACHE_SIZE:
            self._sample_parts = {}
        found: dict[int, list[tuple[str, int, int]]] = {rowid: [] for rowid in range(number, end)}
        for rowid, name, node, size in self._db().execute(_PARTS_OF_SAMPLES, (number, end)):
            found[rowid].append((escape_name(name), node, size))
        self._sample_parts.update(found)
        self._ahead_from = end
        return found[number]

    def usage(self) -> tuple[int, int]:
        """(bytes, files) of the parts this tree shows, for `df`."""
        query = "SELECT COALESCE(SUM(sp.content_byte_size), 0), COUNT(*) FROM sample_parts sp WHERE 1{filter}"
        total_bytes, parts = self._db().execute(query.format(filter=self._part_filter)).fetchone()
        return int(total_bytes), int(parts)

    # -- bytes ---------------------------------------------------------------------------------------
    def read(self, node: int, offset: int, size: int) -> bytes:
        """Bytes `offset .. offset+size` of a part file (fewer at its end); FileNotFoundError if no part."""
        location = self.location(node)
        if location is None:
            raise FileNotFoundError(node)
        return self.dataset.read_part(location, offset, size)

    def read_cached(self, node: int, offset: int, into: memoryview) -> memoryview:
        """`read` into `into` from the page cache only (the filled front of it); BlockingIOError if the
        disk would be needed."""
        location = self.location(node)
        if location is None:
            raise FileNotFoundError(node)
        return self.dataset.read_part_cached(location, offset, into)

    def close(self) -> None:
        """Close every thread's connection and the dataset's shard files."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for db in connections:
            db.close()
        self.dataset.close()


def parse_view(value: str) -> View:
    """The view named on the command line."""
    try:
        return View(value)
    except ValueError:
        raise PrepError(f"--view must be one of flat, sample, shard (got {value!r}).") from None
