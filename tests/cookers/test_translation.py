"""Parallel-text rules: alignment matrices, the target's marks, the length filter, bucket and batch-size
arithmetic over a grid, grouping as energon's grouped batching does it, and the padding report."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cookers.translation import (
    LengthBuckets,
    LengthLimits,
    alignment_matrix_from_pharaoh,
    batch_padding,
    group_into_batches,
    pad_alignments,
    pad_sequences,
    padding_report,
    shifted_targets,
    target_sequences,
)


def test_the_alignment_example_is_the_identity():
    matrix = alignment_matrix_from_pharaoh("0-0 1-1 2-2", 3, 3)
    assert matrix.dtype == np.float32 and matrix.shape == (3, 3)
    assert (matrix == np.eye(3, dtype=np.float32)).all()


def test_alignment_rows_are_target_positions_and_columns_source_positions():
    matrix = alignment_matrix_from_pharaoh("0-1 1-0 1-2", source_length=2, target_length=3)
    assert matrix.tolist() == [[0, 1], [1, 0], [0, 1]]


def test_an_alignment_pair_out_of_range_is_named():
    with pytest.raises(
        ValueError, match=r"alignment pair '3-1' is out of range: source position 3 is past the 3"
    ):
        alignment_matrix_from_pharaoh("0-0 3-1", 3, 3)
    with pytest.raises(
        ValueError, match=r"alignment pair '1-4' is out of range: target position 4 is past the 2"
    ):
        alignment_matrix_from_pharaoh("1-4", 3, 2)
    with pytest.raises(ValueError, match=r"alignment pair '1:2' is not a pharaoh pair i-j"):
        alignment_matrix_from_pharaoh("0-0 1:2", 3, 3)


def test_an_empty_alignment_line_is_an_empty_matrix():
    assert not alignment_matrix_from_pharaoh("", 2, 4).any()


def test_the_target_gets_start_and_end_marks_as_opennmt_tf_does():
    # The example of the OpenNMT-tf walk-through: 9 target tokens become ids and ids_out of length 10.
    tokens = np.array([29, 202, 498, 7, 13, 50, 203, 499, 500])
    ids, ids_out = target_sequences(tokens, bos_id=1, eos_id=2)
    assert ids.tolist() == [1, 29, 202, 498, 7, 13, 50, 203, 499, 500]
    assert ids_out.tolist() == [29, 202, 498, 7, 13, 50, 203, 499, 500, 2]


def test_the_length_filter_drops_empty_sources_and_long_pairs_and_counts_each_once():
    limits = LengthLimits(maximum_features_length=512, maximum_labels_length=512)
    assert limits.drop_reason(250, 280) is None  # the walk-through's example pair is kept
    assert limits.drop_reason(0, 3) == "empty source"
    assert limits.drop_reason(513, 3) == "source over maximum_features_length"
    assert limits.drop_reason(3, 600) == "target over maximum_labels_length"
    keep, dropped = limits.keep(np.array([0, 600, 5, 5, 0]), np.array([0, 5, 600, 5, 9]))
    assert keep.tolist() == [False, False, False, True, False]
    assert dropped == {
        "empty source": 2,
        "source over maximum_features_length": 1,
        "target over maximum_labels_length": 1,
    }
    assert LengthLimits().drop_reason(10_000, 10_000) is None


def test_the_target_is_filtered_by_the_length_of_its_ids_as_opennmt_tf_filters_it():
    # The walk-through: the target's `length` is that of `ids` (9 tokens, length 10), and the filter keeps
    # 0 < length <= maximum_labels_length: an empty target is kept, one of exactly the maximum is not.
    limits = LengthLimits(maximum_features_length=10, maximum_labels_length=10)
    assert limits.drop_reason(3, 9) is None
    assert limits.drop_reason(3, 10) == "target over maximum_labels_length"
    assert limits.drop_reason(3, 0) is None
    assert limits.drop_reason(10, 3) is None  # the source has no marks
    keep, dropped = limits.keep(np.array([3, 3, 3]), np.array([9, 10, 0]))
    assert keep.tolist() == [True, False, True] and dropped["target over maximum_labels_length"] == 1


def test_the_walk_through_example_of_bucket_and_batch_size():
    # batch_size 100 tokens, width 1: a pair of length 5 is bucket 4, whose batches take 100 // 5 = 20
    # pairs; with fp16's multiple of 8, 16.
    assert LengthBuckets(100, "tokens", 1).bucket_of(5) == 4
    assert LengthBuckets(100, "tokens", 1).batch_size_of(4) == 20
    assert LengthBuckets(100, "tokens", 1, batch_size_multiple=8).batch_size_of(4) == 16


GRID = list(itertools.product((1, 2, 3, 8), (64, 100, 1000, 3072, 4096), (1, 8), (1, 2)))


@pytest.mark.parametrize(("width", "batch_size", "multiple", "multiplier"), GRID)
def test_bucket_and_batch_size_arithmetic(width, batch_size, multiple, multiplier):
    buckets = LengthBuckets(batch_size, "tokens", width, multiple, multiplier)
    lengths = np.arange(0, 300)
    ids = buckets.bucket_ids(lengths)
    for length, bucket in zip(lengths.tolist(), ids.tolist(), strict=True):
        assert bucket == buckets.bucket_of(length)
        assert bucket == max(-(-length // width) - 1, 0)
        if length > 0:
            assert bucket * width < length <= (bucket + 1) * width  # the bucket holds lengths (kw, (k+1)w]
    required = multiple * multiplier
    sizes = buckets.batch_sizes(np.arange(200))
    for bucket, size in enumerate(sizes.tolist()):
        assert size == buckets.batch_size_of(bucket)
        longest = (bucket + 1) * width
        assert size % required == 0 and size >= required
        # the largest multiple whose longest pairs fit the budget (or the multiple itself when none does)
        assert size * longest <= batch_size * multiplier or size == required
        assert (size + required) * longest > batch_size * multiplier
    examples = LengthBuckets(batch_size, "examples", width, multiple, multiplier)
    assert set(examples.batch_sizes(np.arange(50)).tolist()) == {batch_size * multiplier}


def test_tokens_mode_needs_a_width_and_options_are_checked():
    with pytest.raises(ValueError, match="batch_type 'tokens' needs a length_bucket_width"):
        LengthBuckets(4096, "tokens")
    with pytest.raises(ValueError, match="unknown batch_type 'sentences'"):
        LengthBuckets(10, "sentences")
    with pytest.raises(ValueError, match="batch_size_multiple must be at least 1, got 0"):
        LengthBuckets(10, batch_size_multiple=0)
    with pytest.raises(ValueError, match="unknown bucket_sides 'source'"):
        LengthBuckets(10, bucket_sides="source")


def energon_grouping(source, target, buckets):
    """energon's GroupBatchDataset, written out: each pair into its key's bucket, a batch when the bucket
    is full, the partial buckets at the end; then the irregular batches dropped."""
    pending, batches = {}, []
    for index, (s, t) in enumerate(zip(source.tolist(), target.tolist(), strict=True)):
        key, size = buckets.key_of(s, t)
        bucket = pending.setdefault(key, [])
        bucket.append(index)
        if len(bucket) >= size:
            batches.append(bucket)
            pending[key] = []
    batches += [bucket for bucket in pending.values() if bucket]
    return sorted(b for b in batches if buckets.is_regular(len(b)))


@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), max_size=300),
    st.sampled_from([1, 2, 5]),
    st.sampled_from([20, 64, 200]),
    st.sampled_from(["examples", "tokens"]),
    st.sampled_from([1, 2]),
    st.sampled_from([1, 4]),
    st.sampled_from(["longer", "both"]),
)
@settings(max_examples=150, deadline=None)
def test_grouping_is_what_energons_grouped_batching_makes(
    pairs, width, batch_size, kind, multiplier, multiple, sides
):
    source = np.array([s for s, _ in pairs], dtype=np.int64)
    target = np.array([t for _, t in pairs], dtype=np.int64)
    buckets = LengthBuckets(batch_size, kind, width, multiple, multiplier, sides)
    plan = group_into_batches(source, target, buckets)
    assert sorted(plan.batches()) == energon_grouping(source, target, buckets)
    assert 0 <= plan.max_waiting <= len(pairs)


def test_a_full_bucket_leaves_at_once_so_waiting_pairs_stay_few():
    source = np.array([3, 3, 3, 3, 9, 3, 3])
    plan = group_into_batches(source, source, LengthBuckets(2, length_bucket_width=4))
    assert plan.batches() == [[0, 1], [2, 3], [5, 6], [4]]
    assert plan.max_waiting == 2  # pair 4 waits from its arrival to the end, beside one other at most


def test_width_one_pads_only_the_shorter_side_and_both_sides_buckets_pad_nothing():
    rng = np.random.default_rng(0)
    source = rng.integers(1, 60, size=5000)
    target = np.maximum(1, source + rng.integers(-5, 6, size=5000))
    longer = batch_padding(source, target, LengthBuckets(1024, "tokens", 1))
    assert longer.padding > 0
    assert longer.source_padding > 0 and longer.target_padding > 0
    both = batch_padding(source, target, LengthBuckets(1024, "tokens", 1, bucket_sides="both"))
    assert both.padding == 0.0
    assert both.max_waiting > longer.max_waiting


def test_the_padding_report_grows_with_the_width_and_is_worst_without_buckets():
    rng = np.random.default_rng(1)
    source = np.clip(rng.lognormal(3, 0.6, 20_000).astype(int), 1, 200)
    target = np.clip((source * rng.lognormal(0.1, 0.15, 20_000)).astype(int), 1, 200)
    figures = padding_report(source, target, batch_size=2048, widths=(1, 2, 8, None), batch_size_multiple=8)
    assert [f.width for f in figures] == [1, 2, 8, None]
    paddings = [f.padding for f in figures]
    assert paddings == sorted(paddings)
    assert all(f.pairs == 20_000 for f in figures)
    assert figures[-1].padding > 0.5


def test_batches_pad_to_their_longest_and_alignments_to_the_same_widths():
    padded, lengths = pad_sequences([np.array([5, 6]), np.array([7, 8, 9, 10])], pad_id=0)
    assert padded.dtype == np.int64 and padded.tolist() == [[5, 6, 0, 0], [7, 8, 9, 10]]
    assert lengths.tolist() == [2, 4]
    matrices = pad_alignments([np.array([[0, 0], [1, 1]]), np.zeros((0, 2), dtype=np.int64)], 4, 3)
    assert matrices.shape == (2, 4, 3) and matrices.dtype == np.float32
    assert matrices[0, :2, :2].tolist() == [[1, 0], [0, 1]] and not matrices[1].any()
    expected = alignment_matrix_from_pharaoh("0-0 1-1", 2, 2)
    assert (
        (matrices[0, :2, :2] == expected).all() and not matrices[0, 2:].any() and not matrices[0, :, 2:].any()
    )


@given(st.lists(st.lists(st.integers(3, 99), max_size=9), min_size=1, max_size=12))
@settings(max_examples=100, deadline=None)
def test_ids_out_made_from_padded_ids_are_the_padded_ids_out(targets):
    pairs = [target_sequences(np.array(t, dtype=np.int64), bos_id=1, eos_id=2) for t in targets]
    ids, lengths = pad_sequences([i for i, _ in pairs], pad_id=0)
    expected, _ = pad_sequences([o for _, o in pairs], pad_id=0)
    assert shifted_targets(ids, lengths, eos_id=2, pad_id=0).tolist() == expected.tolist()


@pytest.mark.parametrize("word", ["²-1", "٣-٠", "０-１"])
def test_an_alignment_pair_of_digits_other_than_ascii_is_not_a_pharaoh_pair(word):
    """`str.isdigit` takes superscripts (which `int` then refuses with its own message) and other
    scripts' digits (which `int` read as positions); OpenNMT-tf's `tf.strings.to_number` reads neither."""
    with pytest.raises(ValueError, match=rf"alignment pair '{word}' is not a pharaoh pair i-j"):
        alignment_matrix_from_pharaoh(f"0-0 {word}", 5, 5)
