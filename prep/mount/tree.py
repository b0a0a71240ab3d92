"""The folder trees a mounted dataset shows, answered from the index one node at a time.

Three views of the same parts:

- `flat`: every part in the root as `/KEY.PART` (energon's default mount);
- `sample`: a folder per sample, `/KEY/PART` (energon's `mount -s`);
- `shard`: a folder per shard holding sample folders, `/SHARD.tar/KEY/PART`.

The kernel names files by node id, so every node's id says what it is: the low two bits are its
kind (folder, sample folder, part file) and the rest is a number that finds it again — a folder's
position in the small table of shard folders, a sample's or a part's sqlite `rowid`. Nothing here
builds a table of all files: a lookup is one indexed query (`IndexReader`), a listing is a page of rows
after a cookie, so memory does not grow with the dataset. Names are made safe before they are shown: a
key may hold `/` and could spell `..`, so every name is one path component in which `%`, `/` and NUL
are percent-escaped, and `.`, `..` and the empty name are escaped whole. This module does not touch FUSE.

What has been read is remembered in one bounded cache of samples by rowid (`_SampleCache`): a sample's
parts are read together (a sample's files are usually opened together, and one query for all of them
costs little more than one), and when samples are visited in rowid order (`ls -R`, `find`, `cp -r`, a
reader of whole shards) the next SAMPLES_AHEAD samples come in the same query.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import groupby, islice
from operator import itemgetter

from prep.errors import MAX_REPORTED_ERRORS
from prep.index.dataset import PreparedDataset, ShardChangedError
from prep.index.group import key_and_part
from prep.index.sqlite import IndexReader, PartLocation, PartRow
from prep.mount.messages import STDERR, Messages
from prep.mount.nodes import FIRST_COOKIE, AlreadyToldError, Listing, Node

FOLDER, SAMPLE, PART = 1, 2, 3  # node kinds, the low two bits of a node id
#: Samples the cache holds before it starts afresh.
CACHED_SAMPLES = 8192
#: Samples visited in rowid order have their parts read this many samples at a time.
SAMPLES_AHEAD = 128

_ESCAPE = {"%": "%25", "/": "%2F", "\0": "%00"}
_UNESCAPE_RE = re.compile(r"%(25|2F|00|2E)")
_UNESCAPE = {"25": "%", "2F": "/", "00": "\0", "2E": "."}


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

    >>> from prep.mount.nodes import ROOT_ID
    >>> node_id(FOLDER, 0) == ROOT_ID, node_id(PART, 5)
    (True, 23)
    """
    return (number << 2) | kind


ROOT = node_id(FOLDER, 0)  # the kernel's root, nodes.ROOT_ID


def _page(entries: Sequence[tuple[str, int, int]], start: int, limit: int) -> list[tuple[str, int, int, int]]:
    """Up to `limit` of a folder's `(name, node, size)` entries held in memory, after position `start`
    (-1: from the first), each with its cookie.

    >>> _page([("a", 5, 0), ("b", 9, 0), ("c", 13, 0)], 0, 5)
    [('b', 9, 0, 4), ('c', 13, 0, 5)]
    """
    first = start + 1
    return [(name, node, size, position + FIRST_COOKIE)
            for position, (name, node, size) in enumerate(entries[first : first + limit], first)]  # fmt: skip


#: A sample's parts as a folder view keeps them: its part files by name (each name's last member; None
#: until a lookup needs them) and its rows (`PartRow`s, by part name), for its listing. Plain tuples and
#: dicts of plain values: the garbage collector soon stops visiting them.
_Parts = tuple[dict[str, Node] | None, tuple[PartRow, ...]]


