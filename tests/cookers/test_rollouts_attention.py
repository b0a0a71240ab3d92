"""Attention over the folded layout gives every completion what attention over prompt + completion alone
gives it (float64, CPU), one group or several packed; the flex-attention mask is the dense mask.

flex_attention runs here without torch.compile (the unfused path, which materialises the scores): that
is what torch offers on a CPU without a compiler run in the test; on a GPU the same BlockMask and
mask_mod go to the fused kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import create_mask, flex_attention

from cookers.energon_rollouts import prefix_tree_block_mask, prefix_tree_mask_mod
from cookers.packed_layout import IGNORE_INDEX
from cookers.rollout_mask import prefix_tree_mask
from cookers.rollouts import concatenate_folded, fold_shared_prefix_rollouts, pack_rollout_groups

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


class TinyCausalLM(torch.nn.Module):
    """Embedding + rotary-free absolute positions + two masked self-attention layers + LM head."""

    def __init__(self, vocab: int = 60, dim: int = 16, max_positions: int = 128) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(max_positions, dim)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(2))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids, position_ids, allowed):
        x = self.embed(input_ids) + self.positions(position_ids)
        for layer in self.layers:
            q, k, v = layer(x).chunk(3, dim=-1)
            scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
            x = x + torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
        return self.head(x)


def random_groups(rng, count):
    return [
        (
            rng.integers(1, 60, size=int(rng.integers(0, 12))).tolist(),
            [
                rng.integers(1, 60, size=int(n)).tolist()
                for n in rng.integers(1, 10, size=int(rng.integers(1, 5)))
            ],
        )
        for _ in range(count)
    ]


def node_starts(folded):
    return np.concatenate(([0], np.cumsum(folded.node_lengths)))


@pytest.mark.parametrize("packed", [False, True])
def test_every_completion_computes_what_it_computes_alone(packed):
    torch.manual_seed(0)
    rng = np.random.default_rng(5)
    groups = random_groups(rng, 7 if packed else 1)
    folded_groups = [fold_shared_prefix_rollouts(p, c) for p, c in groups]
    layout = concatenate_folded(pack_rollout_groups(folded_groups, 64)) if packed else folded_groups[0]
    if packed:
        order = [
            next(
                i
                for i, f in enumerate(folded_groups)
                if f.input_ids.tolist() == layout.input_ids[a:b].tolist()
            )
            for a, b in zip(layout.group_offsets[:-1], layout.group_offsets[1:], strict=True)
        ]
        groups = [groups[i] for i in order]
        assert layout.num_groups == 7 and len(set(order)) == 7
    model = TinyCausalLM().double().eval()
    mask = torch.from_numpy(prefix_tree_mask(layout.node_lengths, layout.sample_paths))
    with torch.no_grad():
        logits = model(torch.from_numpy(layout.input_ids), torch.from_numpy(layout.position_ids), mask)
        folded_loss = torch.nn.functional.cross_entropy(
            logits, torch.from_numpy(layout.labels), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        starts = node_starts(layout)
        samples = [(p, c) for p, completions in groups for c in completions]
        alone_loss = torch.zeros((), dtype=torch.float64)
        for path, (prompt, completion) in zip(layout.sample_paths, samples, strict=True):
            sequence = torch.tensor(prompt + completion)
            n = len(sequence)
            alone = model(sequence, torch.arange(n), torch.tril(torch.ones(n, n, dtype=torch.bool)))
            where = torch.from_numpy(
                np.concatenate([np.arange(starts[node], starts[node + 1]) for node in path])
            )
            torch.testing.assert_close(logits[where], alone, rtol=1e-12, atol=1e-12)
            labels = torch.full((n,), IGNORE_INDEX)
            labels[len(prompt) : n - 1] = sequence[len(prompt) + 1 :]  # the branch point stays unsupervised
            alone_loss += torch.nn.functional.cross_entropy(
                alone, labels, ignore_index=IGNORE_INDEX, reduction="sum"
            )
    torch.testing.assert_close(folded_loss, alone_loss, rtol=1e-12, atol=1e-12)


def attention(q, k, v, allowed):
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("padding", [0, 13])
def test_the_flex_attention_mask_is_the_dense_mask_and_gives_the_same_outputs(padding):
    rng = np.random.default_rng(11)
    folded = [fold_shared_prefix_rollouts(p, c) for p, c in random_groups(rng, 9)]
    layout = concatenate_folded(pack_rollout_groups(folded, 48))
    total = layout.num_tokens + padding
    dense = torch.from_numpy(prefix_tree_mask(layout.node_lengths, layout.sample_paths, total))

    mask_mod = prefix_tree_mask_mod(layout.node_lengths, layout.sample_paths, total)
    assert torch.equal(create_mask(mask_mod, 1, 1, total, total, device="cpu")[0, 0], dense)

    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, total, 8, dtype=torch.float64) for _ in range(3))
    block_mask = prefix_tree_block_mask(layout.node_lengths, layout.sample_paths, total, block_size=16)
    flex = flex_attention(q, k, v, block_mask=block_mask)
    torch.testing.assert_close(flex, attention(q, k, v, dense), rtol=1e-12, atol=1e-12)

    starts = node_starts(layout)
    for path in layout.sample_paths:
        where = torch.from_numpy(np.concatenate([np.arange(starts[node], starts[node + 1]) for node in path]))
        n = len(where)
        alone = attention(
            q[:, :, where], k[:, :, where], v[:, :, where], torch.tril(torch.ones(n, n, dtype=torch.bool))
        )
        torch.testing.assert_close(flex[:, :, where], alone, rtol=1e-12, atol=1e-12)


def test_the_block_mask_skips_blocks_no_token_attends_to():
    # Two groups of 64 tokens each: the blocks of one group against the other are empty.
    groups = [fold_shared_prefix_rollouts([1] * 32, [[2] * 16, [3] * 16]) for _ in range(2)]
    layout = concatenate_folded(groups)
    block_mask = prefix_tree_block_mask(layout.node_lengths, layout.sample_paths, block_size=32)
    assert block_mask.sparsity() > 50.0
