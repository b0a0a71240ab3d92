"""A packed batch with the block-diagonal mask from cu_seqlens computes what each document computes alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cookers.packed_layout import IGNORE_INDEX, flatten_packs, layout_pack
from cookers.packing import plan_packs


class TinyCausalLM(torch.nn.Module):
    """Embedding + absolute positions + one causal self-attention layer + LM head."""

    def __init__(self, vocab: int = 50, dim: int = 16, max_positions: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(max_positions, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids, position_ids, allowed):
        x = self.embed(input_ids) + self.positions(position_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        return self.head(x + torch.softmax(scores, dim=-1) @ v)


def block_causal_mask(cu_seqlens: np.ndarray, total: int) -> torch.Tensor:
    segment = np.zeros(total, dtype=np.int64)
    segment[cu_seqlens[1:-1]] = 1
    segment = torch.from_numpy(np.cumsum(segment))
    causal = torch.tril(torch.ones(total, total, dtype=torch.bool))
    return causal & (segment[:, None] == segment[None, :])


def loss_sum(logits, labels, convention):
    if convention == "unshifted":
        logits, labels = logits[:-1], labels[1:]
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


@pytest.mark.parametrize("convention", ["unshifted", "shifted"])
@pytest.mark.parametrize("multiple", [None, 8])
def test_packed_attention_equals_running_each_document_alone(convention, multiple):
    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    documents = [rng.integers(1, 50, size=n) for n in rng.integers(2, 20, size=12)]
    prompt_lengths = [int(rng.integers(0, len(d) - 1)) for d in documents]
    masks = [np.arange(len(d)) >= p for d, p in zip(documents, prompt_lengths, strict=True)]
    model = TinyCausalLM().eval()

    plan = plan_packs([len(d) for d in documents], seq_length=30, algorithm="bfd")
    packs = [
        layout_pack(
            [documents[d] for d, _, _ in pieces],
            [masks[d] for d, _, _ in pieces],
            labels=convention,
            pad_to_multiple_of=multiple,
        )
        for pieces in plan
    ]
    batch = flatten_packs(packs)
    total = len(batch.input_ids)
    with torch.no_grad():
        packed_logits = model(
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.position_ids),
            block_causal_mask(batch.cu_seqlens, total),
        )
        packed_loss = loss_sum(packed_logits, torch.from_numpy(batch.labels), convention)

        alone_loss = torch.zeros(())
        order = [d for pieces in plan for d, _, _ in pieces]
        sequence_starts = [s for s in batch.cu_seqlens[:-1].tolist() if batch.seq_ids[s] >= 0]
        assert batch.num_padding > 0 or multiple is None
        for position, d in enumerate(order):
            single = layout_pack([documents[d]], [masks[d]], labels=convention)
            n = len(documents[d])
            logits = model(
                torch.from_numpy(single.input_ids),
                torch.from_numpy(single.position_ids),
                torch.tril(torch.ones(n, n, dtype=torch.bool)),
            )
            alone_loss = alone_loss + loss_sum(logits, torch.from_numpy(single.labels), convention)
            start = sequence_starts[position]
            torch.testing.assert_close(packed_logits[start : start + n], logits)
    torch.testing.assert_close(packed_loss, alone_loss)
    assert int((batch.labels != IGNORE_INDEX).sum()) == sum(int(m[1:].sum()) for m in masks)
