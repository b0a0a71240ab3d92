"""`shardprep mount`: a read-only FUSE filesystem over a prepared dataset, speaking the kernel's protocol
itself. `wire` is the protocol as data, `device` mounts and unmounts, `session` answers the kernel from
any `nodes.Tree`, `tree` is the dataset's tree of views, `serve` runs it all."""
