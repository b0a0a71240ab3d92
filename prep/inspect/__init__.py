"""`shardprep info`, `verify` and `preview`: look inside any prepared dataset, ours or energon's."""
