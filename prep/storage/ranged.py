"""An object read through ranged GETs as if it were a bytes buffer, for the tar header walk.

The walk asks for a header, then for the one after the member's data. `RangedObject` keeps one window of
the object: a request inside it costs nothing; one a little past it (the next header of a small member:
within the window's size or `READ_THROUGH` of its end) extends the window forward, reading what lies
between, and each such read doubles the window (up to `MAX_WINDOW`); one far past it (the next header
after a big member) skips there with a new ranged GET of the first window size. So a shard of small
members costs about its size in a few large reads, and a shard of big members costs its headers, one
small read each.

    >>> data = bytes(range(256)) * 64
    >>> fetch = lambda offset, length: data[offset : offset + length]
    >>> obj = RangedObject(fetch, len(data), window=1024, read_through=0)
    >>> obj[5000:5003] == data[5000:5003], obj[10], obj.fetched
    (True, 10, 2048)
"""

from __future__ import annotations

from collections.abc import Callable

from prep.storage.store import StorageError

#: The first read at a place the walk skips to: a header, a PAX or long-name record and some slack.
FIRST_WINDOW = 4 * 1024
#: Bytes worth reading through rather than skipping with another request (a request's latency, ~20 ms,
#: buys about this much transfer): members up to this size are read, bigger ones skipped.
READ_THROUGH = 256 * 1024
#: Reading forward never takes more than this in one request.
MAX_WINDOW = 8 * 1024 * 1024
#: `fetch(offset, length)`: the object's bytes in that range (fewer at its end).
Fetch = Callable[[int, int], bytes]


class RangedObject:
    """`len()`, `obj[i]` and `obj[a:b]` over an object of `size` bytes, fetched a window at a time.

    `fetched` counts the bytes fetched (the walk's whole cost), `requests` the fetches.
    """

    def __init__(
        self,
        fetch: Fetch,
        size: int,
        window: int = FIRST_WINDOW,
        max_window: int = MAX_WINDOW,
        align: int = 512,
        read_through: int = READ_THROUGH,
        name: str = "the object",
    ) -> None:
        self._fetch = fetch
        #: What to call the object in an error.
        self.name = name
        self.size = size
        self.first_window = window
        self.max_window = max(max_window, window)
        self.window = window
        #: Reads start at a multiple of this (tar's block), so a header's field comes with its header.
        self.align = align
        self.read_through = read_through
        self._start = 0
        self._data = b""
        self.fetched = 0
        self.requests = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int | slice) -> int | bytes:
        if isinstance(index, int):
            if index < 0:
                index += self.size
            if not 0 <= index < self.size:
                raise IndexError(index)
            return self._bytes(index, index + 1)[0]
        start, stop, step = index.indices(self.size)
        if step != 1:
            raise ValueError("RangedObject slices must be contiguous")
        return self._bytes(start, max(start, stop))

    def whole(self) -> bytes:
        """The whole object, fetching only what the window does not already hold from its start."""
        if self._start != 0:
            self._start, self._data = 0, b""
        self._data += self._read(len(self._data), self.size - len(self._data))
        return self._data

    def _bytes(self, start: int, stop: int) -> bytes:
        end = self._start + len(self._data)
        if self._start <= start and stop <= end:
            return self._data[start - self._start : stop - self._start]
        keep = start - start % self.align  # a header's field is fetched with its whole header
        if self._start <= keep <= end + max(self.window, self.read_through):
            # Near: read on from the window's end (the bytes between are cheaper than another request).
            self.window = min(self.window * 2, self.max_window)
            fresh = self._read(end, max(stop, end + self.window) - end)
            self._data = (self._data + fresh)[keep - self._start :]
        else:
            # Far (or behind): skip there with a new request of the first window size.
            self.window = self.first_window
            self._data = self._read(keep, max(stop - keep, self.window))
        self._start = keep
        return self._data[start - keep : stop - keep]

    def _read(self, offset: int, length: int) -> bytes:
        length = min(length, self.size - offset)
        if length <= 0:
            return b""
        data = self._fetch(offset, length)
        self.fetched += len(data)
        self.requests += 1
        if len(data) != length:  # replaced or cut between the listing and this read
            raise StorageError(
                f"{self.name} changed while it was read: it was listed at {self.size:,} bytes, but a read"
                f" of {length:,} bytes at byte {offset:,} gave {len(data):,}. Run again once the bucket is"
                " no longer being written."
            )
        return data