@dataclass
class _SampleCache:
    """The samples read so far, kept the way the view asks for them, and where each of their parts is
    (reads name a part's node). The flat view opens every file by name, so it keeps each sample's files
    by name under its key; a folder view keeps each sample under its rowid (its folder's node), with the
    rows its listing is made of. Bounded: it is replaced whole when full, so a read-ahead is never half
    forgotten."""

    flat: bool
    by_key: dict[str, dict[str, Node]] = field(default_factory=dict)
    samples: dict[int, _Parts] = field(default_factory=dict)
    locations: dict[int, PartLocation] = field(default_factory=dict)
    listings: dict[int, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)

    def has_room(self, samples: int) -> bool:
        return len(self.by_key) + len(self.samples) + samples <= CACHED_SAMPLES

    def keep(self, rows: list[PartRow]) -> None:
        """Remember the samples whose parts `rows` are (whole samples, by sample then part name)."""
        for (rowid, key), sample_rows in groupby(rows, key=itemgetter(0, 1)):
            if self.flat:
                self.by_key[key] = self._name_files(sample_rows)
            else:
                self.samples[rowid] = (None, tuple(sample_rows))

    def _name_files(self, rows: Iterable[PartRow]) -> dict[str, Node]:
        """A sample's part files by name, remembering where each part is."""
        by_name: dict[str, Node] = {}
        locations = self.locations
        for _, _, part, part_rowid, tar_file_id, offset, size in rows:
            # Rows by name then offset: a repeated name's last member stays, as energon's loader keeps it.
            by_name[part] = Node(node_id(PART, part_rowid), False, size)
            locations[part_rowid] = PartLocation(tar_file_id, offset, size)
        return by_name

    def files(self, rowid: int) -> dict[str, Node]:
        """A kept sample folder's part files by name."""
        by_name, rows = self.samples[rowid]
        if by_name is None:
            by_name = self._name_files(rows)
            self.samples[rowid] = (by_name, rows)
        return by_name

    def listing(self, rowid: int) -> tuple[tuple[str, int, int], ...]:
        """A kept sample folder's parts as it shows them, `(shown name, node id, size)`, in tar order: a
        name once, as its last member (the file a lookup of it finds)."""
        files = self.listings.get(rowid)
        if files is None:
            in_tar_order = sorted(self.samples[rowid][1], key=itemgetter(5))  # by content offset
            last = {part: (part_rowid, size) for _, _, part, part_rowid, _, _, size in in_tar_order}
            files = tuple(
                (escape_name(part), node_id(PART, part_rowid), size)
                for _, _, part, part_rowid, _, _, size in in_tar_order
                if last[part][0] == part_rowid
            )
            self.listings[rowid] = files
        return files


