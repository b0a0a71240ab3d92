"""Object storage: datasets in S3-compatible buckets, addressed as `s3://bucket/path` or `msc://profile/path`.

`address` parses the addresses (and tells them from local paths), `store` talks to the bucket (listing,
ranged and whole-object reads, uploads, multipart for big objects, deletes, aborts of incomplete multipart
uploads, each retried with backoff on transient failures), `ranged` reads an object's bytes a window at a
time for the tar header walk, and `upload` puts a dataset built locally into the bucket in the order that
keeps readers safe, after aborting what a killed run left of its uploads. botocore (and
multi-storage-client for `msc://` profiles) are imported only when a remote address is used: they are the
`s3` extra. The commands use this layer from `prep/prepare/remote.py`, `prep/write/remote.py` and
`prep/inspect/remote.py`.
"""
