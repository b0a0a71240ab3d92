"""The directory trees a mounted dataset shows, answered from sqlite one path at a time.

Three views of the same parts:

- `flat`: every part in the root as `/KEY.PART` (energon's default mount);
- `sample`: a folder per sample, `/KEY/PART` (energon's `mount -s`);
- `shard`: a folder per shard holding sample folders, `/SHARD.tar/KEY/PART`.

Nothing here builds a table of all files: a lookup is one or two indexed sqlite queries, and a big
listing is a cursor that can resume after any entry (its `cookie`), so listing a million parts needs
the memory of one page of names. Names are made safe before they are shown: a key may hold `/` and
could spell `..`, so every name is one path component in which `%`, `/` and NUL are percent-escaped
and `.`, `..` and the empty name are escaped whole. This module does not import FUSE.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from prep.dataset_reader import PartLocation, PreparedDataset, SampleRow
from prep.errors import PrepError
from prep.index_format import split_member_name

#: Cookies 1 and 2 are `.` and `..`; entries of a resumable listing start at this cookie.
FIRST_COOKIE = 3

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


@dataclass(frozen=True, slots=True)
class Node:
    """What a path is: a folder, or a file with its part's location."""

    is_dir: bool
    size: int = 0
    location: PartLocation | None = None


DIR = Node(is_dir=True)


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a listing; `cookie` is 0 in a small listing served whole, else its resume point."""

    name: str
    is_dir: bool
    cookie: int


class MountTree:
    """Resolves paths and lists folders of one view of a prepared dataset, optionally one split only."""

    def __init__(self, dataset: PreparedDataset, view: View = View.FLAT, split: str | None = None) -> None:
        self.dataset = dataset
        self.view = View(view)
        self.split = split
        shard_names = dataset.split_shards(split)
        self.allowed: set[int] | None = None
        if split is not None:
            self.allowed = {dataset.tar_file_id(name) for name in shard_names}
        # The shard view's folders: a small tree of shard paths (shards number thousands, not millions).
        self._shard_dirs: dict[tuple[str, ...], dict[str, int | None]] = {(): {}}
        for name in shard_names:
            components = tuple(escape_name(component) for component in name.split("/"))
            for depth in range(len(components)):
                folder = self._shard_dirs.setdefault(components[:depth], {})
                is_last = depth == len(components) - 1
                folder[components[depth]] = dataset.tar_file_id(name) if is_last else None
                if not is_last:
                    self._shard_dirs.setdefault(components[: depth + 1], {})
        self._id_filter = ""
        if self.allowed is not None:
            self._id_filter = " AND {column} IN (" + ",".join(str(i) for i in sorted(self.allowed)) + ")"

    # -- lookups -------------------------------------------------------------------------------------
    def _sample(self, shown_key: str, tar_file_id: int | None = None) -> SampleRow | None:
        sample = self.dataset.sample_by_key(unescape_name(shown_key))
        if sample is None:
            return None
        if self.allowed is not None and sample.tar_file_id not in self.allowed:
            return None
        if tar_file_id is not None and sample.tar_file_id != tar_file_id:
            return None
        return sample

    def _part_node(self, sample: SampleRow | None, shown_part: str) -> Node | None:
        if sample is None:
            return None
        location = self.dataset.part(sample.tar_file_id, sample.index, unescape_name(shown_part))
        return None if location is None else Node(False, location.size, location)

    def _shard_walk(self, components: list[str]) -> tuple[Node | None, int | None, list[str]]:
        """Walk shard-path folders: (folder node or None, tar_file_id if a shard was reached, rest)."""
        prefix: tuple[str, ...] = ()
        for position, component in enumerate(components):
            folder = self._shard_dirs.get(prefix, {})
            if component not in folder:
                return None, None, []
            tar_file_id = folder[component]
            if tar_file_id is not None:
                return DIR, tar_file_id, components[position + 1 :]
            prefix = prefix + (component,)
        return DIR, None, []

    def lookup(self, path: str) -> Node | None:
        """The node at an absolute mount path, or None if there is nothing there."""
        if "\0" in path:
            return None
        components = [component for component in path.split("/") if component]
        if not components:
            return DIR
        if self.view is View.FLAT:
            if len(components) != 1:
                return None
            split = split_member_name(unescape_name(components[0]))
            if split is None:
                return None
            key, part = split
            return self._part_node(self._sample(escape_name(key)), escape_name(part))
        if self.view is View.SAMPLE:
            if len(components) > 2:
                return None
            sample = self._sample(components[0])
            if len(components) == 1:
                return None if sample is None else DIR
            return self._part_node(sample, components[1])
        node, tar_file_id, rest = self._shard_walk(components)
        if node is None or not rest:
            return node
        if tar_file_id is None or len(rest) > 2:
            return None
        sample = self._sample(rest[0], tar_file_id)
        if len(rest) == 1:
            return None if sample is None else DIR
        return self._part_node(sample, rest[1])

    # -- listings ------------------------------------------------------------------------------------
    def list_dir(self, path: str, after: int = 0) -> Iterator[Entry]:
        """The entries of a folder after cookie `after`; raises FileNotFoundError for a missing folder."""
        components = [component for component in path.split("/") if component]
        if self.view is View.FLAT:
            if components:
                raise FileNotFoundError(path)
            yield from self._list_all_parts(after)
            return
        if self.view is View.SAMPLE:
            if not components:
                yield from self._list_all_samples(after)
                return
            sample = self._sample(components[0]) if len(components) == 1 else None
            if sample is None:
                raise FileNotFoundError(path)
            yield from self._list_parts(sample)
            return
        node, tar_file_id, rest = self._shard_walk(components)
        if node is None:
            raise FileNotFoundError(path)
        if tar_file_id is None:
            prefix = tuple(components)
            for name in self._shard_dirs.get(prefix, {}):
                yield Entry(name, True, 0)
            return
        if not rest:
            for sample in self.dataset.samples_of_shard(tar_file_id, max(after - FIRST_COOKIE, -1)):
                yield Entry(escape_name(sample.key), True, sample.index + FIRST_COOKIE)
            return
        sample = self._sample(rest[0], tar_file_id) if len(rest) == 1 else None
        if sample is None:
            raise FileNotFoundError(path)
        yield from self._list_parts(sample)

    def _list_parts(self, sample: SampleRow) -> Iterator[Entry]:
        for name, _ in self.dataset.parts_of_sample(sample.tar_file_id, sample.index):
            yield Entry(escape_name(name), False, 0)

    def _list_all_samples(self, after: int) -> Iterator[Entry]:
        with self.dataset.connection() as db:
            cursor = db.execute(
                "SELECT rowid, sample_key FROM samples WHERE rowid > ?"
                + self._id_filter.format(column="tar_file_id")
                + " ORDER BY rowid",
                (max(after - FIRST_COOKIE, 0),),
            )
            try:
                for rowid, key in cursor:
                    yield Entry(escape_name(key), True, rowid + FIRST_COOKIE)
            finally:
                cursor.close()

    def _list_all_parts(self, after: int) -> Iterator[Entry]:
        with self.dataset.connection() as db:
            cursor = db.execute(
                "SELECT sp.rowid, s.sample_key, sp.part_name FROM sample_parts sp JOIN samples s"
                " ON s.tar_file_id = sp.tar_file_id AND s.sample_index = sp.sample_index WHERE sp.rowid > ?"
                + self._id_filter.format(column="sp.tar_file_id")
                + " ORDER BY sp.rowid",
                (max(after - FIRST_COOKIE, 0),),
            )
            try:
                for rowid, key, part in cursor:
                    yield Entry(escape_name(f"{key}.{part}"), False, rowid + FIRST_COOKIE)
            finally:
                cursor.close()


def parse_view(value: str) -> View:
    """The view named on the command line."""
    try:
        return View(value)
    except ValueError:
        raise PrepError(f"--view must be one of flat, sample, shard (got {value!r}).") from None
