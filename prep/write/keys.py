"""Sample keys at write time: from the record, from a key field, or generated; checked against energon's
key rule and for duplicates.

A generated key is the record's number among the generated ones, zero-padded (`GENERATED_KEY`), so keys
sort in input order. A key given by the input must come back from energon as itself: not empty, no dot
after its last slash, not a `__meta__`-style name, and unique in the dataset.

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


def key_problem(key: str) -> str | None:
    """Why a sample key would not come back from energon as itself, or None.

    >>> key_problem("dir/0001"), key_problem("a.b")
    (None, "sample key 'a.b' would not survive energon's key rule (a key may not contain a dot after its last slash, start with __ or end with a slash)")
    """
    if not key:
        return "the sample key is empty"
    if key_and_part(f"{key}.x") != (key, "x"):
        return (
            f"sample key {key!r} would not survive energon's key rule (a key may not contain a dot after its"
            " last slash, start with __ or end with a slash)"
        )
    return None


class SampleKeys:
    """The key stage of a write: each record's key, or Rejected. Remembers every key given by the input,
    so a duplicate is refused (generated keys cannot collide with each other)."""

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
            return GENERATED_KEY % (self.generated - 1)
        problem = key_problem(key) or (f"duplicate sample key {key!r}" if key in self.seen else None)
        if problem:
            raise Rejected(problem)
        self.seen.add(key)
        return key
