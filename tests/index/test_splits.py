"""Shards to splits by ratio, with energon's arithmetic."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import PrepError
from prep.index.splits import parse_split_ratio, split_by_ratio


def energon_ratio_split(shards: list[str], ratio: list[float], shuffle: bool) -> dict[str, list[str]]:
    """energon's own arithmetic, restated from its prepare: normalise, optionally shuffle, cut cumulatively."""
    total = sum(ratio)
    order = list(shards)
    if shuffle:
        random.Random(42).shuffle(order)
    out, cumulative, start = {}, 0.0, 0
    for name, value in zip(("train", "val", "test"), ratio, strict=True):
        cumulative += value / total
        end = int(len(order) * cumulative)
        out[name], start = order[start:end], end
    return out


@given(
    st.integers(0, 60),
    st.lists(st.floats(0, 10), min_size=3, max_size=3).filter(lambda r: sum(r) > 0),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_ratio_split_cuts_whole_shards_like_energon(count: int, ratio: list[float], shuffle: bool) -> None:
    shards = [f"{i:04d}.tar" for i in range(count)]
    ours = split_by_ratio(
        shards, list(zip(("train", "val", "test"), ratio, strict=True)), 42 if shuffle else None
    )
    assert ours == energon_ratio_split(shards, ratio, shuffle)


def test_a_ratio_of_zeros_is_told_what_is_missing() -> None:
    """`0,0,0` is three finite non-negative numbers: the message says they may not all be zero."""
    with pytest.raises(PrepError, match="non-negative numbers for train, val and test, not all zero"):
        parse_split_ratio("0,0,0")
