"""Sample-level splits at write time: each group (or sample) goes to a split chosen by a seeded hash.

The split depends only on the seed and the group's value, never on the order of the input or on what
else is in it, so a group can never end up in two splits and a run is reproducible. With
`--group-contiguous` the samples wait in a `GroupSpool` until each group can be written whole.

    >>> ratio = [("train", 8.0), ("val", 1.0), ("test", 1.0)]
    >>> split_for("user-17", ratio, seed=0) == split_for("user-17", ratio, seed=0)
    True
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Iterator
from pathlib import Path

from prep.write.keys import Rejected


def split_for(group: str, ratio: list[tuple[str, float]], seed: int) -> str:
    """The split of a group: cut a uniform hash of (seed, group) by the cumulative normalised ratios."""
    digest = hashlib.blake2b(f"{seed}\0{group}".encode(), digest_size=8).digest()
    point = int.from_bytes(digest, "little") / 2**64
    total = sum(value for _, value in ratio)
    cumulative = 0.0
    chosen = ratio[0][0]
    for name, value in ratio:
        if value <= 0:
            continue
        chosen = name
        cumulative += value / total
        if point < cumulative:
            return name
    return chosen


def group_of(fields: dict, key: str, group_by: str | None) -> str:
    """The group a record's sample belongs to, as the text `split_for` hashes: the value of its `group_by`
    field (a list or an object as JSON with sorted keys, so that equal values make one group), or its
    own key.

    >>> group_of({"user": [1, {"b": 2, "a": 1}]}, "k", "user"), group_of({"user": 17}, "k", "user")
    ('[1, {"a": 1, "b": 2}]', '17')
    """
    if group_by is None:
        return key
    if group_by not in fields:
        raise Rejected(f"no field {group_by!r} to group by")
    group = fields[group_by]
    if isinstance(group, bytes):
        return group.decode("utf-8", "replace")
    if isinstance(group, list | dict):
        try:
            return json.dumps(group, sort_keys=True, ensure_ascii=False, default=str)
        except (TypeError, ValueError) as error:
            raise Rejected(f"the value of {group_by!r} cannot be a group ({error})") from None
    return str(group)


class GroupSpool:
    """Holds encoded samples on disk by group so each group can be written whole and contiguously.

    Samples are appended to one scratch file at `path` (in the run's staging area); only their offsets
    stay in memory. `groups()` gives the groups back in order of first appearance, each with its samples
    in input order.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = open(path, "w+b")  # noqa: SIM115 (closed by close)
        self.index: dict[str, tuple[str, list[tuple[int, int]]]] = {}
        self.end = 0

    def add(self, group: str, split: str, sample: tuple[str, list[tuple[str, bytes]]]) -> None:
        data = pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL)
        self.file.write(data)
        self.index.setdefault(group, (split, []))[1].append((self.end, len(data)))
        self.end += len(data)

    def groups(self) -> Iterator[tuple[str, str, list[tuple[str, list[tuple[str, bytes]]]]]]:
        """(group, split, samples) for every group, in order of first appearance."""
        self.file.flush()
        for group, (split, spans) in self.index.items():
            samples = []
            for offset, length in spans:
                self.file.seek(offset)
                samples.append(pickle.loads(self.file.read(length)))
            yield group, split, samples

    def close(self) -> None:
        self.file.close()
        self.path.unlink(missing_ok=True)
