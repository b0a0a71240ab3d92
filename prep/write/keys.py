"""Sample keys at write time: from the record, from a key field, or generated; checked against energon's
key rule and for duplicates.

A generated key is the record's number among the generated ones, zero-padded (`GENERATED_KEY`), so keys
sort in input order. A key given by the input must come back from energon as itself: not empty, no dot
after its last slash, not a `__meta__`-style name, and unique in the dataset. It must also stay inside
the folder it is joined to (`path_problem`): a key is a member name in the shards and a file name in an
aux folder, which energon reads as `folder / name`, so `..` or a leading `/` would leave the dataset.

>>> keys = SampleKeys(key_field=None)
>>> keys.key_of(None, {}), keys.key_of("a/b", {}), keys.key_of(None, {})
('000000000', 'a/b', '000000001')
"""

from __future__ import annotations

from prep.index.group import key_and_part

#: How a generated key is spelled (`GENERATED_KEY % number`).
GENERATED_KEY = "%09d"


class Rejected(Exception):
    """A record that cannot become a sample; the message says why (the write rejects it, by its policy)."""


def path_problem(path: str) -> str | None:
    """Why a relative path would not stay inside the folder it is joined to, or None: it starts with a
    slash, or a part of it is empty, `.` or `..`.

    >>> path_problem("a/b.jpg"), path_problem("a/../../b.jpg"), path_problem("/etc/b")
    (None, "it has a '..' part", 'it starts with a slash')
    """
    if path.startswith("/"):
        return "it starts with a slash"
    for part in path.split("/"):
        if part in ("", ".", ".."):
            return f"it has {f'a {part!r}' if part else 'an empty'} part"
    return None


def key_problem(key: str) -> str | None:
    """Why a sample key would not come back from energon as itself, or would name a file outside the
    dataset, or None.

    >>> key_problem("dir/0001"), key_problem("a.b")
    (None, "sample key 'a.b' would not survive energon's key rule (a key may not contain a dot after its last slash, start with __ or end with a slash)")
    >>> key_problem("../../escaped")
    "sample key '../../escaped' is not a relative path inside the dataset: it has a '..' part (a key names tar members and aux files, so it may not start with a slash or have an empty, '.' or '..' part)"
    """
    if not key:
        return "the sample key is empty"
    problem = path_problem(key)
    if problem is not None:
        return (
            f"sample key {key!r} is not a relative path inside the dataset: {problem} (a key names tar"
            " members and aux files, so it may not start with a slash or have an empty, '.' or '..' part)"
        )
    if key_and_part(f"{key}.x") != (key, "x"):
        return (
            f"sample key {key!r} would not survive energon's key rule (a key may not contain a dot after its"
            " last slash, start with __ or end with a slash)"
        )
    return None


class SampleKeys:
    """The key stage of a write: each record's key, or Rejected. Remembers every key given by the input,
    so a duplicate is refused, a given key included that is spelled as a generated one (generated keys
    cannot collide with each other, and are told by their number, so they need no memory).

    >>> keys = SampleKeys(key_field=None)
    >>> keys.key_of(None, {}), keys.key_of("000000001", {})
    ('000000000', '000000001')
    >>> keys.key_of(None, {})
    Traceback (most recent call last):
    prep.write.keys.Rejected: the generated sample key '000000001' is already the key of an earlier sample (give every sample its own key, or none so that all are generated)
    """

    def __init__(self, key_field: str | None) -> None:
        self.key_field = key_field
        self.seen: set[str] = set()
        self.generated = 0

    def key_of(self, key: str | None, fields: dict) -> str:
        """The key of a record whose source gave `key` (or None) and whose fields are `fields`."""
        if key is None and self.key_field is not None:
            value = fields.get(self.key_field)
            if value is None:
                raise Rejected(f"no key field {self.key_field!r}")
            key = str(value)
        if key is None:
            self.generated += 1
            key = GENERATED_KEY % (self.generated - 1)
            if key in self.seen:
                raise Rejected(
                    f"the generated sample key {key!r} is already the key of an earlier sample{_ADVICE}"
                )
            return key
        problem = key_problem(key)
        if problem is None and key in self.seen:
            problem = f"duplicate sample key {key!r}"
        elif problem is None and (number := _generated_number(key)) is not None and number < self.generated:
            problem = f"sample key {key!r} is already the generated key of an earlier sample{_ADVICE}"
        if problem:
            raise Rejected(problem)
        self.seen.add(key)
        return key


_ADVICE = " (give every sample its own key, or none so that all are generated)"


def _generated_number(key: str) -> int | None:
    """The number whose generated key `key` is, or None if no generated key is spelled so."""
    if len(key) > 30 or not (key.isascii() and key.isdigit()):
        return None
    number = int(key)
    return number if GENERATED_KEY % number == key else None
