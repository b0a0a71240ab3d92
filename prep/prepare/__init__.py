"""`shardprep prepare`: index existing WebDataset tars into energon's `.nv-meta`. See `prep.prepare.run`."""

from prep.prepare.run import Prepared, PrepareOptions, prepare, prepare_dataset

__all__ = ["PrepareOptions", "Prepared", "prepare", "prepare_dataset"]
