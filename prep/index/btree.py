"""sqlite b-trees written as pages, for an `index.sqlite` whose rows arrive in the order they sort in.

sqlite inserts a row at a time: it encodes the record, seeks its place in the table and in each index and
writes it there, about 1 us a sample for energon's two tables and four indexes. When every row comes
in the order its table and indexes sort it (shard after shard, sample keys ascending: what `prepare`
and `write` give for nearly every dataset), the finished trees are known in advance: full leaf pages,
appended, with interior pages over them. `OrderedTables` writes exactly that, a shard's rows at a time,
in numpy (about 3x cheaper), following sqlite's file format (https://www.sqlite.org/fileformat2.html,
sections 1.6 and 2):

- sqlite makes the file: page 1 with its header and schema, one empty root page per table and index;
  leaf pages are appended as rows come and, at `close`, interior pages above them; each tree's top page
  goes in its root's place, and the header gets the page count. The page holding the byte at 1 GiB is
  left empty, as sqlite leaves it (it locks the file there).
- Cells hold records as sqlite encodes them, except that each integer column takes, throughout a shard,
  the width its largest value needs (sqlite picks it value by value; a reader decodes either alike).
- A table's leaves are filled in rowid order; an index's leaves hold its entries in key order, one entry
  between two leaves moving up to their parent, as the format's index b-trees want.

`add` takes a shard's rows only when they continue every tree in order and fit the format's simple case
(a key without a NUL, no record too long for its page); otherwise it returns False and adds nothing, and
the caller closes the file (a valid database) and goes on inserting through sqlite.
"""

from __future__ import annotations

import io
import sqlite3
from array import array
from bisect import bisect_right
from pathlib import Path

import numpy as np

#: The b-tree page types of the format (first byte of each page's header).
TABLE_LEAF, TABLE_INTERIOR, INDEX_LEAF, INDEX_INTERIOR = 0x0D, 0x05, 0x0A, 0x02
#: Header bytes of a leaf and of an interior page (which adds its right-most child).
LEAF_HEADER, INTERIOR_HEADER = 8, 12
#: Where the database header keeps the page count (and the counter that says it is valid).
HEADER_PAGE_COUNT, HEADER_CHANGE_COUNTER, HEADER_VALID_FOR = 28, 24, 92
#: The byte sqlite locks a database file at: the page that holds it is never part of the database.
LOCK_BYTE = 1 << 30
#: Integer serial types by the bytes they take (1, 2, 3, 4, 6 or 8), and the largest value of each.
INT_SERIAL = {1: 1, 2: 2, 3: 3, 4: 4, 6: 5, 8: 6}
INT_LIMITS = ((1, 0x7F), (2, 0x7FFF), (3, 0x7FFFFF), (4, 0x7FFFFFFF), (6, 0x7FFFFFFFFFFF), (8, 2**63 - 1))
#: `Texts` pads each text to the longest of its column: where that would take more than PADDING times the
#: texts' own bytes (and PADDING_SLACK), a few long texts among many short ones, the shard is left to sqlite.
PADDING, PADDING_SLACK = 4, 1 << 20
#: Texts are padded this many bytes at a time (the work arrays take 8 bytes per byte padded).
PAD_CHUNK = 1 << 20
#: Varints longer than this (values of 2**56 and more) are never needed here.
MAX_VARINT = 8
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, MAX_VARINT)], dtype=np.int64)


class Unsupported(Exception):
    """Rows this writer leaves to sqlite (out of order, or outside the format's simple case)."""


