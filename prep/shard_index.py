"""Index one shard: group its members into samples by energon's key rule and record their offsets.

The result holds exactly the rows energon 7.4.1 puts into `index.sqlite` for the shard and the offsets
it puts into the shard's `.tar.idx`. `shard_rows` keeps them column by column (a few machine words per
row, cheap to send from a worker process and to insert); `index_shard` gives them as row tuples.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from typing import TYPE_CHECKING

from prep.errors import ShardError
from prep.index_format import split_member_name

if TYPE_CHECKING:
    import numpy as np

#: How many distinct part names a shard reports for the wizard (energon stops at 50 as well).
MAX_PART_NAMES = 50


@dataclass
class ShardIndex:
    """The index rows of one shard as tuples, ready for bulk insertion."""

    shard: str
    tar_file_id: int
    #: (tar_file_id, sample_key, sample_index, byte_offset, byte_size)
    samples: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    #: (tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size)
    parts: list[tuple[int, int, str, int, int]] = field(default_factory=list)
    #: Sample start offsets followed by the end offset: the `.tar.idx` contents.
    offsets: array = field(default_factory=lambda: array("Q"))
    part_names: set[str] = field(default_factory=set)

    @property
    def count(self) -> int:
        return len(self.samples)


def _int_column() -> array:
    return array("q")


@dataclass
class ShardRows:
    """The index rows of one shard, column by column: sample i is `sample_keys[i]` starting at
    `sample_starts[i]`; part j belongs to sample `part_samples[j]`. Equal parts' names share one str.

    The keys are kept as one string, each followed by a NUL (`keys_text`, key i ending at `key_ends[i]`): a
    hundred thousand keys are then one object to build, send and hold, not a hundred thousand.
    """

    shard: str
    tar_file_id: int
    keys_text: str = ""
    key_ends: array = field(default_factory=_int_column)
    sample_starts: array = field(default_factory=_int_column)
    sample_sizes: array = field(default_factory=_int_column)
    part_samples: array = field(default_factory=_int_column)
    part_names: list[str] = field(default_factory=list)
    part_offsets: array = field(default_factory=_int_column)
    part_sizes: array = field(default_factory=_int_column)
    #: Where the end-of-archive marker starts: the last `.tar.idx` offset.
    end: int = 0

    @property
    def count(self) -> int:
        return len(self.key_ends)

    @property
    def sample_keys(self) -> list[str]:
        """The sample keys, in order."""
        return self.keys_between(0, self.count)

    def keys_between(self, start: int, stop: int) -> list[str]:
        """The keys of samples `start` to `stop` (exclusive)."""
        if stop <= start:
            return []
        text, ends = self.keys_text, self.key_ends
        keys = text[ends[start - 1] + 1 if start else 0 : ends[stop - 1]].split("\0")
        if len(keys) == stop - start:
            return keys
        # a key holds a NUL itself (only a PAX path can): cut by the recorded ends
        return [text[ends[i - 1] + 1 if i else 0 : ends[i]] for i in range(start, stop)]

    def set_keys(self, keys: list[str]) -> None:
        """Hold `keys` as the sample keys, in order."""
        self.keys_text = "\0".join(keys) + "\0" if keys else ""
        self.key_ends = array("q", (end - 1 for end in accumulate(len(key) + 1 for key in keys)))

    def offsets(self) -> array:
        """The `.tar.idx` offsets: each sample's start, then the end."""
        offsets = array("q", self.sample_starts)
        offsets.append(self.end)
        return offsets

    def distinct_part_names(self) -> set[str]:
        """The first MAX_PART_NAMES distinct part names, for the wizard."""
        return set(list(dict.fromkeys(self.part_names))[:MAX_PART_NAMES])

    def first_samples(self, count: int) -> list[tuple[str, list[tuple[str, int, int]]]]:
        """The first `count` samples as (key, [(part, content offset, size)])."""
        keys = self.keys_between(0, min(count, self.count))
        samples: list[tuple[str, list[tuple[str, int, int]]]] = [(key, []) for key in keys]
        for j, sample in enumerate(self.part_samples):
            if sample >= count:
                break
            samples[sample][1].append((self.part_names[j], self.part_offsets[j], self.part_sizes[j]))
        return samples

    def to_index(self) -> ShardIndex:
        """The same rows as tuples (sample rows, part rows, `.tar.idx` offsets)."""
        tar_file_id = self.tar_file_id
        samples = list(
            zip(repeat(tar_file_id), self.sample_keys, range(self.count), self.sample_starts, self.sample_sizes)
        )
        parts = list(
            zip(repeat(tar_file_id), self.part_samples, self.part_names, self.part_offsets, self.part_sizes)
        )
        return ShardIndex(
            self.shard, tar_file_id, samples, parts, array("Q", self.offsets()), self.distinct_part_names()
        )


def shard_rows(path: str, shard: str, tar_file_id: int) -> ShardRows:
    """Scan one shard's headers and build its index rows, column by column.

    `path` is the file to read, `shard` its name relative to the dataset root (used in rows and errors).
    Raises ShardError for anything energon could not load correctly.
    """
    # Imported here: the scan needs numpy, the process that only receives and inserts rows does not.
    from prep.tar_scan import BLOCK, HeaderWalker, check_not_compressed, open_shard

    buffer = open_shard(path, shard)
    try:
        check_not_compressed(shard, buffer[:BLOCK])
        walker = HeaderWalker(shard, buffer)
        members = walker.scan()
        walker.verify_checksums()
        rows = ShardRows(shard, tar_file_id, end=walker.end)
        if not _group_vectorised(rows, *members):
            _group_one_by_one(rows, *members)
        return rows
    finally:
        if hasattr(buffer, "close"):
            buffer.close()