class MountTree:
    """Resolves names and lists folders of one view of a prepared dataset, optionally one split only
    (its shards, less the samples the split file's `exclude` names one by one).

    Safe to use from several threads: each thread queries through its own read-only connection, and the
    cache is only ever added to or replaced whole.
    """

    def __init__(
        self,
        dataset: PreparedDataset,
        view: View = View.FLAT,
        split: str | None = None,
        messages: Messages = STDERR,
    ) -> None:
        self.dataset = dataset
        self.messages = messages
        self.view = View(view)
        self.flat = self.view is View.FLAT
        self.split = split
        shard_names = dataset.split_shards(split)
        # The files the index describes: a changed one is EIO. Those changed already are said now.
        changed = dataset.expect_unchanged(shard_names)
        dataset.index.close()  # a connection must not be carried into a forked server
        #: Shards found changed and said so in `messages` (each once).
        self._changed_shards: set[str] = set(changed)
        #: What was said at the start of the mount about shards changed before it; None if nothing.
        self.warning = None if not changed else _changed_before(dataset, changed)
        if self.warning is not None:
            messages.say(self.warning)
        self.allowed: frozenset[int] | None = None
        excluded = None
        if split is not None:  # the samples energon's loader gives for the split, and no others
            self.allowed = frozenset(dataset.tar_file_id(name) for name in shard_names)
            excluded = dataset.excluded_samples()
        self.index = IndexReader(dataset.sqlite_path, shards=self.allowed, excluded=excluded)
        # The shard view's folders (shards number thousands, not millions): children by shown name, and
        # for a shard's own folder the shard's tar_file_id. Folder 0 is the root.
        self._folders: list[dict[str, int]] = [{}]
        self._folder_shard: list[int | None] = [None]
        if self.view is View.SHARD:
            for name in shard_names:
                self._add_shard_folder(name, dataset.tar_file_id(name))
        self._cache = _SampleCache(self.flat)
        #: The read-ahead cursor: the rowid after the last sample read. Reading that one next (samples
        #: visited in order) reads SAMPLES_AHEAD samples in one query.
        self._next_rowid = -1

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

    # -- the cache -----------------------------------------------------------------------------------
    def _remember(self, rows: list[PartRow]) -> _SampleCache:
        """Keep the samples of `rows` in the cache (a fresh one if they might not fit)."""
        cache = self._cache
        if not cache.has_room(SAMPLES_AHEAD + 1):
            cache = self._cache = _SampleCache(self.flat)
        cache.keep(rows)
        return cache

    def _sample(self, rowid: int) -> _SampleCache | None:
        """The cache holding a sample folder's parts (the sample is in the view), reading them first if
        needed; None if the sample has none."""
        cache = self._cache
        if rowid not in cache.samples:
            stop = rowid + (SAMPLES_AHEAD if rowid == self._next_rowid else 1)
            cache = self._remember(self.index.parts_between(rowid, stop))
            self._next_rowid = stop
        return cache if rowid in cache.samples else None

    def _sample_by_key(self, key: str) -> dict[str, Node] | None:
        """The part files by name of the sample called `key`, if it is in the view, read from the index
        (flat view lookups that the cache cannot answer)."""
        rows = self.index.parts_by_key(key)
        if not rows:
            return None
        rowid = rows[0][0]
        stop = rowid + 1
        if rowid == self._next_rowid:
            stop += SAMPLES_AHEAD
            rows += self.index.parts_between(rowid + 1, stop)
        self._next_rowid = stop
        return self._remember(rows).by_key.get(key)

    def location(self, node: int) -> PartLocation | None:
        """Where a part file's bytes are, or None if `node` is not a part."""
        if node & 3 != PART:
            return None
        rowid = node >> 2
        location = self._cache.locations.get(rowid)
        return location if location is not None else self.index.part_location(rowid)

    # -- lookups -------------------------------------------------------------------------------------
    def lookup(self, parent: int, name: str) -> Node | None:
        """The node called `name` in folder `parent`, or None if there is none."""
        if parent == ROOT and self.flat:  # the hot path: a file of the flat view
            member = key_and_part(unescape_name(name))
            if member is None:
                return None
            files = self._cache.by_key.get(member[0]) or self._sample_by_key(member[0])
            return None if files is None else files.get(member[1])
        kind, number = parent & 3, parent >> 2
        if kind == SAMPLE:
            cache = self._sample(number)
            return None if cache is None else cache.files(number).get(unescape_name(name))
        if kind != FOLDER or number >= len(self._folders):
            return None
        if number == 0 and self.view is View.SAMPLE:
            return self._sample_node(unescape_name(name), None)
        shard = self._folder_shard[number]
        if shard is not None:
            return self._sample_node(unescape_name(name), shard)
        child = self._folders[number].get(name)
        return None if child is None else Node(child, True)

    def _sample_node(self, key: str, tar_file_id: int | None) -> Node | None:
        """The folder of the sample called `key` (in shard `tar_file_id`, if given), if it is in the view."""
        place = self.index.sample_place(key)
        if place is None or (tar_file_id is not None and place[1] != tar_file_id):
            return None
        return Node(node_id(SAMPLE, place[0]), True)

    def node(self, node: int) -> Node | None:
        """The node behind an id the kernel holds (for its attributes), or None if there is none."""
        kind, number = node & 3, node >> 2
        if kind == FOLDER:
            return Node(node, True) if number < len(self._folders) else None
        if kind == SAMPLE:
            in_view = number in self._cache.samples or self.index.sample_shard(number) is not None
            return Node(node, True) if in_view else None
        location = self.location(node)
        return None if location is None else Node(node, False, location.size)

    # -- listings ------------------------------------------------------------------------------------
    def list_dir(self, folder: int, after: int = 0, limit: int = 1024) -> Listing:
        """Up to `limit` entries of a folder after cookie `after` (0: from the start; `.` and `..` excluded).

        Raises NotADirectoryError for a part file and FileNotFoundError for an id that is no folder.
        """
        kind, number = folder & 3, folder >> 2
        start = max(after - FIRST_COOKIE, -1)
        if kind == PART:
            raise NotADirectoryError(folder)
        if kind == SAMPLE:
            cache = self._sample(number)
            return Listing(False, [] if cache is None else _page(cache.listing(number), start, limit))
        if number >= len(self._folders):
            raise FileNotFoundError(folder)
        if number == 0 and self.view is View.FLAT:
            rows = self.index.part_files_page(max(start, 0), limit)
            return Listing(False, [(escape_name(name), (rowid << 2) | PART, size, rowid + FIRST_COOKIE)
                                   for name, rowid, size in rows])  # fmt: skip
        if number == 0 and self.view is View.SAMPLE:
            rows = self.index.samples_page(max(start, 0), limit)
            return Listing(True, [(escape_name(key), (rowid << 2) | SAMPLE, 0, rowid + FIRST_COOKIE)
                                  for key, rowid in rows])  # fmt: skip
        shard = self._folder_shard[number]
        if shard is not None:
            rows = self.index.shard_samples_page(shard, start, limit)
            return Listing(True, [(escape_name(key), (rowid << 2) | SAMPLE, 0, index + FIRST_COOKIE)
                                  for key, rowid, index in rows])  # fmt: skip
        children = [(name, child, 0) for name, child in self._folders[number].items()]
        return Listing(True, _page(children, start, limit))

    def usage(self) -> tuple[int, int]:
        """(bytes, files) of the parts this tree shows, for `df`."""
        return self.index.part_usage()

    def path(self, node: int) -> str | None:
        """Where `node` is shown, e.g. `/shard-000.tar/s0_000/txt`, for messages; None if there is none.
        A sample or part is looked up in the index."""
        kind, number = node & 3, node >> 2
        if kind == FOLDER:
            return "/" + "/".join(self._folder_names(number)) if number < len(self._folders) else None
        if kind == SAMPLE:
            sample = self.index.sample_by_rowid(number)
            return None if sample is None else self._sample_path(sample.key, sample.tar_file_id)
        place = self.index.part_place(number)
        if place is None:
            return None
        key, part, tar_file_id = place
        if self.flat:
            return f"/{escape_name(f'{key}.{part}')}"
        return f"{self._sample_path(key, tar_file_id)}/{escape_name(part)}"

    def _folder_names(self, number: int) -> list[str]:
        """The shown names from the root down to folder `number` (none for the root)."""
        names: list[str] = []
        while number != 0:
            parent, name = next(
                (parent, name)
                for parent, children in enumerate(self._folders)
                for name, child in children.items()
                if child >> 2 == number
            )
            names.insert(0, name)
            number = parent
        return names

    def _sample_path(self, key: str, tar_file_id: int) -> str:
        """Where a sample's folder is shown (the sample and shard views)."""
        if self.view is View.SAMPLE:
            return f"/{escape_name(key)}"
        shard = self._folder_names(self._folder_shard.index(tar_file_id))
        return f"/{'/'.join(shard)}/{escape_name(key)}"

    # -- bytes ---------------------------------------------------------------------------------------
    def read(self, node: int, offset: int, size: int) -> bytes:
        """Bytes `offset .. offset+size` of a part file (fewer at its end); FileNotFoundError if no part."""
        location = self.location(node)
        if location is None:
            raise FileNotFoundError(node)
        try:
            return self.dataset.read_part(location, offset, size)
        except FileNotFoundError as error:
            raise _shard_gone(error) from None
        except ShardChangedError as error:
            raise self._say_changed(error) from None

    def read_cached(self, node: int, offset: int, into: memoryview) -> memoryview:
        """`read` into `into` from the page cache only (the filled front of it); BlockingIOError if the
        disk would be needed."""
        location = self.location(node)
        if location is None:
            raise FileNotFoundError(node)
        try:
            return self.dataset.read_part_cached(location, offset, into)
        except FileNotFoundError as error:
            raise _shard_gone(error) from None
        except ShardChangedError as error:
            raise self._say_changed(error) from None

    def _say_changed(self, error: ShardChangedError) -> AlreadyToldError:
        """Say once that a shard changed while mounted, and what to do; the error to raise."""
        told = AlreadyToldError(errno.EIO, str(error))
        shard = error.shard
        if shard in self._changed_shards:
            return told
        self._changed_shards.add(shard)
        self.messages.say(
            f"{self.dataset.shard_path(shard)} changed (replaced or rewritten) while mounted; its files read"
            f" as I/O errors. {_prepare_again(self.dataset)}"
        )
        return told

    def close(self) -> None:
        """Close every thread's connection and the dataset's shard files."""
        self.index.close()
        self.dataset.close()


