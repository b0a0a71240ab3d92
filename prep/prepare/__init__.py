"""`shardprep prepare`: index existing WebDataset tars into energon's `.nv-meta`. See `prep.prepare.run`."""

from prep.prepare.run import PrepareOptions, prepare, prepare_dataset

__all__ = ["PrepareOptions", "prepare", "prepare_dataset"]
