"""The tar format's bytes: where header fields lie (`fields`), reading them (`header`), walking a shard's
headers (`scan`) and making them (`write`). Nothing here knows about samples or energon."""
