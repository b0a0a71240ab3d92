"""The index rows of one shard, column by column, and the two files they become beside the dataset.

`ShardRows` holds exactly the rows energon 7.4.1 puts into `index.sqlite` for one shard and the offsets it
puts into the shard's `.tar.idx`. Both ways to one (`prepare` scans a tar, `write` records what it
writes) fill the same columns, and the sqlite writer inserts them straight from there. The columns are a
few machine words per row, cheap to send from a worker process, to keep in a staging file (the rows
file) until the index is built, and to insert.
"""

from __future__ import annotations

import pickle
import sys
from array import array
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

#: How many distinct part names a shard reports for the wizard (energon stops at 50 as well).
MAX_PART_NAMES = 50


def _int_column() -> array:
    return array("q")


@dataclass
class ShardRows:
    """The index rows of one shard: sample i is `sample_keys[i]` starting at `sample_starts[i]`; part j
    belongs to sample `part_samples[j]`. Equal parts' names share one str.

    The keys are kept as one string, each followed by a NUL (`keys_text`, key i ending at `key_ends[i]`): a
    hundred thousand keys are then one object to build, send and hold, not a hundred thousand.

    >>> rows = ShardRows("a.tar", 0)
    >>> rows.set_keys(["000", "001"])
    >>> rows.sample_keys, rows.keys_between(1, 2), rows.count
    (['000', '001'], ['001'], 2)
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
    #: False for a shard that ends right after its last member, without the marker (indexed to its end).
    end_marker: bool = True
    #: Where bytes other than zeros start after the marker (data no tar reader sees, such as a second
    #: archive joined on with `cat`); None where there are none.
    after_end: int | None = None

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

    def sample_rows(self) -> list[tuple[int, str, int, int, int]]:
        """The `samples` table rows: (tar_file_id, sample_key, sample_index, byte_offset, byte_size)."""
        return [
            (self.tar_file_id, key, index, start, size)
            for index, (key, start, size) in enumerate(
                zip(self.sample_keys, self.sample_starts, self.sample_sizes, strict=True)
            )
        ]

    def part_rows(self) -> list[tuple[int, int, str, int, int]]:
        """The `sample_parts` table rows: (tar_file_id, sample_index, part_name, content_byte_offset,
        content_byte_size)."""
        columns = (self.part_samples, self.part_names, self.part_offsets, self.part_sizes)
        return [(self.tar_file_id, *row) for row in zip(*columns, strict=True)]

    def distinct_part_names(self) -> set[str]:
        """The first MAX_PART_NAMES distinct part names, for the wizard.

        >>> rows = ShardRows("a.tar", 0, part_names=["txt", "json", "txt"])
        >>> sorted(rows.distinct_part_names()), ShardRows("b.tar", 0, part_names=["txt"] * 3).distinct_part_names()
        (['json', 'txt'], {'txt'})
        """
        names = self.part_names
        if names and names.count(names[0]) == len(names):  # one part name throughout: 50x quicker
            return {names[0]}
        return set(list(dict.fromkeys(names))[:MAX_PART_NAMES])

    def first_samples(self, count: int) -> list[tuple[str, list[tuple[str, int, int]]]]:
        """The first `count` samples as (key, [(part, content offset, size)])."""
        keys = self.keys_between(0, min(count, self.count))
        samples: list[tuple[str, list[tuple[str, int, int]]]] = [(key, []) for key in keys]
        for j, sample in enumerate(self.part_samples):
            if sample >= count:
                break
            samples[sample][1].append((self.part_names[j], self.part_offsets[j], self.part_sizes[j]))
        return samples


def tar_index_bytes(offsets: array) -> bytes:
    """The `.tar.idx` contents: the offsets as little-endian uint64, as energon's TarIndexReader reads them.

    >>> tar_index_bytes(array("q", [0, 1024]))
    b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x04\\x00\\x00\\x00\\x00\\x00\\x00'
    """
    if sys.byteorder == "little":  # TAR_INDEX_ENTRY: 8 bytes each, as int64 has them for offsets >= 0
        return offsets.tobytes()
    data = array("q", offsets)
    data.byteswap()
    return data.tobytes()


def write_tar_index(path: Path, rows: ShardRows) -> None:
    """Write a shard's `.tar.idx` (to its staged path) from its rows."""
    with open(path, "wb") as file:
        file.write(tar_index_bytes(rows.offsets()))


def write_rows_file(path: Path, rows: ShardRows) -> None:
    """Keep a shard's index rows in a staging file until the index is built.

    Whoever wrote the shard (this process or a worker) saves them; the dataset build inserts them with the
    index writer `prepare` uses. A pickle: the columns and keys go as a few buffers (all keys are one string).
    """
    path.write_bytes(pickle.dumps(rows, protocol=pickle.HIGHEST_PROTOCOL))


def read_rows_file(path: Path) -> ShardRows:
    """The rows `write_rows_file` saved (a file this run wrote into its own staging folder)."""
    return pickle.loads(path.read_bytes())
