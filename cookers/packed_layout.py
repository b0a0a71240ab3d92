"""The token layout of one pack: the arrays a packed-sequence training step takes.

A pack is a few sequences (documents or pieces of them) laid end to end. Attention must stay inside each
sequence, so the layout carries the sequence boundaries (`cu_seqlens`), positions restarting at 0 in every
sequence, and labels that never ask a token to predict across a boundary.

Label conventions:

- `unshifted` (Hugging Face): `labels[t]` is the target *at* position t; the model shifts inside its loss
  (logits at t-1 predict labels[t]). The first token of every sequence is therefore -100: it would be
  predicted from the previous sequence's last token.
- `shifted` (Megatron, NeMo Automodel): `labels[t]` is the token that logits at t must predict, i.e.
  `input_ids[t + 1]`. The last token of every sequence is -100.

Tokens whose loss mask is False (an SFT prompt) are -100 as targets in both conventions.

Padding (`pad_to_multiple_of`) appends `pad_id` tokens labelled -100 with their own positions 0..p-1 and
seq_id -1, and makes them one extra trailing segment of `cu_seqlens`, so that `cu_seqlens` always ends at
the packed length and padding attends only to padding. Megatron's THD format wants the real boundaries and
the padded offsets separately; `megatron_packed_seq_params()` returns them that way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

LabelConvention = Literal["unshifted", "shifted"]
LABEL_CONVENTIONS: tuple[str, ...] = ("unshifted", "shifted")
IGNORE_INDEX = -100


@dataclass(frozen=True)
class PackedSequence:
    """One pack. All per-token arrays have the packed length T (padding included)."""

    input_ids: np.ndarray
    labels: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    max_seqlen: int
    seq_ids: np.ndarray
    num_padding: int = 0

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the pack."""
        return len(self.input_ids) - self.num_padding

    def _segment_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Lengths of the real segments, and of each with the padding segment that follows it."""
        cu = self.cu_seqlens.astype(np.int64)
        lengths = np.diff(cu)
        starts = np.minimum(cu[:-1], max(len(self.seq_ids) - 1, 0))
        is_padding = (lengths > 0) & (self.seq_ids[starts] < 0) if len(self.seq_ids) else lengths < 0
        padded = lengths.copy()
        # Padding belongs to the real segment before it (a pack never starts with padding).
        follows = np.flatnonzero(is_padding[1:]) + 1
        padded[follows - 1] += lengths[follows]
        real = ~is_padding
        return lengths[real], padded[real]

    @property
    def cu_seqlens_unpadded(self) -> np.ndarray:
        """Cumulative lengths of the real sequences only, padding left out (int32)."""
        real, _ = self._segment_lengths()
        return np.concatenate(([0], np.cumsum(real))).astype(np.int32)

    def megatron_packed_seq_params(self) -> dict[str, object]:
        """Keyword arguments for Megatron-core's `PackedSeqParams` in THD format.

        `cu_seqlens_q` accumulates the real sequence lengths; `cu_seqlens_q_padded` the offsets in the
        padded tensor, where padding counts towards the sequence before it.
        """
        real, padded = self._segment_lengths()
        unpadded_cu = np.concatenate(([0], np.cumsum(real))).astype(np.int32)
        padded_cu = np.concatenate(([0], np.cumsum(padded))).astype(np.int32)
        max_seqlen = int(padded.max()) if len(padded) else 0
        return {
            "qkv_format": "thd",
            "cu_seqlens_q": unpadded_cu,
            "cu_seqlens_kv": unpadded_cu,
            "cu_seqlens_q_padded": padded_cu,
            "cu_seqlens_kv_padded": padded_cu,
            "max_seqlen_q": max_seqlen,
            "max_seqlen_kv": max_seqlen,
        }


def layout_pack(
    sequences: Sequence[Sequence[int] | np.ndarray],
    loss_masks: Sequence[Sequence[bool] | np.ndarray | None] | None = None,
    labels: LabelConvention = "unshifted",
    pad_to_multiple_of: int | None = None,
    pad_id: int = 0,
) -> PackedSequence:
    """Lay sequences end to end into one pack.

    `loss_masks[i]` (same length as `sequences[i]`, True = supervised) masks prompt tokens; `None`
    supervises every token.

    >>> pack = layout_pack([[5, 6, 7], [8, 9]])
    >>> pack.position_ids.tolist(), pack.cu_seqlens.tolist(), pack.labels.tolist()
    ([0, 1, 2, 0, 1], [0, 3, 5], [-100, 6, 7, -100, 9])
    """
    if labels not in LABEL_CONVENTIONS:
        raise ValueError(f"unknown label convention {labels!r}; choose one of {', '.join(LABEL_CONVENTIONS)}")
    arrays = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    input_ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    total = len(input_ids)

    if loss_masks is None:
        supervised = np.ones(total, dtype=bool)
    else:
        if len(loss_masks) != len(arrays):
            raise ValueError(f"{len(loss_masks)} loss masks for {len(arrays)} sequences")
        parts = []
        for i, (mask, length) in enumerate(zip(loss_masks, lengths.tolist(), strict=True)):
            part = np.ones(length, dtype=bool) if mask is None else np.asarray(mask, dtype=bool).reshape(-1)
            if len(part) != length:
                raise ValueError(f"loss mask {i} has {len(part)} entries for a sequence of {length} tokens")
            parts.append(part)
        supervised = np.concatenate(parts) if parts else np.zeros(0, dtype=bool)

    cu_seqlens = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    seq_ids = np.repeat(np.arange(len(arrays), dtype=np.int32), lengths)
    position_ids = np.arange(total, dtype=np.int64) - np.repeat(cu_seqlens[:-1].astype(np.int64), lengths)

    label_ids = np.full(total, IGNORE_INDEX, dtype=np.int64)
    if labels == "unshifted":
        keep = supervised & (position_ids > 0)
        label_ids[keep] = input_ids[keep]
    elif total > 1:
        # Target of t is token t+1, when t+1 is in the same sequence and supervised.
        keep = supervised[1:] & (position_ids[1:] > 0)
        label_ids[:-1][keep] = input_ids[1:][keep]

    num_padding = 0
    if pad_to_multiple_of is not None:
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
        num_padding = -total % pad_to_multiple_of
    if num_padding:
        input_ids = np.concatenate((input_ids, np.full(num_padding, pad_id, dtype=np.int64)))
        label_ids = np.concatenate((label_ids, np.full(num_padding, IGNORE_INDEX, dtype=np.int64)))
        position_ids = np.concatenate((position_ids, np.arange(num_padding, dtype=np.int64)))
        seq_ids = np.concatenate((seq_ids, np.full(num_padding, -1, dtype=np.int32)))
        cu_seqlens = np.concatenate((cu_seqlens, [total + num_padding])).astype(np.int32)

    max_seqlen = int(np.diff(cu_seqlens).max()) if len(cu_seqlens) > 1 else 0
    return PackedSequence(input_ids, label_ids, position_ids, cu_seqlens, max_seqlen, seq_ids, num_padding)


def flatten_packs(packs: Sequence[PackedSequence]) -> PackedSequence:
    """Join packs into one long row, the padding-free batch layout of flash-attention varlen kernels.

    Boundaries shift by the lengths of the packs before; `seq_ids` keep counting across packs (padding
    stays -1); labels are already masked at every boundary, so joining adds no cross-pack target.
    """
    if not packs:
        return layout_pack([])
    lengths = np.array([len(p.input_ids) for p in packs], dtype=np.int64)
    shifts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    cu = [packs[0].cu_seqlens[:1]] + [
        p.cu_seqlens[1:].astype(np.int64) + shift for p, shift in zip(packs, shifts, strict=True)
    ]
    seq_shift = np.cumsum([0] + [len(p.cu_seqlens) - 1 - (p.num_padding > 0) for p in packs[:-1]])
    seq_ids = [
        np.where(p.seq_ids >= 0, p.seq_ids + shift, -1).astype(np.int32)
        for p, shift in zip(packs, seq_shift, strict=True)
    ]
    return PackedSequence(
        input_ids=np.concatenate([p.input_ids for p in packs]),
        labels=np.concatenate([p.labels for p in packs]),
        position_ids=np.concatenate([p.position_ids for p in packs]),
        cu_seqlens=np.concatenate(cu).astype(np.int32),
        max_seqlen=max(p.max_seqlen for p in packs),
        seq_ids=np.concatenate(seq_ids),
        num_padding=sum(p.num_padding for p in packs),
    )
