"""Folding rollout groups: the reference's worked example, random groups against the unfolded layout,
packing groups into sequences, and the errors a user sees."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cookers.packed_layout import IGNORE_INDEX
from cookers.rollout_mask import node_parents, prefix_tree_mask, visible_nodes
from cookers.rollouts import (
    concatenate_folded,
    fold_shared_prefix_rollouts,
    pack_rollout_groups,
    plan_rollout_packs,
    rollout_fill,
    unfolded_length,
)

tokens = st.lists(st.integers(0, 1000), max_size=12)
groups = st.tuples(
    tokens, st.lists(st.lists(st.integers(0, 1000), min_size=1, max_size=10), min_size=1, max_size=6)
)


def test_the_worked_example_of_the_issue():
    folded = fold_shared_prefix_rollouts([11, 12, 13], [[21, 22], [31, 32, 33]])
    assert folded.input_ids.tolist() == [11, 12, 13, 21, 22, 31, 32, 33]
    assert folded.labels.tolist() == [-100, -100, -100, 22, -100, 32, 33, -100]
    assert folded.position_ids.tolist() == [0, 1, 2, 3, 4, 3, 4, 5]
    assert folded.node_lengths == [3, 2, 3]
    assert folded.sample_paths == [[0, 1], [0, 2]]
    assert folded.group_offsets == [0, 8]


def test_an_empty_prompt_keeps_node_zero_but_leaves_it_off_the_paths():
    folded = fold_shared_prefix_rollouts([], [[5, 6], [7]])
    assert folded.node_lengths == [0, 2, 1]
    assert folded.sample_paths == [[1], [2]]
    assert folded.position_ids.tolist() == [0, 1, 0]
    assert folded.labels.tolist() == [6, -100, -100]


def test_the_ignore_index_is_the_callers():
    folded = fold_shared_prefix_rollouts([1, 2], [[3, 4]], ignore_idx=-1)
    assert folded.labels.tolist() == [-1, -1, 4, -1]


def test_no_completions_is_an_error_that_says_so():
    with pytest.raises(ValueError, match="has no completions"):
        fold_shared_prefix_rollouts([1, 2, 3], [])


def test_an_empty_completion_is_an_error_that_names_it():
    with pytest.raises(ValueError, match=r"completion 2 of the 3 in the rollout group is empty"):
        fold_shared_prefix_rollouts([1], [[2], [3], []])
    with pytest.raises(ValueError, match=r"completion 0, 1 of the 2 .* are empty"):
        fold_shared_prefix_rollouts([1], [[], []])


def test_text_instead_of_token_ids_is_an_error_that_names_the_part():
    with pytest.raises(ValueError, match="completion 1 must be a sequence of integer token ids"):
        fold_shared_prefix_rollouts([1], [[2], ["a", "b"]])
    with pytest.raises(ValueError, match="the prompt must be a sequence of integer token ids"):
        fold_shared_prefix_rollouts([0.5], [[2]])


def along_path(folded, path, array):
    """The values of `array` over the nodes of one sample path: that sample as if it were alone."""
    offsets = np.concatenate(([0], np.cumsum(folded.node_lengths)))
    return np.concatenate([array[offsets[node] : offsets[node + 1]] for node in path])


def assert_each_sample_is_its_unfolded_sequence(folded, prompts_and_completions):
    """Every sample path reads back prompt + completion, positions 0.., and the shifted labels of that
    sequence with the prompt (its last token included) masked."""
    samples = [(p, c) for p, completions in prompts_and_completions for c in completions]
    assert folded.num_samples == len(samples)
    for path, (prompt, completion) in zip(folded.sample_paths, samples, strict=True):
        sequence = list(prompt) + list(completion)
        assert along_path(folded, path, folded.input_ids).tolist() == sequence
        assert along_path(folded, path, folded.position_ids).tolist() == list(range(len(sequence)))
        expected = [IGNORE_INDEX] * len(sequence)
        for t in range(len(prompt), len(sequence) - 1):
            expected[t] = sequence[t + 1]
        assert along_path(folded, path, folded.labels).tolist() == expected


@given(groups)
@settings(max_examples=200, deadline=None)
def test_a_folded_group_reads_back_every_completion_with_its_prompt(group):
    prompt, completions = group
    folded = fold_shared_prefix_rollouts(prompt, completions)
    assert folded.num_tokens == len(prompt) + sum(map(len, completions))
    assert unfolded_length(len(prompt), [len(c) for c in completions]) - folded.num_tokens == (
        (len(completions) - 1) * len(prompt)
    )
    assert folded.node_lengths == [len(prompt), *map(len, completions)]
    assert_each_sample_is_its_unfolded_sequence(folded, [group])
    supervised = int((folded.labels != IGNORE_INDEX).sum())
    assert supervised == sum(len(c) - 1 for c in completions)


@given(st.lists(groups, min_size=1, max_size=8), st.integers(30, 80))
@settings(max_examples=100, deadline=None)
def test_packed_groups_stay_whole_and_never_see_each_other(many, seq_length):
    folded = [fold_shared_prefix_rollouts(p, c) for p, c in many]
    fitting = [(g, f) for g, f in zip(many, folded, strict=True) if f.num_tokens <= seq_length]
    packs = pack_rollout_groups([f for _, f in fitting], seq_length)
    assert sum(p.num_groups for p in packs) == len(fitting)
    assert all(p.num_tokens <= seq_length for p in packs)
    bins = plan_rollout_packs([f.num_tokens for _, f in fitting], seq_length)
    for pack, members in zip(packs, bins, strict=True):
        assert np.diff(pack.group_offsets).tolist() == [fitting[i][1].num_tokens for i in members]
        assert sum(pack.node_lengths) == pack.num_tokens == pack.group_offsets[-1]
    order = [i for members in bins for i in members]
    for pack in packs:
        mask = prefix_tree_mask(pack.node_lengths, pack.sample_paths)
        group_of_token = np.repeat(np.arange(pack.num_groups), np.diff(pack.group_offsets))
        assert not (mask & (group_of_token[:, None] != group_of_token[None, :])).any()
        assert (np.diag(mask)).all()
    joined = concatenate_folded(packs)
    assert np.diff(joined.group_offsets).tolist() == [fitting[i][1].num_tokens for i in order]
    assert_each_sample_is_its_unfolded_sequence(joined, [fitting[i][0] for i in order])


def test_packing_offsets_nodes_paths_and_groups():
    a = fold_shared_prefix_rollouts([1, 2], [[3], [4, 5]])
    b = fold_shared_prefix_rollouts([], [[6]])
    both = concatenate_folded([a, b])
    assert both.node_lengths == [2, 1, 2, 0, 1]
    assert both.sample_paths == [[0, 1], [0, 2], [4]]
    assert both.group_offsets == [0, 5, 6]
    assert both.sample_of_tokens().tolist() == [-1, -1, 0, 1, 1, 2]


def test_a_group_longer_than_the_sequence_is_named_and_never_split():
    with pytest.raises(
        ValueError, match=r"rollout group #1 folds to 12 tokens, more than the sequence length 10"
    ):
        plan_rollout_packs([4, 12, 3], 10)
    with pytest.raises(ValueError, match=r"group-b folds to 12 tokens"):
        plan_rollout_packs([4, 12, 3], 10, names=["group-a", "group-b", "group-c"])


def test_fill_of_packed_groups_against_one_group_per_sequence():
    fill = rollout_fill([700, 300, 600, 400, 900], seq_length=1000)
    assert fill.tokens == 2900 and fill.groups == 5 and fill.packs == 3
    assert fill.packed == pytest.approx(2900 / 3000)
    assert fill.one_group_per_sequence == pytest.approx(2900 / 5000)


def test_sample_paths_that_are_not_a_tree_are_refused_with_the_node():
    assert node_parents(3, [[0, 1], [0, 2]]).tolist() == [-1, 0, 0]
    with pytest.raises(ValueError, match="node 1 follows node 0 on an earlier sample path and node 2"):
        visible_nodes(3, [[0, 1], [2, 1]])
    with pytest.raises(ValueError, match="sample path 1 names node 7, but there are 3 nodes"):
        visible_nodes(3, [[0, 1], [0, 7]])
    with pytest.raises(ValueError, match="sample path 0 is empty"):
        visible_nodes(3, [[]])


def test_deeper_trees_see_every_ancestor():
    # A multi-turn tree: 0 -> 1 -> {2, 3}; node 3's tokens see 0, 1 and themselves, not 2.
    mask = prefix_tree_mask([1, 1, 1, 2], [[0, 1, 2], [0, 1, 3]])
    assert mask.astype(int).tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 1, 1],
    ]


def test_padding_past_the_structure_attends_only_to_padding():
    mask = prefix_tree_mask([2, 1], [[0, 1]], total=5)
    assert mask[3:].astype(int).tolist() == [[0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    assert not mask[:3, 3:].any()
