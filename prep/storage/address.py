"""Remote dataset addresses: `s3://bucket/prefix` and `msc://profile/prefix`; anything else is a local path.

An address's path is read as energon's loader reads it (`prep.index.epath`), so an address names the
objects energon reads there, and a write never makes keys with empty, `.` or `..` parts
(`s3://b/x/../out` is `s3://b/out`).

>>> parse_address("s3://bucket/data/set/")
ObjectAddress(scheme='s3', authority='bucket', prefix='data/set')
>>> parse_address("msc://profile/a//b/./c/../d")
ObjectAddress(scheme='msc', authority='profile', prefix='a/b/d')
>>> parse_address("s3://arn:aws:s3:us-east-1:123456789012:accesspoint:ap/model@v2").prefix
'model@v2'
>>> str(parse_address("msc://profile/ds").child("shard-0.tar"))
'msc://profile/ds/shard-0.tar'
>>> parse_address("/data/set") is None
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from prep.errors import PrepError
from prep.index.epath import resolved_parts

#: The schemes a dataset address may have besides a plain path.
SCHEMES = ("s3", "msc")
#: A bucket name as botocore takes it (besides an access point's ARN, `arn:...`).
_BUCKET_NAME = re.compile(r"[A-Za-z0-9.\-_]{1,255}")
#: Credentials written into an address, `KEY:SECRET@` after its scheme (a secret key may hold `/`).
_CREDENTIALS = re.compile(r"^([A-Za-z0-9]+:/+)[^/@:]*:[^@]*@")


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


def misspelt_address(text: str) -> str | None:
    """The `s3://` or `msc://` address `text` looks meant as, where as written it is a local path: its
    scheme in capitals, or one slash after it (a local path folds `//` to `/`).

    >>> misspelt_address("S3://b/x"), misspelt_address("msc:/p/x"), misspelt_address("s3://b/x")
    ('s3://b/x', 'msc://p/x', None)
    """
    scheme, colon, rest = text.partition(":/")
    if is_remote(text) or not colon or scheme.lower() not in SCHEMES:
        return None
    return f"{scheme.lower()}://{rest.lstrip('/')}"


def parse_address(text: str) -> ObjectAddress | None:
    """The address `text` names, or None for a local path; a PrepError for a remote one without a bucket
    (or profile), with a bucket name S3 does not take, with credentials in it (masked in the message), or
    with a path that climbs above its top."""
    if not is_remote(text):
        return None
    scheme, _, rest = text.partition("://")
    authority, _, path = rest.partition("/")
    what = "bucket" if scheme == "s3" else "profile"
    if not authority:
        raise PrepError(f"{text} names no {what}: write it as {scheme}://{what.upper()}/PATH.")
    shown = without_credentials(text)
    # (a bucket's access point ARN has colons; a profile name is any text, credentials aside)
    misplaced = not is_bucket_name(authority) if scheme == "s3" else shown != text
    if misplaced:
        authority = shown.partition("://")[2].partition("/")[0]  # (a secret's `/` cut it short)
        rule = " (letters, digits, '.', '-' and '_')" if scheme == "s3" else ""
        raise PrepError(
            f"{shown}: {authority!r} is not a {what} name{rule}: write the address as"
            f" {scheme}://{what.upper()}/PATH.{_misplaced(authority, scheme)}"
        )
    parts = resolved_parts(path)
    if parts is None:
        raise PrepError(
            f"{text} climbs above the top of its {what} ('..'), which energon's loader refuses: write it as"
            f" {scheme}://{what.upper()}/PATH without it."
        )
    return ObjectAddress(scheme, authority, "/".join(parts))


def is_bucket_name(text: str) -> bool:
    """Whether botocore takes `text` as a bucket: a name or an access point's ARN.

    >>> is_bucket_name("my-bucket.v2"), is_bucket_name("host:9000"), is_bucket_name("s3:")
    (True, False, False)
    """
    return bool(_BUCKET_NAME.fullmatch(text)) or text.startswith("arn:")


def without_credentials(text: str) -> str:
    """`text`, an address as written, with the credentials written into it masked, for a message (the
    user's terminal and logs keep it).

    >>> without_credentials("s3://AKIA:wJalr/K7MD+bPx@bucket/ds"), without_credentials("s3://b/k:v@w")
    ('s3://***@bucket/ds', 's3://b/k:v@w')
    """
    return _CREDENTIALS.sub(r"\1***@", text, count=1)


def _misplaced(authority: str, scheme: str) -> str:
    """What of an address's bucket (or profile) part belongs elsewhere, in a sentence: credentials
    (`KEY:SECRET@bucket`, masked) or an endpoint's port (`host:9000`)."""
    if "@" in authority:
        if scheme == "msc":
            return " Credentials go in the profile's credentials_provider, not in the address."
        return " Credentials go in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, not in the address."
    if ":" in authority:
        return " An endpoint (host:port) goes in AWS_ENDPOINT_URL, not in the address."
    return ""


def is_plain_name(name: str) -> bool:
    """Whether `name`, an object's key relative to a dataset address, is one energon's loader reads back
    as that key, and one that stays inside a local folder it is mirrored or built in: no part of it empty
    (a leading, doubled or trailing `/`), `.` or `..` (energon drops or resolves those, as in an address).

    >>> [is_plain_name(name) for name in ("a/b.tar", "/b.tar", "a//b.tar", "a/../b.tar", "a/")]
    [True, False, False, False, False]
    """
    return resolved_parts(name) == name.split("/")


def enclosing_folders(names: Iterable[str]) -> dict[str, str]:
    """Each folder some of `names` (keys or paths, `/`-separated) are in, with the first name in it: what
    a bucket holds beside an object of the same name, and a local folder cannot.

    >>> enclosing_folders(["a/b/c.tar", "a/d.tar"])
    {'a': 'a/b/c.tar', 'a/b': 'a/b/c.tar'}
    """
    folders: dict[str, str] = {}
    for name in names:
        parts = name.split("/")
        for end in range(1, len(parts)):
            folders.setdefault("/".join(parts[:end]), name)
    return folders


def require_address(address: str | ObjectAddress) -> ObjectAddress:
    """`address` parsed; a PrepError if it is not an `s3://` or `msc://` address."""
    if isinstance(address, ObjectAddress):
        return address
    parsed = parse_address(address)
    if parsed is None:
        raise PrepError(f"{address} is not an s3:// or msc:// address.")
    return parsed
