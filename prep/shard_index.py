"""Index one shard: group its members into samples by energon's key rule and record their offsets.

The result holds exactly the rows energon 7.4.1 puts into `index.sqlite` for the shard and the offsets
it puts into the shard's `.tar.idx`. Runs in a worker process; only plain data crosses back.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field

from prep.errors import ShardError
from prep.index_format import split_member_name
from prep.tar_scan import HeaderWalker, check_not_compressed, open_shard

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
        check_not_compressed(shard, buffer[:8])
        walker = HeaderWalker(shard, buffer)
        result = ShardIndex(shard, tar_file_id)
        samples, parts, offsets, part_names = result.samples, result.parts, result.offsets, result.part_names
        names, starts, data_offsets, sizes = walker.scan()
        walker.verify_checksums()
        seen: dict[str, int] = {}
        key: str | None = None
        start = 0
        index = -1
        for name, member_start, offset_data, size in zip(names, starts, data_offsets, sizes, strict=True):
            slash = name.rfind("/")
            dot = name.find(".", slash + 1)
            if dot > slash + 1 and not name.startswith("__"):  # the common case, decided inline
                member_key, part = name[:dot], name[dot + 1 :]
            else:
                split = split_member_name(name)
                if split is None:
                    continue
                member_key, part = split
            if member_key != key:
                if key is not None:
                    samples.append((tar_file_id, key, index, start, member_start - start))
                if member_key in seen:
                    raise ShardError(
                        shard,
                        f"sample key {member_key!r} appears again after other samples (its first part is"
                        f" at byte {seen[member_key]}). energon needs all parts of a sample next to each"
                        " other and every key unique.",
                        offset=member_start,
                        advice="Re-write the shard with each sample's parts together (shardprep write does)"
                        " or give the sample a unique key.",
                    )
                key, start, index = member_key, member_start, index + 1
                seen[key] = start
                offsets.append(start)
            if len(part_names) < MAX_PART_NAMES:
                part_names.add(part)
            parts.append((tar_file_id, index, part, offset_data, size))
        if key is not None:
            samples.append((tar_file_id, key, index, start, walker.end - start))
        offsets.append(walker.end)
        return result
    finally:
        if hasattr(buffer, "close"):
            buffer.close()


def tar_index_bytes(offsets: array) -> bytes:
    """The `.tar.idx` contents: the offsets as little-endian uint64, as energon's TarIndexReader reads them."""
    data = array("Q", offsets)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes()
