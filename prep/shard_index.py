"""Index one shard: group its members into samples by energon's key rule and record their offsets.

The result holds exactly the rows energon 7.4.1 puts into `index.sqlite` for the shard and the offsets
it puts into the shard's `.tar.idx`. Runs in a worker process; only plain data crosses back.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from prep.errors import ShardError
from prep.index_format import split_member_name
from prep.tar_scan import BLOCK, HeaderWalker, check_not_compressed, open_shard

#: How many distinct part names a shard reports for the wizard (energon stops at 50 as well).
MAX_PART_NAMES = 50


@dataclass
class ShardIndex:
    """The index rows of one shard, ready for bulk insertion."""

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


def index_shard(path: str, shard: str, tar_file_id: int) -> ShardIndex:
    """Scan one shard's headers and build its index rows.

    `path` is the file to read, `shard` its name relative to the dataset root (used in rows and errors).
    Raises ShardError for anything energon could not load correctly.
    """
    buffer = open_shard(path, shard)
    try:
        check_not_compressed(shard, buffer[:BLOCK])
        walker = HeaderWalker(shard, buffer)
        members = walker.scan()
        walker.verify_checksums()
        result = ShardIndex(shard, tar_file_id)
        if not _group_vectorised(result, *members, walker.end):
            _group_one_by_one(result, *members, walker.end)
        return result
    finally:
        if hasattr(buffer, "close"):
            buffer.close()


def _scattered_key(shard: str, key: str, first: int, again: int) -> ShardError:
    return ShardError(
        shard,
        f"sample key {key!r} appears again after other samples (its first part is at byte {first})."
        " energon needs all parts of a sample next to each other and every key unique.",
        offset=again,
        advice="Re-write the shard with each sample's parts together (shardprep write does) or give the"
        " sample a unique key.",
    )


def _group_one_by_one(
    result: ShardIndex, names: list[str], starts: array, data_offsets: array, sizes: array, end: int
) -> None:
    """Group members into samples by energon's key rule, member by member (any name energon accepts)."""
    tar_file_id, shard = result.tar_file_id, result.shard
    samples, parts, offsets, part_names = result.samples, result.parts, result.offsets, result.part_names
    seen: dict[str, int] = {}
    key: str | None = None
    start = 0
    index = -1
    for name, member_start, offset_data, size in zip(names, starts, data_offsets, sizes, strict=True):
        split = split_member_name(name)
        if split is None:
            continue
        member_key, part = split
        if member_key != key:
            if key is not None:
                samples.append((tar_file_id, key, index, start, member_start - start))
            if member_key in seen:
                raise _scattered_key(shard, member_key, seen[member_key], member_start)
            key, start, index = member_key, member_start, index + 1
            seen[key] = start
            offsets.append(start)
        if len(part_names) < MAX_PART_NAMES:
            part_names.add(part)
        parts.append((tar_file_id, index, part, offset_data, size))
    if key is not None:
        samples.append((tar_file_id, key, index, start, end - start))
    offsets.append(end)


def _group_vectorised(
    result: ShardIndex, names: list[str], starts: array, data_offsets: array, sizes: array, end: int
) -> bool:
    """The same grouping with numpy string operations, when every name takes energon's plain path
    (a dot in a base name that does not start with one, no `__meta__` prefix). False: not applicable."""
    if not names or not hasattr(np, "strings") or not hasattr(np.strings, "slice"):
        return False
    table = np.array(names)
    slash = np.strings.rfind(table, "/")
    dot = np.strings.find(table, ".", slash + 1)
    if (dot <= slash + 1).any() or np.strings.startswith(table, "__").any():
        return False
    keys = np.strings.slice(table, 0, dot)
    first_part = np.empty(len(keys), dtype=bool)
    first_part[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first_part[1:])
    sample_keys = keys[first_part].tolist()
    member_starts = np.frombuffer(starts, dtype=np.int64)
    sample_starts = member_starts[first_part]
    if len(set(sample_keys)) != len(sample_keys):
        seen: dict[str, int] = {}
        for key, at in zip(sample_keys, sample_starts.tolist(), strict=True):
            if key in seen:
                raise _scattered_key(result.shard, key, seen[key], at)
            seen[key] = at
    tar_file_id = result.tar_file_id
    sample_sizes = np.diff(sample_starts, append=end)
    result.samples = list(
        zip(repeat(tar_file_id), sample_keys, range(len(sample_keys)), sample_starts.tolist(),
            sample_sizes.tolist(), strict=False)
    )
    part_list = np.strings.slice(table, dot + 1, None).tolist()
    result.parts = list(
        zip(repeat(tar_file_id), (np.cumsum(first_part) - 1).tolist(), part_list, data_offsets, sizes,
            strict=False)
    )
    result.part_names = set(list(dict.fromkeys(part_list))[:MAX_PART_NAMES])
    result.offsets = array("Q", sample_starts.tolist())
    result.offsets.append(end)
    return True


def tar_index_bytes(offsets: array) -> bytes:
    """The `.tar.idx` contents: the offsets as little-endian uint64, as energon's TarIndexReader reads them."""
    data = array("Q", offsets)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes()