def index_shard(path: str, shard: str, tar_file_id: int) -> ShardIndex:
    """`shard_rows` as row tuples."""
    return shard_rows(path, shard, tar_file_id).to_index()


def _scattered_key(shard: str, key: str, first: int, again: int) -> ShardError:
    return ShardError(
        shard,
        f"sample key {key!r} appears again after other samples (its first part is at byte {first})."
        " energon needs all parts of a sample next to each other and every key unique.",
        offset=again,
        advice="Re-write the shard with each sample's parts together (shardprep write does) or give the"
        " sample a unique key.",
    )


def _group_one_by_one(rows: ShardRows, names: list[str], starts: array, data_offsets: array, sizes: array) -> None:
    """Group members into samples by energon's key rule, member by member (any name energon accepts)."""
    shard = rows.shard
    seen: dict[str, int] = {}
    keys: list[str] = []
    shared_names: dict[str, str] = {}
    key: str | None = None
    index = -1
    for name, member_start, offset_data, size in zip(names, starts, data_offsets, sizes, strict=True):
        split = split_member_name(name)
        if split is None:
            continue
        member_key, part = split
        if member_key != key:
            if member_key in seen:
                raise _scattered_key(shard, member_key, seen[member_key], member_start)
            key, index = member_key, index + 1
            seen[key] = member_start
            keys.append(key)
            rows.sample_starts.append(member_start)
        rows.part_samples.append(index)
        rows.part_names.append(shared_names.setdefault(part, part))
        rows.part_offsets.append(offset_data)
        rows.part_sizes.append(size)
    rows.set_keys(keys)
    rows.sample_sizes = _sizes(rows.sample_starts, rows.end)


def _sizes(starts: array, end: int) -> array:
    """Each sample's size: from its start to the next sample's start (the last one to `end`)."""
    sizes = array("q", starts[1:])
    sizes.append(end)
    for i, start in enumerate(starts):
        sizes[i] -= start
    return sizes


def _group_vectorised(rows: ShardRows, names: list[str], starts: array, data_offsets: array, sizes: array) -> bool:
    """The same grouping with numpy string operations, when every name takes energon's plain path
    (a dot in a base name that does not start with one, no `__meta__` prefix). False: not applicable.

    Where it applies it empties `names`, to hold a big shard's names once rather than twice."""
    import numpy as np

    from prep.tar_scan import int_array

    if not names or not hasattr(np, "strings") or not hasattr(np.strings, "slice"):
        return False
    # UTF-8 bytes: a quarter of numpy's str size, and "/" and "." are single bytes that never occur inside
    # a multi-byte character, so positions found in bytes cut the names where the characters would.
    table = np.array([name.encode() for name in names])
    slash = np.strings.rfind(table, b"/")
    dot = np.strings.find(table, b".", slash + 1)
    if (dot <= slash + 1).any() or np.strings.startswith(table, b"__").any():
        return False
    names.clear()  # the table holds the names now: free the list early (a big shard's peak memory)
    parts = np.strings.slice(table, dot + 1, None)
    if (parts == parts[0]).all():
        rows.part_names = [parts[0].decode()] * len(parts)
    else:  # one str per distinct part name, shared by its rows
        distinct, which = np.unique(parts, return_inverse=True)
        names_of = [name.decode() for name in distinct.tolist()]
        rows.part_names = [names_of[i] for i in which.tolist()]
    del parts
    keys = np.strings.slice(table, 0, dot)
    del table, dot, slash
    first_part = np.empty(len(keys), dtype=bool)
    first_part[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first_part[1:])
    sample_keys = keys[first_part]
    del keys
    member_starts = np.frombuffer(starts, dtype=np.int64)
    sample_starts = member_starts[first_part]
    if not (sample_keys[1:] > sample_keys[:-1]).all():  # not sorted: maybe not unique either
        seen: dict[str, int] = {}
        for key, at in zip(sample_keys.tolist(), sample_starts.tolist(), strict=True):
            if key in seen:
                raise _scattered_key(rows.shard, key.decode(), seen[key], at)
            seen[key] = at
    rows.keys_text, rows.key_ends = _joined(sample_keys)
    del sample_keys
    rows.sample_starts = int_array(sample_starts)
    rows.sample_sizes = int_array(np.diff(sample_starts, append=rows.end))
    rows.part_samples = int_array(np.cumsum(first_part) - 1)
    rows.part_offsets = data_offsets
    rows.part_sizes = sizes
    return True


def _joined(texts: np.ndarray) -> tuple[str, array]:
    """A numpy array of UTF-8 bytes as one string, each element followed by a NUL, and the end of each
    element in it (in characters), without a str per element.

    The elements hold no NULs (a member name ends at its first NUL), so numpy's NUL padding marks their
    ends exactly."""
    import numpy as np

    from prep.tar_scan import int_array, nul_joined

    raw = texts.view(np.uint8).reshape(len(texts), texts.dtype.itemsize)
    kept = raw != 0
    text = nul_joined(raw, kept)
    # a character starts at every byte but the continuation bytes 0b10xxxxxx; each element's NUL is one more
    characters = (kept & ((raw & 0xC0) != 0x80)).sum(axis=1) + 1
    return text, int_array(np.cumsum(characters) - 1)


def tar_index_bytes(offsets: array) -> bytes:
    """The `.tar.idx` contents: the offsets as little-endian uint64, as energon's TarIndexReader reads them."""
    data = array("Q", offsets)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes()
