"""shardprep's on-disk side: scan, index, write and inspect WebDataset shards for megatron-energon.

Imports neither torch nor megatron.energon, so the command line starts fast.
"""

__version__ = "0.1.0"
