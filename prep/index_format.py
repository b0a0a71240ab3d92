"""The energon 7.4.1 on-disk index format, written down as data.

Everything that names a file in `.nv-meta`, a table, a column or a byte layout lives here, so the
writers and readers of the index agree by construction.
"""

from __future__ import annotations

import re
import struct

#: The release of megatron-energon whose prepared-dataset format shardprep writes.
ENERGON_FORMAT_VERSION = "7.4.1"

META_DIR = ".nv-meta"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"  # legacy name energon still reads
SPLIT_YAML = "split.yaml"
DATASET_YAML = "dataset.yaml"
INDEX_SQLITE = "index.sqlite"
INDEX_UUID = "index.uuid"
SAMPLE_LOADER_PY = "sample_loader.py"

#: Suffix of the per-shard offset file, replacing the shard's own suffix (`a.tgz` -> `a.tar.idx`).
TAR_INDEX_SUFFIX = ".tar.idx"
#: One little-endian uint64 per sample start, then one for the end of the last sample.
TAR_INDEX_ENTRY = struct.Struct("<Q")

#: Shard files energon picks up when it globs the dataset folder.
SHARD_SUFFIXES = (".tar", ".tgz")

#: energon's key rule: key = directory + basename up to its first dot; part = the rest of the basename.
SAMPLE_NAME_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
#: Members whose name starts with `__something__` (a file or a folder) are metadata, not sample parts.
SKIP_META_RE = re.compile(r"__[^/]*__($|/)")

SAMPLES_TABLE = """CREATE TABLE samples (
    tar_file_id INTEGER NOT NULL,
    sample_key TEXT NOT NULL UNIQUE,
    sample_index INTEGER NOT NULL,
    byte_offset INTEGER,
    byte_size INTEGER
)"""

SAMPLE_PARTS_TABLE = """CREATE TABLE sample_parts (
    tar_file_id INTEGER,
    sample_index INTEGER,
    part_name TEXT,
    content_byte_offset INTEGER,
    content_byte_size INTEGER
)"""

#: Secondary indexes, created after the bulk insert (cheaper than maintaining them row by row).
SECONDARY_INDEXES = (
    "CREATE INDEX idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    "CREATE INDEX idx_sample_parts_full ON sample_parts"
    "(tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size)",
)

def tar_index_name(shard_name: str) -> str:
    """The `.tar.idx` file name energon expects beside a shard.

    >>> tar_index_name("parts/shard-000.tar"), tar_index_name("a.tgz")
    ('parts/shard-000.tar.idx', 'a.tar.idx')
    """
    stem, dot, suffix = shard_name.rpartition(".")
    if not dot or "/" in suffix:
        return shard_name + TAR_INDEX_SUFFIX
    return stem + TAR_INDEX_SUFFIX


def split_member_name(name: str) -> tuple[str, str] | None:
    """The (sample key, part name) energon derives from a member name, or None if it skips the member.

    Decided by string search in the common case; a base name that starts with a dot goes to energon's
    regex itself, whose backtracking gives surprising but binding answers (`d/.x.y` -> key `d/`).

    >>> split_member_name("a.b/000001.seg.0.json")
    ('a.b/000001', 'seg.0.json')
    >>> split_member_name("__meta__/x.json") is None, split_member_name("README") is None
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
