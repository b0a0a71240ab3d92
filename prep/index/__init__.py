"""The on-disk index of a prepared dataset, energon 7.4.1's format: the format as data (`format`), one
shard's rows (`rows`) grouped by energon's key rule (`group`), `index.sqlite` written and read (`sqlite`,
`columns`), the small files of `.nv-meta` (`meta`, `dataset_yaml`, `splits`), finding shards
(`shard_list`), a prepared dataset opened for reading (`dataset`), and all-or-nothing runs (`staging`)."""
