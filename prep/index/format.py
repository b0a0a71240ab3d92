"""The energon 7.4.1 on-disk index format, written down as data.

Everything that names a file in `.nv-meta`, a table, a column or a byte layout lives here, so the
writers and readers of the index agree by construction. How members become samples (the key rule) is
`prep.index.group`; what the files say is read and written by `prep.index.meta` and `prep.index.sqlite`.
"""

from __future__ import annotations

import struct

#: The release of megatron-energon whose prepared-dataset format shardprep writes.
ENERGON_FORMAT_VERSION = "7.4.1"

META_DIR = ".nv-meta"
INFO_JSON = ".info.json"
INFO_YAML = ".info.yaml"  # legacy name energon still reads
SPLIT_YAML = "split.yaml"
SPLIT_JSON = "split.json"  # energon reads it when split.yaml is missing (`meta.split_file_name`)
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

#: Media metadata (`--media-metadata-by-*`): one row per media part, keyed `<sample key>.<part>`.
MEDIA_METADATA_TABLE = """CREATE TABLE IF NOT EXISTS media_metadata (
    entry_key TEXT PRIMARY KEY,
    metadata_type TEXT NOT NULL,
    metadata_json TEXT NOT NULL
)"""

#: The media filters the metadata was made with (strategy, comma-joined patterns).
MEDIA_FILTERS_TABLE = """CREATE TABLE IF NOT EXISTS media_filters (
    filter_id INTEGER PRIMARY KEY AUTOINCREMENT,
    strategy TEXT NOT NULL,
    patterns TEXT,
    created_at_utc TEXT DEFAULT CURRENT_TIMESTAMP,
    UNIQUE(strategy, patterns)
)"""

#: Secondary indexes, created after the bulk insert (cheaper than maintaining them row by row).
SECONDARY_INDEXES = (
    "CREATE INDEX idx_samples_by_tar_and_idx ON samples(tar_file_id, sample_index)",
    "CREATE INDEX idx_sample_parts_seq ON sample_parts(tar_file_id, sample_index, content_byte_offset)",
    "CREATE INDEX idx_sample_parts_full ON sample_parts"
    "(tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size)",
)

#: The split names a ratio assigns, in order.
RATIO_SPLITS = ("train", "val", "test")

# Polylithic datasets (`shardprep write --media-column`): a primary dataset whose samples name their
# media in an auxiliary dataset, tied together by a MetadatasetV2 file.
#: The primary sample's part that maps each media field to its file name in the auxiliary dataset.
AUX_PART = "aux.json"
#: The name the metadataset gives the auxiliary dataset; a cooker receives its file store under it.
AUX_NAME = "media"
METADATASET_YAML = "metadataset.yaml"


def tar_index_name(shard_name: str) -> str:
    """The `.tar.idx` file name energon expects beside a shard.

    >>> tar_index_name("parts/shard-000.tar"), tar_index_name("a.tgz")
    ('parts/shard-000.tar.idx', 'a.tar.idx')
    """
    stem, dot, suffix = shard_name.rpartition(".")
    if not dot or "/" in suffix:
        return shard_name + TAR_INDEX_SUFFIX
    return stem + TAR_INDEX_SUFFIX
