"""Shared-prefix rollout folding for RL training: one prompt with N sampled completions laid out once.

A rollout group is a prompt and the completions sampled from it. Laid out naively, the prompt is
repeated N times; folded, it is stored once (node 0) and every completion follows it as a node of its own,
so a group of a 500-token prompt and 8 completions costs 500 + sum(completions) tokens, not 8 x 500 more.
The structure travels with the tokens: `node_lengths` (tokens of each node, in layout order) and
`sample_paths` (for each completion, the nodes from the root to its leaf). A completion's tokens attend
fully to the prompt and causally to themselves (`cookers.rollout_mask` builds that mask).

Semantics (those of NeMo Automodel's prefix-tree datasets layer, cp=1):

- labels are pre-shifted: position t carries the token that position t must predict;
- the prompt is fully masked, its last token included: that position is the branch point where the
  completions diverge, so it cannot supervise any one completion's first token;
- completion c supervises `c[1:]` and masks its own last token (nothing follows it in the layout);
- position ids restart at P (the prompt length) for every completion;
- `node_lengths` is `[P, len(c0), len(c1), ...]`; `sample_paths` is `[[0, i + 1]]` for completion i, or
  `[[i + 1]]` when the prompt is empty (node 0 is then kept, with length 0, so completion i is still
  node i + 1).

Several folded groups can share one sequence of at most L tokens (`pack_rollout_groups`, best-fit
decreasing from `cookers.packing`): nodes and paths of later groups are offset, a group is never split,
and groups never see each other because no path joins them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cookers.packed_layout import IGNORE_INDEX
from cookers.packing import plan_packs

TOKEN_DTYPE = np.int64


@dataclass(frozen=True)
class FoldedRollouts:
    """Folded rollout groups: one group from `fold_shared_prefix_rollouts`, or several packed together.

    Per-token arrays (int64) have the folded length T. Group g is the token range
    `[group_offsets[g], group_offsets[g + 1])`; one group has `group_offsets == [0, T]`.
    """

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    node_lengths: list[int]
    sample_paths: list[list[int]]
    group_offsets: list[int]

    @property
    def num_tokens(self) -> int:
        """Tokens in the folded layout."""
        return len(self.input_ids)

    @property
    def num_groups(self) -> int:
        """Rollout groups in the layout."""
        return len(self.group_offsets) - 1

    @property
    def num_samples(self) -> int:
        """Completions (leaves) in the layout."""
        return len(self.sample_paths)

    def node_of_tokens(self) -> np.ndarray:
        """The node every token belongs to."""
        return np.repeat(np.arange(len(self.node_lengths)), self.node_lengths)

    def sample_of_tokens(self) -> np.ndarray:
        """For every token, the sample (completion) whose leaf node holds it; -1 for shared nodes (prompts).

        This maps per-completion quantities (rewards, advantages) onto tokens.

        >>> fold_shared_prefix_rollouts([1, 2], [[3], [4, 5]]).sample_of_tokens().tolist()
        [-1, -1, 0, 1, 1]
        """
        sample_of_node = np.full(len(self.node_lengths), -1, dtype=np.int64)
        for sample, path in enumerate(self.sample_paths):
            sample_of_node[path[-1]] = sample
        return sample_of_node[self.node_of_tokens()]


def _token_ids(values: object, what: str) -> np.ndarray:
    """A 1-D int64 array of token ids; ValueError naming `what` for anything that is not integers."""
    array = np.asarray(values)
    if array.size and array.dtype.kind not in "iu":
        raise ValueError(f"{what} must be a sequence of integer token ids, got {array.dtype} values")
    if array.ndim > 1:
        raise ValueError(f"{what} must be one sequence of token ids, got an array of shape {array.shape}")
    return array.astype(TOKEN_DTYPE, copy=False).reshape(-1)


def fold_shared_prefix_rollouts(
    prompt_ids: Sequence[int] | np.ndarray,
    completions: Sequence[Sequence[int] | np.ndarray],
    ignore_idx: int = IGNORE_INDEX,
) -> FoldedRollouts:
    """Fold one group (a prompt and its sampled completions) into the deduplicated prefix-tree layout.

    `ValueError` when there is no completion or a completion is empty (naming which).

    >>> folded = fold_shared_prefix_rollouts([11, 12, 13], [[21, 22], [31, 32, 33]])
    >>> folded.input_ids.tolist()
    [11, 12, 13, 21, 22, 31, 32, 33]
    >>> folded.labels.tolist()
    [-100, -100, -100, 22, -100, 32, 33, -100]
    >>> folded.position_ids.tolist(), folded.node_lengths, folded.sample_paths
    ([0, 1, 2, 3, 4, 3, 4, 5], [3, 2, 3], [[0, 1], [0, 2]])
    """
    prompt = _token_ids(prompt_ids, "the prompt")
    if len(completions) == 0:
        raise ValueError("the rollout group has no completions; a group needs at least one completion")
    arrays = [_token_ids(c, f"completion {i}") for i, c in enumerate(completions)]
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        which = ", ".join(str(i) for i in empty.tolist())
        raise ValueError(
            f"completion {which} of the {len(arrays)} in the rollout group "
            f"{'is' if len(empty) == 1 else 'are'} empty; every completion needs at least one token"
        )
    prompt_length = len(prompt)
    completion_tokens = np.concatenate(arrays)
    ends = np.cumsum(lengths)  # end of every completion, relative to the first completion token
    starts = ends - lengths

    labels = np.full(prompt_length + len(completion_tokens), ignore_idx, dtype=TOKEN_DTYPE)
    targets = labels[prompt_length:]
    targets[:-1] = completion_tokens[1:]
    targets[ends - 1] = ignore_idx  # a completion's last token has nothing to predict

    positions = np.empty_like(labels)
    positions[:prompt_length] = np.arange(prompt_length)
    positions[prompt_length:] = prompt_length + np.arange(len(completion_tokens)) - np.repeat(starts, lengths)

    first = [0] if prompt_length else []
    return FoldedRollouts(
        input_ids=np.concatenate((prompt, completion_tokens)),
        labels=labels,
        position_ids=positions,
        node_lengths=[prompt_length, *lengths.tolist()],
        sample_paths=[[*first, i + 1] for i in range(len(arrays))],
        group_offsets=[0, prompt_length + len(completion_tokens)],
    )


def concatenate_folded(groups: Sequence[FoldedRollouts]) -> FoldedRollouts:
    """Lay folded groups (or packs of them) end to end: nodes and paths of each shift past those before.

    >>> a = fold_shared_prefix_rollouts([1], [[2]])
    >>> b = fold_shared_prefix_rollouts([3, 4], [[5], [6]])
    >>> both = concatenate_folded([a, b])
    >>> both.node_lengths, both.sample_paths, both.group_offsets, both.position_ids.tolist()
    ([1, 1, 2, 1, 1], [[0, 1], [2, 3], [2, 4]], [0, 2, 6], [0, 1, 0, 1, 2, 2])
    """
    if not groups:
        empty = np.zeros(0, dtype=TOKEN_DTYPE)
        return FoldedRollouts(empty, empty, empty, [], [], [0])
    node_lengths: list[int] = []
    sample_paths: list[list[int]] = []
    group_offsets = [0]
    for group in groups:
        shift = len(node_lengths)
        node_lengths.extend(group.node_lengths)
        sample_paths.extend([node + shift for node in path] for path in group.sample_paths)
        base = group_offsets[-1]
        group_offsets.extend(base + offset for offset in group.group_offsets[1:])
    return FoldedRollouts(
        input_ids=np.concatenate([g.input_ids for g in groups]),
        labels=np.concatenate([g.labels for g in groups]),
        position_ids=np.concatenate([g.position_ids for g in groups]),
        node_lengths=node_lengths,
        sample_paths=sample_paths,
        group_offsets=group_offsets,
    )


def plan_rollout_packs(
    lengths: Sequence[int] | np.ndarray, seq_length: int, names: Sequence[str] | None = None
) -> list[list[int]]:
    """Which groups (by index) share each sequence of at most `seq_length` tokens, by best-fit decreasing.

    A group is never split: one longer than `seq_length` is a `ValueError` naming it.

    >>> plan_rollout_packs([900, 300, 600, 200], seq_length=1000)
    [[0], [1, 2], [3]]
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    too_long = np.flatnonzero(lengths > seq_length)
    if len(too_long):
        first = int(too_long[0])
        name = names[first] if names is not None else f"rollout group #{first}"
        more = f" ({len(too_long) - 1} more such groups follow)" if len(too_long) > 1 else ""
        raise ValueError(
            f"{name} folds to {int(lengths[first])} tokens, more than the sequence length {seq_length}{more};"
            " a group is never split: raise the sequence length or leave such groups out"
        )
    return plan_packs(lengths, seq_length, "bfd").bins()


