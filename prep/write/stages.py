"""A record through the key, split and parts stages of a write, in that order: the one sequence that the
record loop (`run`) and the block encoder (`segments`) both run.

    >>> from prep.write.options import WriteOptions
    >>> from prep.write.sources import DictSource
    >>> source = DictSource([{"__key__": "a", "txt": "hi"}])
    >>> record = next(iter(source.records()))
    >>> staged = stage_record(source, record, SampleKeys(None), WriteOptions())
    >>> staged.key, staged.split, staged.parts
    ('a', 'train', [('txt', b'hi')])
"""

from __future__ import annotations

from typing import NamedTuple

from prep.write.keys import SampleKeys
from prep.write.options import WriteOptions
from prep.write.parts import Parts, record_parts
from prep.write.sources import Record, Source
from prep.write.splits import group_of, split_for


class StagedRecord(NamedTuple):
    """A record ready for the sink: its key, its group and split, its parts and the media split off."""

    key: str
    group: str
    split: str
    parts: Parts
    media: Parts


def stage_record(source: Source, record: Record, keys: SampleKeys, options: WriteOptions) -> StagedRecord:
    """Key, split and parts of `record`; raises `prep.write.keys.Rejected` for a record that cannot be a
    sample, saying why."""
    key = keys.key_of(record.key, record.fields)
    group = group_of(record.fields, key, options.group_by)
    split = (
        split_for(group, options.split_ratio, options.seed) if options.split_ratio is not None else "train"
    )
    parts, media = record_parts(source, record, key, options)
    return StagedRecord(key, group, split, parts, media)