def _prepare_again(dataset: PreparedDataset) -> str:
    return f"Prepare the dataset again (`shardprep prepare {dataset.root}`) and mount it anew."


def _changed_before(dataset: PreparedDataset, changed: dict[str, tuple[int, int]]) -> str:
    """What to say of shards that had changed since they were indexed (shard -> (size, indexed end))."""
    named = [
        f"{dataset.shard_path(shard)} ({size:,} bytes; its indexed samples run to byte {end:,})"
        for shard, (size, end) in islice(changed.items(), MAX_REPORTED_ERRORS)
    ]
    if len(changed) > MAX_REPORTED_ERRORS:
        named.append(f"and {len(changed) - MAX_REPORTED_ERRORS:,} more")
    one = len(changed) == 1
    return (
        f"{len(changed):,} shard{'' if one else 's'} changed after the dataset was prepared (shorter than"
        f" {'its' if one else 'their'} index says: truncated, or another file in {'its' if one else 'their'}"
        f" place): {', '.join(named)}. {'Its' if one else 'Their'} files read as I/O errors; the other shards"
        f" are served. {_prepare_again(dataset)}"
    )


def _shard_gone(error: FileNotFoundError) -> OSError:
    """A listed file whose shard is missing: an I/O error (the file is there, its bytes are not), not
    "no such file"."""
    return OSError(errno.EIO, f"its shard is missing: {error.filename}")