def pack_rollout_groups(groups: Sequence[FoldedRollouts], seq_length: int) -> list[FoldedRollouts]:
    """Pack folded groups into sequences of at most `seq_length` tokens (best-fit decreasing).

    >>> groups = [fold_shared_prefix_rollouts([1] * 5, [[2] * n]) for n in (4, 1, 3)]
    >>> [p.num_tokens for p in pack_rollout_groups(groups, seq_length=16)]
    [15, 8]
    """
    bins = plan_rollout_packs([g.num_tokens for g in groups], seq_length)
    return [concatenate_folded([groups[g] for g in members]) for members in bins]


@dataclass(frozen=True)
class RolloutFill:
    """How full sequences of `seq_length` tokens are with folded groups packed, against one group each."""

    tokens: int
    groups: int
    packs: int
    seq_length: int

    @property
    def packed(self) -> float:
        """Real tokens over `packs x seq_length`."""
        return self.tokens / (self.packs * self.seq_length) if self.packs else 1.0

    @property
    def one_group_per_sequence(self) -> float:
        """Real tokens over `groups x seq_length`: each group alone in a sequence (the reference collate)."""
        return self.tokens / (self.groups * self.seq_length) if self.groups else 1.0


def rollout_fill(lengths: Sequence[int] | np.ndarray, seq_length: int) -> RolloutFill:
    """The fill of packing groups of these folded lengths into sequences of `seq_length` tokens.

    >>> fill = rollout_fill([900, 300, 600, 200], seq_length=1000)
    >>> fill.packs, round(fill.packed, 3), round(fill.one_group_per_sequence, 3)
    (3, 0.667, 0.5)
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    bins = plan_rollout_packs(lengths, seq_length)
    return RolloutFill(int(lengths.sum()), len(lengths), len(bins), seq_length)


def unfolded_length(prompt_length: int, completion_lengths: Sequence[int]) -> int:
    """Tokens of the group laid out without folding: the prompt repeated before every completion.

    >>> unfolded_length(3, [2, 3]) - fold_shared_prefix_rollouts([1, 2, 3], [[4, 5], [6, 7, 8]]).num_tokens
    3
    """
    return len(completion_lengths) * prompt_length + int(sum(completion_lengths))
