"""Splits: the train/val/test ratio as users give it, and whole shards assigned to splits as energon's
`split.yaml` records them (`prepare`); `write` cuts the same ratio per sample (`prep.write.splits`).

Two ways to assign shards, as `energon prepare` offers them: a ratio cuts the shard list (shuffled with
`random.Random(42)` unless told otherwise) by cumulative normalised ratios, or each named split takes the
shards its brace-expanded regex matches at their start (`--split-parts NAME:REGEX`).

>>> SplitSpec(ratio=parse_split_ratio("2,1,1"), shuffle_seed=None).assign(["a", "b", "c", "d"])
{'train': ['a', 'b'], 'val': ['c'], 'test': ['d']}
"""

from __future__ import annotations

import math
import random
import re
from typing import NamedTuple

from prep.errors import PrepError
from prep.index.format import RATIO_SPLITS
from prep.index.meta import expand

#: energon shuffles shards with this seed before cutting them by ratio (`--shuffle-tars` off: no shuffle).
SHUFFLE_SEED = 42


def parse_split_ratio(text: str) -> list[tuple[str, float]]:
    """`"8,1,1"` or `"0.8, 0.1, 0.1"` -> [("train", 8.0), ("val", 1.0), ("test", 1.0)].

    >>> parse_split_ratio("8,1,1")
    [('train', 8.0), ('val', 1.0), ('test', 1.0)]
    >>> parse_split_ratio("inf,1,1")
    Traceback (most recent call last):
    prep.errors.PrepError: Invalid split ratio 'inf,1,1': give three finite non-negative numbers for train, val and test, not all zero, e.g. "8,1,1" or "0.8,0.1,0.1".
    """
    try:
        values = [float(piece.strip()) for piece in text.split(",")]
    except ValueError:
        values = []
    if (
        len(values) != 3
        or not all(math.isfinite(value) and value >= 0 for value in values)
        or not 0 < sum(values) < math.inf
    ):
        raise PrepError(
            f"Invalid split ratio {text!r}: give three finite non-negative numbers for train, val and test,"
            ' not all zero, e.g. "8,1,1" or "0.8,0.1,0.1".'
        )
    return list(zip(RATIO_SPLITS, values, strict=True))


def parse_split_parts(specs: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """`["train:shards/train-{0..9}.tar", ...]` -> [(name, pattern), ...]."""
    parts = []
    for spec in specs:
        name, colon, pattern = spec.partition(":")
        if not colon or not name:
            raise PrepError(f"Invalid --split-parts {spec!r}: expected NAME:REGEX, e.g. 'train:train/.*'.")
        _split_regexes(name, pattern)  # a bad regex is refused before any shard is indexed
        parts.append((name, pattern))
    return parts


def _split_regexes(name: str, pattern: str) -> list[re.Pattern]:
    """The regexes of one --split-parts pattern, brace-expanded as energon expands it; PrepError if one
    does not compile."""
    try:
        return [re.compile(expanded) for expanded in expand([pattern])]
    except (re.error, ValueError) as error:  # ValueError: braceexpand's unbalanced braces
        raise PrepError(f"Invalid --split-parts regex {pattern!r} for split {name!r}: {error}.") from None


def split_by_ratio(
    shards: list[str], ratio: list[tuple[str, float]], shuffle_seed: int | None
) -> dict[str, list[str]]:
    """Cut the (optionally shuffled) shard list by cumulative normalised ratios: whole shards per split.

    The arithmetic follows energon's exactly, so the same shards land in the same split.
    """
    total = sum(value for _, value in ratio)
    order = list(shards)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(order)
    splits: dict[str, list[str]] = {}
    cumulative = 0.0
    start = 0
    for name, value in ratio:
        cumulative += value / total
        end = int(len(order) * cumulative)
        splits[name] = order[start:end]
        start = end
    return splits


def split_by_patterns(shards: list[str], patterns: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Each split takes the shards that a brace-expanded regex matches at their start (`re.match`)."""
    splits: dict[str, list[str]] = {}
    for name, pattern in patterns:
        regexes = _split_regexes(name, pattern)
        splits[name] = [shard for shard in shards if any(regex.match(shard) for regex in regexes)]
    return splits


class SplitSpec(NamedTuple):
    """How shards are assigned to splits: by ratio (whole shards, optionally shuffled) or by patterns."""

    ratio: list[tuple[str, float]] | None = None
    patterns: list[tuple[str, str]] | None = None
    shuffle_seed: int | None = SHUFFLE_SEED

    def assign(self, shards: list[str]) -> dict[str, list[str]]:
        if self.patterns is not None:
            return split_by_patterns(shards, self.patterns)
        if self.ratio is not None:
            return split_by_ratio(shards, self.ratio, self.shuffle_seed)
        raise PrepError("A split is needed: give --split-ratio (e.g. 8,1,1) or --split-parts NAME:REGEX.")