# --- records and cells, a shard's worth at a time --------------------------------------------------


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each value takes as a sqlite varint (values from 0 to 2**56 - 1).

    >>> varint_lengths(np.array([0, 127, 128, 16383, 16384])).tolist()
    [1, 1, 2, 2, 3]
    """
    return np.searchsorted(_VARINT_STEPS, values, side="right") + 1


def _put_varints(cells: np.ndarray, used: np.ndarray, at: int, values: np.ndarray, room: int) -> None:
    """Write `values` as varints into columns `at`..`at+room` of `cells`, each left-aligned; `used` marks
    the bytes each takes."""
    lengths = varint_lengths(values)
    for k in range(room):
        shift = np.maximum(7 * (lengths - 1 - k), 0)
        more = (k < lengths - 1).astype(np.int64) << 7
        cells[:, at + k] = ((values >> shift) & 0x7F) | more
        used[:, at + k] = k < lengths


def int_width(values: np.ndarray) -> int:
    """The bytes the widest of `values` (none negative) takes as a sqlite integer.

    >>> int_width(np.array([0, 5])), int_width(np.array([70000])), int_width(np.array([], dtype=np.int64))
    (1, 3, 1)
    """
    largest = int(values.max()) if len(values) else 0
    if len(values) and int(values.min()) < 0:
        raise Unsupported("a negative integer")
    return next(width for width, limit in INT_LIMITS if largest <= limit)


class Texts:
    """A text column: row i is `padded[i, :lengths[i]]` (UTF-8, without NUL); `padded` is zero past it."""

    def __init__(self, padded: np.ndarray, lengths: np.ndarray) -> None:
        self.padded = padded
        self.lengths = lengths

    @classmethod
    def of(cls, data: bytes, starts: np.ndarray, lengths: np.ndarray, longest: int) -> Texts:
        """The texts `data[starts[i] : starts[i] + lengths[i]]`; Unsupported if one is over `longest`
        bytes or `check_padding` refuses them.

        >>> texts = Texts.of(b"ab cde", np.array([0, 3]), np.array([2, 3]), 10)
        >>> texts.padded.tobytes(), texts.lengths.tolist()
        (b'ab\\x00cde', [2, 3])
        """
        buffer = np.frombuffer(data, dtype=np.uint8)
        if not len(lengths):
            return cls(np.zeros((0, 1), dtype=np.uint8), lengths)
        widest = max(1, int(lengths.max()))
        check_padding(len(lengths), widest, int(lengths.sum()), longest)
        if int(lengths.min()) == widest and len(starts) > 1 and bool((np.diff(starts) == widest + 1).all()):
            # evenly spaced texts of one length (keys, each followed by its NUL): a view
            first = int(starts[0])
            rows = buffer[first : first + len(starts) * (widest + 1)]
            if len(rows) == len(starts) * (widest + 1):
                return cls(rows.reshape(-1, widest + 1)[:, :widest], lengths)
        padded = np.zeros((len(lengths), widest), dtype=np.uint8)
        columns = np.arange(widest)
        step = max(1, PAD_CHUNK // widest)
        for at in range(0, len(lengths), step):
            places = np.minimum(starts[at : at + step, None] + columns, len(buffer) - 1)
            padded[at : at + step] = np.where(columns < lengths[at : at + step, None], buffer[places], 0)
        return cls(padded, lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def take(self, order: np.ndarray) -> Texts:
        return Texts(self.padded[order], self.lengths[order])


def records(columns: list, rowids: np.ndarray | None, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The cells of a leaf holding these rows, as one byte array and each cell's length: a table's cells
    (payload size, rowid, record) when `rowids` is given, an index's (payload size, record) otherwise.
    An integer column is an int64 array, a text column `Texts`; a record over `limit` bytes (it would
    need overflow pages) raises Unsupported.

    >>> flat, lengths = records([np.array([7]), Texts.of(b"ab", np.array([0]), np.array([2]), 9)], None, 999)
    >>> flat.tobytes().hex(" "), lengths.tolist()
    ('06 03 01 11 07 61 62', [7])
    """
    texts = {i: column for i, column in enumerate(columns) if isinstance(column, Texts)}
    count = len(columns[0])
    if not count:
        return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64)
    widths = {i: int_width(column) for i, column in enumerate(columns) if i not in texts}
    one_length = all(
        int(column.lengths.min()) == int(column.lengths.max()) == column.padded.shape[1]
        for column in texts.values()
    )
    if one_length and (rowids is None or len(_varint(int(rowids[0]))) == len(_varint(int(rowids[-1])))):
        return _same_size_records(columns, texts, widths, rowids, limit)
    return _records(columns, texts, widths, rowids, limit)


