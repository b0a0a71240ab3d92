"""`shardprep write`: raw data to prepared shards in one pass. See `prep.write.run`."""

from prep.write.options import WriteOptions
from prep.write.run import BadInputError, WriteProgress, WriteSummary, write, write_dataset
from prep.write.sources import DictSource, Record, Reject, Source, open_sources

__all__ = [
    "BadInputError",
    "DictSource",
    "Record",
    "Reject",
    "Source",
    "WriteOptions",
    "WriteProgress",
    "WriteSummary",
    "open_sources",
    "write",
    "write_dataset",
]
