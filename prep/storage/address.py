"""Remote dataset addresses: `s3://bucket/prefix` and `msc://profile/prefix`; anything else is a local path.

>>> parse_address("s3://bucket/data/set/")
ObjectAddress(scheme='s3', authority='bucket', prefix='data/set')
>>> str(parse_address("msc://profile/ds").child("shard-0.tar"))
'msc://profile/ds/shard-0.tar'
>>> parse_address("/data/set") is None
True
"""

from __future__ import annotations

from dataclasses import dataclass

from prep.errors import PrepError

#: The schemes a dataset address may have besides a plain path.
SCHEMES = ("s3", "msc")


@dataclass(frozen=True)
class ObjectAddress:
    """A place in object storage: the bucket (`s3`) or MSC profile (`msc`), and a key prefix inside it
    (no leading or trailing slash; "" for the top)."""

    scheme: str
    authority: str
    prefix: str

    def key(self, name: str) -> str:
        """The key (relative to the bucket or the profile's base path) of `name` below this address."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, name: str) -> ObjectAddress:
        return ObjectAddress(self.scheme, self.authority, self.key(name).strip("/"))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}/{self.prefix}"


def is_remote(text: object) -> bool:
    """Whether `text` is an `s3://` or `msc://` address rather than a local path."""
    return isinstance(text, str) and text.partition("://")[0] in SCHEMES and "://" in text


def parse_address(text: str) -> ObjectAddress | None:
    """The address `text` names, or None for a local path; a PrepError for a remote one without a bucket."""
    if not is_remote(text):
        return None
    scheme, _, rest = text.partition("://")
    authority, _, prefix = rest.partition("/")
    if not authority:
        what = "bucket" if scheme == "s3" else "profile"
        raise PrepError(f"{text} names no {what}: write it as {scheme}://{what.upper()}/PATH.")
    return ObjectAddress(scheme, authority, prefix.strip("/"))


def require_address(address: str | ObjectAddress) -> ObjectAddress:
    """`address` parsed; a PrepError if it is not an `s3://` or `msc://` address."""
    if isinstance(address, ObjectAddress):
        return address
    parsed = parse_address(address)
    if parsed is None:
        raise PrepError(f"{address} is not an s3:// or msc:// address.")
    return parsed
