"""Assign shards to splits (train/val/test or named parts), as energon's split.yaml records them."""

from __future__ import annotations

import random
import re

from prep.brace import expand
from prep.errors import PrepError

#: The split names a ratio assigns, in order.
RATIO_SPLITS = ("train", "val", "test")


def parse_split_ratio(text: str) -> list[tuple[str, float]]:
    """`"8,1,1"` or `"0.8, 0.1, 0.1"` -> [("train", 8.0), ("val", 1.0), ("test", 1.0)].

    >>> parse_split_ratio("8,1,1")
    [('train', 8.0), ('val', 1.0), ('test', 1.0)]
    """
    try:
        values = [float(piece.strip()) for piece in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 3 or any(value < 0 for value in values) or sum(values) <= 0:
        raise PrepError(
            f"Invalid split ratio {text!r}: give three non-negative numbers for train, val and test,"
            ' e.g. "8,1,1" or "0.8,0.1,0.1".'
        )
    return list(zip(RATIO_SPLITS, values, strict=True))


def parse_split_parts(specs: list[str] | tuple[str, ...]) -> list[tuple[str, str]]:
    """`["train:shards/train-{0..9}.tar", ...]` -> [(name, pattern), ...]."""
    parts = []
    for spec in specs:
        name, colon, pattern = spec.partition(":")
        if not colon or not name:
            raise PrepError(f"Invalid --split-parts {spec!r}: expected NAME:REGEX, e.g. 'train:train/.*'.")
        parts.append((name, pattern))
    return parts


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
        try:
            regexes = [re.compile(expanded) for expanded in expand([pattern])]
        except re.error as error:
            raise PrepError(f"Invalid --split-parts regex {pattern!r} for split {name!r}: {error}.") from None
        splits[name] = [shard for shard in shards if any(regex.match(shard) for regex in regexes)]
    return splits