def _same_size_records(
    columns: list, texts: dict[int, Texts], widths: dict[int, int], rowids: np.ndarray | None, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """`records` where every cell has the same layout: texts of one length, rowids of one varint size."""
    count = len(columns[0])
    serials = [
        _varint(13 + 2 * texts[i].padded.shape[1]) if i in texts else bytes([INT_SERIAL[widths[i]]])
        for i in range(len(columns))
    ]
    sizes = [texts[i].padded.shape[1] if i in texts else widths[i] for i in range(len(columns))]
    header = bytes([1 + sum(map(len, serials))]) + b"".join(serials)
    payload = len(header) + sum(sizes)
    if payload > limit:
        raise Unsupported("a record too long for a page")
    prefix = _varint(payload)
    rowid_size = len(_varint(int(rowids[0]))) if rowids is not None else 0
    cell_size = len(prefix) + rowid_size + payload
    cells = np.empty((count, cell_size), dtype=np.uint8)
    cells[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    at = len(prefix)
    if rowids is not None:
        for k in range(rowid_size):
            more = 0x80 if k < rowid_size - 1 else 0
            cells[:, at + k] = ((rowids >> (7 * (rowid_size - 1 - k))) & 0x7F) | more
        at += rowid_size
    cells[:, at : at + len(header)] = np.frombuffer(header, dtype=np.uint8)
    at += len(header)
    for i, column in enumerate(columns):
        size = sizes[i]
        if i in texts:
            cells[:, at : at + size] = texts[i].padded
        else:
            _put_int(cells, at, column, size)
        at += size
    return cells.reshape(-1), np.full(count, cell_size, dtype=np.int64)


def _records(
    columns: list, texts: dict[int, Texts], widths: dict[int, int], rowids: np.ndarray | None, limit: int
) -> tuple[np.ndarray, np.ndarray]:
    """`records` in general: each row's varints and texts take the room of the longest, and the bytes a
    row leaves unused are dropped at the end."""
    count = len(columns[0])
    serials = {i: 13 + 2 * column.lengths for i, column in texts.items()}
    serial_lengths = {i: varint_lengths(serial) for i, serial in serials.items()}
    # The record: its header's size (one byte: headers here stay under 128), each column's serial type,
    # then each column's bytes.
    header = 1 + len(widths) + sum(serial_lengths.values(), np.zeros(count, dtype=np.int64))
    payload = header + sum(widths.values()) + sum((column.lengths for column in texts.values()), 0)
    if int(payload.max()) > limit:
        raise Unsupported("a record too long for a page")
    payload_lengths = varint_lengths(payload)
    rowid_lengths = varint_lengths(rowids) if rowids is not None else np.zeros(count, dtype=np.int64)
    rooms = [int(payload_lengths.max()), int(rowid_lengths.max()), 1]
    rooms += [int(serial_lengths[i].max()) if i in texts else 1 for i in range(len(columns))]
    rooms += [texts[i].padded.shape[1] if i in texts else widths[i] for i in range(len(columns))]
    cells = np.empty((count, sum(rooms)), dtype=np.uint8)
    used = np.ones(cells.shape, dtype=bool)
    at = 0
    _put_varints(cells, used, at, payload, rooms[0])
    at += rooms[0]
    if rowids is not None:
        _put_varints(cells, used, at, rowids, rooms[1])
        at += rooms[1]
    cells[:, at] = header
    at += 1
    for i in range(len(columns)):
        if i in texts:
            _put_varints(cells, used, at, serials[i], rooms[3 + i])
        else:
            cells[:, at] = INT_SERIAL[widths[i]]
        at += rooms[3 + i]
    for i, column in enumerate(columns):
        room = rooms[3 + len(columns) + i]
        if i in texts:
            cells[:, at : at + room] = texts[i].padded
            used[:, at : at + room] = np.arange(room) < texts[i].lengths[:, None]
        else:
            _put_int(cells, at, column, room)
        at += room
    return cells[used], payload + payload_lengths + (rowid_lengths if rowids is not None else 0)


def _put_int(cells: np.ndarray, at: int, column: np.ndarray, size: int) -> None:
    """`column` as `size`-byte big-endian integers in columns `at` onwards of `cells`, a byte column at a
    time: numpy copies a few 1-byte columns twice as fast as one strided block of them."""
    big_endian = column.astype(">i8").view(np.uint8).reshape(len(column), 8)
    for k in range(size):
        cells[:, at + k] = big_endian[:, 8 - size + k]


# --- pages ----------------------------------------------------------------------------------------


class _Tree:
    """One table's or index's b-tree as it is built: leaf pages go to the file as they fill; what each
    leaf's parent needs (its page and its largest rowid, or the entry after it) is kept for `close`."""

    def __init__(self, out: BTreeFile, root: int, index: bool) -> None:
        self.out = out
        self.root = root
        self.index = index
        self.pending = np.zeros(0, dtype=np.uint8)  # cells not yet in a page (the last leaf's)
        self.pending_lengths = np.zeros(0, dtype=np.int64)
        self.pending_rowids = np.zeros(0, dtype=np.int64)
        self.leaves = array("q")  # page numbers of the full leaves written
        self.keys = array("q")  # table: each full leaf's largest rowid
        self.dividers = bytearray()  # index: the entry after each full leaf, one cell each
        self.divider_ends = array("q")

    def add(self, cells: np.ndarray, lengths: np.ndarray, rowids: np.ndarray | None = None) -> None:
        """Append cells in key order; full leaves go to the file."""
        if not len(lengths):
            return
        cells = np.concatenate((self.pending, cells))
        lengths = np.concatenate((self.pending_lengths, lengths))
        if rowids is not None:
            rowids = np.concatenate((self.pending_rowids, rowids))
        ends = np.cumsum(lengths)
        room = self.out.page_size - LEAF_HEADER
        # a full leaf needs a cell after it; a full index leaf the entry after it (its divider) and one more
        enough = len(lengths) - (1 if self.index else 0)
        pages: list[tuple[int, int]] = []
        first, step = 0, None
        if int(lengths.min()) == int(lengths.max()):  # cells of one size: as many in each leaf
            per_page = room // (int(lengths[0]) + 2)
            step = per_page + 1 if self.index else per_page
            pages = [(first, first + per_page) for first in range(0, enough - per_page, step)]
            first = len(pages) * step
        else:
            costs = (ends + 2 * np.arange(1, len(lengths) + 1)).tolist()  # each cell and its pointer
            while True:
                stop = bisect_right(costs, (costs[first - 1] if first else 0) + room)
                if stop >= enough:
                    break
                pages.append((first, stop))
                first = stop + 1 if self.index else stop
        starts = ends - lengths
        if pages:
            kind = INDEX_LEAF if self.index else TABLE_LEAF
            numbers = self.out.leaf_pages(kind, cells, starts, ends, pages, step=step)
            self.leaves.extend(numbers)
            stops = [stop for _, stop in pages]
            if self.index:
                for stop in stops:
                    self.dividers += cells[starts[stop] : ends[stop]].tobytes()
                    self.divider_ends.append(len(self.dividers))
            else:
                assert rowids is not None
                self.keys.extend(rowids[np.array(stops) - 1].tolist())
        self.pending = cells[starts[first] :].copy()
        self.pending_lengths = lengths[first:].copy()
        if rowids is not None:
            self.pending_rowids = rowids[first:].copy()

    def close(self) -> None:
        """Write the last leaf and the interior pages; the top page goes in the root's place."""
        lengths, cells = self.pending_lengths, self.pending
        ends = np.cumsum(lengths)
        starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
        kind = INDEX_LEAF if self.index else TABLE_LEAF
        last = [(0, len(lengths))]
        if (
            self.index
            and len(lengths)
            and int(ends[-1] + 2 * len(lengths)) > self.out.page_size - LEAF_HEADER
        ):
            # the entries left fill a leaf and one more: the last but one goes up, the last alone
            last = [(0, len(lengths) - 2), (len(lengths) - 1, len(lengths))]
            divider = cells[starts[-2] : ends[-2]].tobytes()
        if not self.leaves and len(last) == 1:
            if len(lengths):
                self.out.leaf_pages(kind, cells, starts, ends, last, at=self.root)
            return  # an empty tree keeps the empty root sqlite made
        numbers = self.out.leaf_pages(kind, cells, starts, ends, last)
        self.leaves.extend(numbers)
        if self.index and len(last) == 2:
            self.dividers += divider
            self.divider_ends.append(len(self.dividers))
        elif not self.index:
            self.keys.append(int(self.pending_rowids[-1]))
        children = list(self.leaves)
        if self.index:
            ends_list = [0, *self.divider_ends]
            entries = [bytes(self.dividers[a:b]) for a, b in zip(ends_list, ends_list[1:], strict=False)]
            self._index_levels(children, entries)
        else:
            self._table_levels(children, list(self.keys))

    def _table_levels(self, children: list[int], keys: list[int]) -> None:
        """Interior pages of a table: each holds (child, its largest rowid) cells and a right-most child."""
        while True:
            groups = _groups(self.out.page_size, [4 + len(_varint(key)) for key in keys[:-1]])
            pages, page_keys = [], []
            for first, stop in groups:
                cells = [children[i].to_bytes(4, "big") + _varint(keys[i]) for i in range(first, stop - 1)]
                at = self.root if len(groups) == 1 else None
                pages.append(self.out.interior_page(TABLE_INTERIOR, cells, children[stop - 1], at=at))
                page_keys.append(keys[stop - 1])
            if len(groups) == 1:
                return
            children, keys = pages, page_keys

    def _index_levels(self, children: list[int], entries: list[bytes]) -> None:
        """Interior pages of an index: (child, entry after it) cells and a right-most child; between two
        interior pages one entry moves up a level."""
        while True:
            groups = _groups(self.out.page_size, [4 + len(entry) for entry in entries])
            pages, up = [], []
            for first, stop in groups:
                cells = [children[i].to_bytes(4, "big") + entries[i] for i in range(first, stop - 1)]
                at = self.root if len(groups) == 1 else None
                pages.append(self.out.interior_page(INDEX_INTERIOR, cells, children[stop - 1], at=at))
                if stop - 1 < len(entries):
                    up.append(entries[stop - 1])
            if len(groups) == 1:
                return
            children, entries = pages, up


def _varint(value: int) -> bytes:
    """One sqlite varint (values below 2**56).

    >>> _varint(1), _varint(200), _varint(16384)
    (b'\\x01', b'\\x81H', b'\\x81\\x80\\x00')
    """
    groups = [value & 0x7F]
    value >>= 7
    while value:
        groups.append(0x80 | (value & 0x7F))
        value >>= 7
    return bytes(reversed(groups))


def _groups(page_size: int, cell_sizes: list[int]) -> list[tuple[int, int]]:
    """How len(cell_sizes) + 1 children go into interior pages, as (first, stop) ranges of children: a
    page holds the cells of children first..stop-2 and has child stop-1 as its right-most; what stood
    beside that child (its largest rowid, or the index entry after it) goes up a level. Every page gets
    at least one cell.

    >>> _groups(4096, [5] * 3), len(_groups(4096, [1000] * 7)), _groups(4096, [1000] * 5)
    ([(0, 4)], 2, [(0, 4), (4, 6)])
    """
    room = page_size - INTERIOR_HEADER
    children = len(cell_sizes) + 1
    groups: list[tuple[int, int]] = []
    first = 0
    while first < children:
        spent, stop = 0, first
        while stop < children - 1 and spent + cell_sizes[stop] + 2 <= room:
            spent += cell_sizes[stop] + 2
            stop += 1
        groups.append((first, stop + 1))
        first = stop + 1
    if len(groups) > 1 and groups[-1][1] - groups[-1][0] < 2:
        # the last page would have no cell: the page before gives it its last child and that child's cell
        (first, stop), (_, last_stop) = groups[-2], groups[-1]
        groups[-2:] = [(first, stop - 1), (stop - 1, last_stop)]
    return groups


class BTreeFile:
    """The database file at `path` that sqlite made, open for pages: each tree's leaves and interior
    pages are appended, its top page put in its root's place; `close` sets the page count."""

    def __init__(self, path: Path, page_size: int) -> None:
        self.path = path
        self.page_size = page_size
        usable = page_size  # no reserved bytes at the end of pages (sqlite's default)
        self.max_local_table = usable - 35
        self.max_local_index = (usable - 12) * 64 // 255 - 23
        self.file = open(path, "r+b")  # noqa: SIM115 - closed by close() or abandon()
        size = self.file.seek(0, io.SEEK_END)
        #: The bytes sqlite made (the header and the trees' roots): the only ones written over later.
        self.head = size
        self.next_page = size // page_size + 1
        self.lock_page = LOCK_BYTE // page_size + 1

    def leaf_pages(
        self,
        kind: int,
        cells: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        pages: list[tuple[int, int]],
        at: int | None = None,
        step: int | None = None,
    ) -> list[int]:
        """Leaves holding the cells first..stop-1 of each of `pages`, each page's cells laid out in their
        order at its end; their page numbers (`at` for a single page that goes in a root's place). With
        `step`, the cells are all of one size, as many in each page, and pages start `step` cells apart."""
        size = self.page_size
        firsts = np.array([first for first, _ in pages], dtype=np.int64)
        stops = np.array([stop for _, stop in pages], dtype=np.int64)
        counts = stops - firsts
        used = ends[stops - 1] - starts[firsts]
        tops = size - used
        buffer = np.zeros((len(pages), size), dtype=np.uint8)
        buffer[:, 0] = kind
        buffer[:, 3:5] = counts.astype(">u2").view(np.uint8).reshape(-1, 2)
        buffer[:, 5:7] = tops.astype(">u2").view(np.uint8).reshape(-1, 2)
        if step is not None:  # same-size cells, `step` apart from page to page: all pages at once
            count, cell = int(counts[0]), int(ends[firsts[0]] - starts[firsts[0]])
            spread = cells[starts[firsts[0]] : starts[firsts[0]] + len(pages) * step * cell]
            buffer[:, size - count * cell :] = spread.reshape(len(pages), step * cell)[:, : count * cell]
            pointers = (int(tops[0]) + cell * np.arange(count)).astype(">u2").view(np.uint8)
            buffer[:, LEAF_HEADER : LEAF_HEADER + 2 * count] = pointers
            return self._place_many(buffer)
        # each cell's pointer: its page's top plus where it starts after the page's first cell
        chosen = np.concatenate([np.arange(first, stop) for first, stop in pages])
        pointers = (np.repeat(tops - starts[firsts], counts) + starts[chosen]).astype(">u2").view(np.uint8)
        flat = buffer.reshape(-1)
        content = cells.data
        pointer_at = 0
        for page, (first, stop) in enumerate(pages):
            base = page * size
            count = 2 * (stop - first)
            flat[base + LEAF_HEADER : base + LEAF_HEADER + count] = pointers[pointer_at : pointer_at + count]
            pointer_at += count
            flat[base + tops[page] : base + size] = content[starts[first] : ends[stop - 1]]
        if at is not None:
            return [self._place(buffer.tobytes(), at)]
        return self._place_many(buffer)

    def interior_page(self, kind: int, cells: list[bytes], right: int, at: int | None = None) -> int:
        """An interior page of `cells` (each starting with its child's page number) and right-most child."""
        content = b"".join(cells)
        top = self.page_size - len(content)
        offsets, place = [], top
        for cell in cells:
            offsets.append(place)
            place += len(cell)
        header = bytes([kind, 0, 0]) + len(cells).to_bytes(2, "big") + top.to_bytes(2, "big") + b"\0"
        header += right.to_bytes(4, "big") + b"".join(offset.to_bytes(2, "big") for offset in offsets)
        page = header + bytes(top - len(header)) + content
        assert len(page) == self.page_size
        return self._place(page, at)

    def _place(self, page: bytes, at: int | None) -> int:
        """Put one page in place `at`, or append it; its page number."""
        if at is None:
            return self._place_many(np.frombuffer(page, dtype=np.uint8).reshape(1, -1))[0]
        self.file.seek((at - 1) * self.page_size)
        self.file.write(page)
        self.file.seek(0, io.SEEK_END)
        return at

    def _place_many(self, pages: np.ndarray) -> list[int]:
        """Append whole pages (rows of `pages`); their page numbers. The page holding the byte at 1 GiB,
        sqlite's lock-byte page, is left out: it holds nothing, and reading it is an error."""
        numbers: list[int] = []
        first = 0
        while first < len(pages):
            if self.next_page == self.lock_page:
                self.file.write(bytes(self.page_size))
                self.next_page += 1
            stop = len(pages)
            if self.next_page < self.lock_page < self.next_page + stop - first:
                stop = first + self.lock_page - self.next_page
            self.file.write(pages[first:stop].data)
            numbers.extend(range(self.next_page, self.next_page + stop - first))
            self.next_page += stop - first
            first = stop
        return numbers

    def settled(self) -> int:
        """Where the pages appended so far end, once they are in the file: from `head` to there, its bytes
        stay as they are (pages are only appended after them, and put in roots' places before them)."""
        self.file.flush()
        return (self.next_page - 1) * self.page_size

    def close(self) -> None:
        """Write the page count and close the file (each tree closed first)."""
        self.file.seek(HEADER_CHANGE_COUNTER)
        counter = self.file.read(4)
        self.file.seek(HEADER_VALID_FOR)
        self.file.write(counter)
        self.file.seek(HEADER_PAGE_COUNT)
        self.file.write((self.next_page - 1).to_bytes(4, "big"))
        self.file.close()

    def abandon(self) -> None:
        """Close without finishing (the half-built file is the caller's to remove)."""
        self.file.close()


# --- a database's tables -----------------------------------------------------------------------


class _Table:
    """A table's tree and its indexes' trees, with where each stands."""

    def __init__(self, out: BTreeFile, root: int, columns: list[str]) -> None:
        self.tree = _Tree(out, root, index=False)
        self.columns = columns
        self.rows = 0
        self.indexes: list[_Index] = []


class _Index:
    """An index's tree: the table's columns it sorts by, whether they are unique, its last entry so far."""

    def __init__(self, tree: _Tree, positions: list[int], unique: bool) -> None:
        self.tree = tree
        self.positions = positions
        self.unique = unique
        self.last: tuple | None = None


class OrderedTables:
    """The tables and indexes of a database sqlite has just made (and closed), filled by writing pages
    while rows come in order: `add` takes each table's next rows and returns True, or adds nothing and
    returns False; `close` leaves a valid database holding every row added."""

    def __init__(self, path: Path) -> None:
        db = sqlite3.connect(path)
        try:
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            schema = db.execute("SELECT type, name, tbl_name, rootpage FROM sqlite_master").fetchall()
            tables = [(name, root) for kind, name, _, root in schema if kind == "table"]
            columns = {
                name: [row[1] for row in db.execute(f"PRAGMA table_info({name})")] for name, _ in tables
            }
            unique = {
                row[1]: bool(row[2]) for name, _ in tables for row in db.execute(f"PRAGMA index_list({name})")
            }
            indexes = [
                (name, table, root, [row[2] for row in db.execute(f"PRAGMA index_info({name})")])
                for kind, name, table, root in schema
                if kind == "index"
            ]
        finally:
            db.close()
        self.out = BTreeFile(path, page_size)
        self.tables = {name: _Table(self.out, root, columns[name]) for name, root in tables}
        for name, table, root, index_columns in indexes:
            positions = [self.tables[table].columns.index(column) for column in index_columns]
            tree = _Tree(self.out, root, index=True)
            self.tables[table].indexes.append(_Index(tree, positions, unique[name]))
        #: No text longer than this fits a record without overflow pages (the `longest` of `Texts`).
        self.longest_text = self.out.max_local_table

    def add(self, rows: dict[str, list]) -> bool:
        """Add each table's next rows, given as its columns in order (int64 arrays and `Texts`), if they
        continue the table and every index in order and fit the simple case; False, adding nothing,
        otherwise."""
        try:
            staged = [self._cells(self.tables[name], columns) for name, columns in rows.items()]
        except Unsupported:
            return False
        for table, table_cells, index_cells in staged:
            table.tree.add(*table_cells)
            for index, (cells, lengths, last) in zip(table.indexes, index_cells, strict=True):
                index.tree.add(cells, lengths)
                index.last = last
            table.rows += len(table_cells[1])
        return True

    def _cells(self, table: _Table, columns: list) -> tuple[_Table, tuple, list[tuple]]:
        """A table's next rows as cells of its tree and of each index's, or Unsupported."""
        count = len(columns[0])
        rowids = np.arange(table.rows + 1, table.rows + count + 1, dtype=np.int64)
        cells, lengths = records(columns, rowids, self.out.max_local_table)
        index_cells = []
        for index in table.indexes:
            entries = [columns[position] for position in index.positions]
            order = _order(entries, index.unique)
            if order is None:
                entries.append(rowids)
            else:
                entries = [_take(column, order) for column in entries] + [rowids[order]]
            first, last = (_entry(entries, 0), _entry(entries, count - 1)) if count else (None, index.last)
            if first is not None and index.last is not None:
                width = len(entries) - 1 if index.unique else len(entries)
                if not index.last[:width] < first[:width]:
                    raise Unsupported("entries before the last one")
            index_cells.append((*records(entries, None, self.out.max_local_index), last))
        return table, (cells, lengths, rowids), index_cells

    def settled(self) -> tuple[int, int]:
        """(head, end): the file's bytes between the two will not change again (`BTreeFile.settled`)."""
        return self.out.head, self.out.settled()

    def close(self) -> None:
        """Write what is left and close the file: a valid database."""
        for table in self.tables.values():
            table.tree.close()
            for index in table.indexes:
                index.tree.close()
        self.out.close()

    def abandon(self) -> None:
        """Close the file unfinished (the caller removes it)."""
        self.out.abandon()


def _sortable(column: np.ndarray | Texts) -> np.ndarray:
    """A column as an array numpy compares in sqlite's order (texts as zero-padded bytes: without a NUL
    inside, those compare as their bytes do)."""
    if isinstance(column, Texts):
        return np.ascontiguousarray(column.padded).view(f"S{column.padded.shape[1]}").ravel()
    return column


def _order(columns: list, unique: bool) -> np.ndarray | None:
    """The order that sorts the rows by `columns` (then by rowid: the order they came in), None if they
    are in it; Unsupported if `unique` and two rows are equal."""
    keys = [_sortable(column) for column in columns]
    count = len(keys[0])
    if count < 2:
        return None
    before, equal = np.zeros(count - 1, dtype=bool), np.ones(count - 1, dtype=bool)
    for key in keys:
        before |= equal & (key[:-1] < key[1:])
        equal &= key[:-1] == key[1:]
    if unique and bool(equal.any()):
        raise Unsupported("equal keys in a unique index")
    if bool((before | equal).all()):
        return None
    order = np.lexsort(keys[::-1])
    if unique:
        _order([_take(column, order) for column in columns], unique)  # raises on equal neighbours
    return order


def _take(column: np.ndarray | Texts, order: np.ndarray) -> np.ndarray | Texts:
    return column.take(order) if isinstance(column, Texts) else column[order]


def _entry(columns: list, row: int) -> tuple:
    """Row `row` of the columns as a tuple Python orders as sqlite does (texts as bytes)."""
    return tuple(
        column.padded[row, : column.lengths[row]].tobytes() if isinstance(column, Texts) else int(column[row])
        for column in columns
    )


def check_padding(count: int, widest: int, total: int, longest: int) -> None:
    """Unsupported where `count` texts of `total` bytes, padded to the `widest`, are not for `Texts`: one
    is over `longest` bytes (no record holds it without overflow pages), or the padding would take more
    than PADDING times their bytes (one long text among many short ones: memory for every row).

    >>> check_padding(1000, 1000, 999_000, 4000)  # texts of 999 bytes on average: little padding
    >>> check_padding(10, 30, 300, 20)
    Traceback (most recent call last):
    ...
    prep.index.btree.Unsupported: a text of 30 bytes, over the 20 a page holds
    >>> check_padding(1_000_000, 990, 8_000_990, 4000)
    Traceback (most recent call last):
    ...
    prep.index.btree.Unsupported: texts of very different lengths (up to 990 bytes, 8 on average)
    """
    if widest > longest:
        raise Unsupported(f"a text of {widest} bytes, over the {longest} a page holds")
    if count * widest > PADDING * total + PADDING_SLACK:
        raise Unsupported(
            f"texts of very different lengths (up to {widest} bytes, {total // max(count, 1)} on average)"
        )


def texts_between_nuls(text: str, count: int, longest: int) -> Texts:
    """`count` texts each followed by a NUL in `text`, as `Texts`; Unsupported if one holds a NUL itself,
    cannot be UTF-8, or `Texts.of` refuses them."""
    if text.count("\0") != count:
        raise Unsupported("a NUL inside a text")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise Unsupported("a text that is not UTF-8") from error
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 0)
    starts = np.concatenate(([0], ends[:-1] + 1)) if count else ends
    return Texts.of(data, starts, ends - starts, longest)


def texts_of(values: list[str], longest: int) -> Texts:
    """`values` (few distinct ones, many times over: part names) as `Texts`; Unsupported as for
    `texts_between_nuls`."""
    distinct = list(dict.fromkeys(values))
    table = texts_between_nuls("".join(value + "\0" for value in distinct), len(distinct), longest)
    if len(distinct) == 1:
        codes = np.zeros(len(values), dtype=np.int64)
    else:
        number = {value: i for i, value in enumerate(distinct)}
        codes = np.fromiter(map(number.__getitem__, values), dtype=np.int64, count=len(values))
    lengths = table.lengths[codes]
    check_padding(len(values), table.padded.shape[1], int(lengths.sum()), longest)
    return table.take(codes)
