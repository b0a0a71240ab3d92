"""Members to samples: energon's key rule, and one shard's index rows from its tar headers.

energon names a sample by its member paths up to the first dot of the file name (`a/0001.seg.json` is
part `seg.json` of sample `a/0001`), skips members it cannot split that way and `__meta__`-style
metadata, and needs all parts of a sample next to each other. `key_and_part` is that rule, the only copy
of it: the scanner, the writer, the folder source, verify and the mount all ask it. `shard_rows` scans a
shard (`prep.tar.scan`) and groups its members into the rows energon 7.4.1 would index.
"""

from __future__ import annotations

import re
from array import array
from typing import TYPE_CHECKING

from prep.errors import ShardError
from prep.index.rows import ShardRows

if TYPE_CHECKING:
    import numpy as np

    from prep.tar.scan import HeaderWalker, Names

#: energon's key rule: key = directory + basename up to its first dot; part = the rest of the basename.
SAMPLE_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Members whose name starts with `__something__` (a file or a folder) are metadata, not sample parts.
SKIP_META_RE = re.compile(r"__[^/]*__($|/)")


def key_and_part(name: str) -> tuple[str, str] | None:
    """The (sample key, part name) energon derives from a member name, or None if it skips the member.

    Decided by string search in the common case; a base name that starts with a dot goes to energon's
    regex itself, whose backtracking gives surprising but binding answers (`d/.x.y` -> key `d/`).

    >>> key_and_part("a.b/000001.seg.0.json"), key_and_part("__x.txt")
    (('a.b/000001', 'seg.0.json'), ('__x', 'txt'))
    >>> key_and_part("__meta__/x.json") is None, key_and_part("README") is None
    (True, True)
    """
    if name.startswith("__") and SKIP_META_RE.match(name):
        return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1:
        return name[:dot], name[dot + 1 :]
    if dot < 0:
        return None
    match = SAMPLE_NAME_RE.match(name)
    return (match.group(1), match.group(2)) if match else None


def shard_rows(path: str, shard: str, tar_file_id: int) -> ShardRows:
    """Scan one shard's headers and build its index rows, column by column.

    `path` is the file to read, `shard` its name relative to the dataset root (used in rows and errors).
    Raises ShardError for anything energon could not load correctly.
    """
    # Imported here: the scan needs numpy, the process that only receives and inserts rows does not.
    from prep.tar.fields import BLOCK
    from prep.tar.scan import HeaderWalker, check_not_compressed, open_shard

    buffer = open_shard(path, shard)
    try:
        check_not_compressed(shard, buffer[:BLOCK])
        return walked_rows(HeaderWalker(shard, buffer), shard, tar_file_id)
    finally:
        if hasattr(buffer, "close"):
            buffer.close()


def walked_rows(walker: HeaderWalker, shard: str, tar_file_id: int) -> ShardRows:
    """The index rows of the shard `walker` walks (a file's `HeaderWalker`, or a bucket object's
    `RangedHeaderWalker`): every header checked, members grouped into samples. Raises ShardError."""
    from prep.tar.scan import decoded_names

    names, starts, data_offsets, sizes = walker.scan_table()
    walker.verify_checksums()
    rows = ShardRows(
        shard, tar_file_id, end=walker.end, end_marker=walker.end_marker, after_end=walker.data_after_end()
    )
    if not _group_vectorised(rows, names, starts, data_offsets, sizes):
        _group_one_by_one(rows, decoded_names(names), starts, data_offsets, sizes)
    return rows


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
    rows: ShardRows, names: list[str], starts: array, data_offsets: array, sizes: array
) -> None:
    """Group members into samples by energon's key rule, member by member (any name energon accepts)."""
    shard = rows.shard
    seen: dict[str, int] = {}
    keys: list[str] = []
    shared_names: dict[str, str] = {}
    key: str | None = None
    index = -1
    for name, member_start, offset_data, size in zip(names, starts, data_offsets, sizes, strict=True):
        member = key_and_part(name)
        if member is None:
            continue
        member_key, part = member
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
    if not starts:
        return array("q")
    sizes = array("q", starts[1:])
    sizes.append(end)
    for i, start in enumerate(starts):
        sizes[i] -= start
    return sizes


def _group_vectorised(
    rows: ShardRows, names: Names, starts: array, data_offsets: array, sizes: array
) -> bool:
    """The same grouping with numpy string operations, when every name takes energon's plain path
    (a dot in a base name that does not start with one, no `__meta__` prefix). False: not applicable.

    Where it applies to a list of names it empties it, to hold a big shard's names once rather than
    twice."""
    import numpy as np

    from prep.tar.scan import int_array

    if not len(names) or not hasattr(np, "strings") or not hasattr(np.strings, "slice"):
        return False
    # UTF-8 bytes: a quarter of numpy's str size, and "/" and "." are single bytes that never occur inside
    # a multi-byte character, so positions found in bytes cut the names where the characters would.
    table = np.array([name.encode() for name in names]) if isinstance(names, list) else names
    slash = np.strings.rfind(table, b"/")
    dot = np.strings.find(table, b".", slash + 1)
    if (dot <= slash + 1).any() or np.strings.startswith(table, b"__").any():
        return False
    if isinstance(names, list):
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

    from prep.tar.scan import int_array, nul_joined

    raw = texts.view(np.uint8).reshape(len(texts), texts.dtype.itemsize)
    kept = raw != 0
    text = nul_joined(raw, kept)
    # a character starts at every byte but the continuation bytes 0b10xxxxxx; each element's NUL is one more
    characters = (kept & ((raw & 0xC0) != 0x80)).sum(axis=1) + 1
    return text, int_array(np.cumsum(characters) - 1)
