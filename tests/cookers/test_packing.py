"""Packing plans over lengths: every token placed once, no bin over the sequence length, deterministic."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cookers.packed_tokens import pack_token_arrays
from cookers.packing import (
    ALGORITHMS,
    OverlongDocumentError,
    PackPlan,
    plan_packs,
    plan_packs_in_windows,
)

lengths_strategy = st.lists(st.integers(min_value=0, max_value=90), min_size=0, max_size=120)
seq_lengths = st.integers(min_value=1, max_value=64)


def covered_ranges(plan: PackPlan) -> dict[int, list[tuple[int, int]]]:
    ranges: dict[int, list[tuple[int, int]]] = {}
    for doc, start, stop in zip(
        plan.documents.tolist(), plan.starts.tolist(), plan.stops.tolist(), strict=True
    ):
        ranges.setdefault(doc, []).append((start, stop))
    return {doc: sorted(r) for doc, r in ranges.items()}


def naive_best_fit_bin_count(sizes: list[int], capacity: int) -> int:
    rooms: list[int] = []
    for size in sorted(sizes, reverse=True):
        fitting = [i for i, room in enumerate(rooms) if room >= size]
        if fitting:
            best = min(fitting, key=lambda i: rooms[i])
            rooms[best] -= size
        else:
            rooms.append(capacity - size)
    return len(rooms)


def naive_first_fit_bins(sizes: list[int], capacity: int) -> list[int]:
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    rooms: list[int] = []
    bin_of = [0] * len(sizes)
    for i in order:
        b = next((b for b, room in enumerate(rooms) if room >= sizes[i]), len(rooms))
        if b == len(rooms):
            rooms.append(capacity)
        rooms[b] -= sizes[i]
        bin_of[i] = b
    return bin_of


@settings(max_examples=150, deadline=None)
@given(lengths=lengths_strategy, seq_length=seq_lengths, algorithm=st.sampled_from(ALGORITHMS))
def test_chunked_packing_places_every_token_exactly_once_and_no_bin_overflows(lengths, seq_length, algorithm):
    plan = plan_packs(lengths, seq_length, algorithm, overlong="chunk")
    assert (plan.bin_lengths() <= seq_length).all()
    ranges = covered_ranges(plan)
    assert sorted(ranges) == list(range(len(lengths)))
    for doc, pieces in ranges.items():
        position = 0
        for start, stop in pieces:
            assert start == position, "a token is lost or duplicated"
            position = stop
        assert position == lengths[doc]
    assert int(plan.piece_lengths().sum()) == sum(lengths)


@settings(max_examples=100, deadline=None)
@given(
    lengths=lengths_strategy, seq_length=seq_lengths, algorithm=st.sampled_from(("bfd", "ffd", "next_fit"))
)
def test_truncate_keeps_each_document_once_with_its_first_tokens(lengths, seq_length, algorithm):
    plan = plan_packs(lengths, seq_length, algorithm, overlong="truncate")
    assert sorted(plan.documents.tolist()) == list(range(len(lengths)))
    for doc, pieces in covered_ranges(plan).items():
        assert pieces == [(0, min(lengths[doc], seq_length))]
    assert (plan.bin_lengths() <= seq_length).all()


@settings(max_examples=100, deadline=None)
@given(
    lengths=lengths_strategy,
    seq_length=seq_lengths,
    algorithm=st.sampled_from(ALGORITHMS),
    seed=st.none() | st.integers(0, 2**32 - 1),
)
def test_the_same_input_and_seed_give_the_same_packs(lengths, seq_length, algorithm, seed):
    first = plan_packs(lengths, seq_length, algorithm, overlong="chunk", seed=seed)
    second = plan_packs(list(lengths), seq_length, algorithm, overlong="chunk", seed=seed)
    for a, b in zip(
        (first.documents, first.starts, first.stops, first.bin_offsets),
        (second.documents, second.starts, second.stops, second.bin_offsets),
        strict=True,
    ):
        assert np.array_equal(a, b)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), max_size=60), seq_length=st.integers(40, 80))
def test_best_fit_decreasing_opens_as_many_bins_as_the_textbook_algorithm(lengths, seq_length):
    plan = plan_packs(lengths, seq_length, "bfd")
    assert plan.num_bins == naive_best_fit_bin_count(lengths, seq_length)


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), max_size=60), seq_length=st.integers(40, 80))
def test_first_fit_decreasing_groups_documents_like_the_textbook_algorithm(lengths, seq_length):
    plan = plan_packs(lengths, seq_length, "ffd")
    expected_bin = naive_first_fit_bins(lengths, seq_length)
    groups = {frozenset(docs) for docs in plan.bins()}
    expected: dict[int, set[int]] = {}
    for doc, b in enumerate(expected_bin):
        expected.setdefault(b, set()).add(doc)
    assert groups == {frozenset(docs) for docs in expected.values()}


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_strategy, seq_length=seq_lengths)
def test_concat_fills_every_bin_but_the_last_and_keeps_the_stream_order(lengths, seq_length):
    plan = plan_packs(lengths, seq_length, "concat")
    total = sum(lengths)
    assert plan.num_bins == (math.ceil(total / seq_length) if total else min(len(lengths), 1))
    filled = plan.bin_lengths()
    assert (filled[:-1] == seq_length).all()
    stream = [(d, s) for d, s in zip(plan.documents.tolist(), plan.starts.tolist(), strict=True)]
    assert stream == sorted(stream)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), max_size=80), window=st.integers(1, 30))
def test_windowed_packing_only_groups_documents_of_the_same_window(lengths, window):
    plan = plan_packs_in_windows(lengths, 32, window, "bfd")
    for docs in plan.bins():
        assert len({doc // window for doc in docs}) == 1
    assert sorted(plan.documents.tolist()) == list(range(len(lengths)))


def test_next_fit_keeps_input_order_and_opens_a_bin_when_the_next_does_not_fit():
    plan = plan_packs([3, 3, 3, 1, 4], seq_length=7, algorithm="next_fit")
    assert plan.bins() == [[0, 1], [2, 3], [4]]


def test_best_fit_puts_a_document_where_it_leaves_the_least_room():
    # 6 and 5 open two bins (rooms 4 and 5); the 4 fits best into the bin with room 4.
    plan = plan_packs([6, 5, 4], seq_length=10, algorithm="bfd")
    assert plan.bins() == [[0, 2], [1]]


def test_overlong_error_names_the_document_and_its_length():
    with pytest.raises(OverlongDocumentError, match=r"shard-000/sample-17 has 12 tokens.*sequence length 8"):
        plan_packs([3, 12], seq_length=8, names=["shard-000/sample-3", "shard-000/sample-17"])


def test_overlong_chunk_cuts_a_document_into_sequence_length_pieces():
    plan = plan_packs([20], seq_length=8, algorithm="bfd", overlong="chunk")
    assert sorted(p for b in plan for p in b) == [(0, 0, 8), (0, 8, 16), (0, 16, 20)]
    # the policy's earlier name is still taken for it
    assert plan_packs([20], seq_length=8, overlong="split").bins() == plan.bins()


def test_an_empty_input_gives_an_empty_plan():
    plan = plan_packs([], seq_length=8)
    assert plan.num_bins == 0 and plan.bins() == []


@pytest.mark.parametrize("bad", [{"algorithm": "worst_fit"}, {"overlong": "drop"}, {"seq_length": 0}])
def test_unknown_options_are_refused(bad):
    kwargs = {"seq_length": 8, **bad}
    with pytest.raises(ValueError):
        plan_packs([1, 2], **kwargs)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 50), max_size=60),
    seq_length=st.integers(1, 40),
    algorithm=st.sampled_from(ALGORITHMS),
    window=st.none() | st.integers(1, 20),
)
def test_packed_token_rows_hold_exactly_the_planned_tokens(lengths, seq_length, algorithm, window):
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    tokens = np.arange(int(offsets[-1]), dtype=np.int32)  # token value = its position in the corpus
    rows = pack_token_arrays(tokens, offsets, seq_length, algorithm, overlong="chunk", window=window)
    assert sorted(rows.tokens.tolist()) == tokens.tolist()
    assert (np.diff(rows.row_offsets) <= seq_length).all()
    row_tokens = np.diff(rows.row_offsets)
    per_row = np.add.reduceat(rows.seq_lengths, rows.seq_offsets[:-1]) if len(rows.seq_lengths) else []
    assert list(per_row) == list(row_tokens) or rows.num_rows == 0
