"""Packing a whole tokenized corpus at once: documents held as one flat token array plus offsets (the
Arrow list layout), packed rows returned the same way.

This is the offline (or windowed) counterpart of the energon task encoder, for corpora that fit in memory
and for the benchmark against TRL's `pack_dataset`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cookers.packing import Algorithm, OverlongPolicy, PackPlan, plan_packs_in_windows


@dataclass(frozen=True)
class PackedRows:
    """Packed rows: row r is `tokens[row_offsets[r]:row_offsets[r + 1]]`; its documents' lengths are
    `seq_lengths[seq_offsets[r]:seq_offsets[r + 1]]`."""

    tokens: np.ndarray
    row_offsets: np.ndarray
    seq_lengths: np.ndarray
    seq_offsets: np.ndarray

    @property
    def num_rows(self) -> int:
        """Number of packed rows."""
        return len(self.row_offsets) - 1


def pack_token_arrays(
    tokens: np.ndarray,
    offsets: np.ndarray,
    seq_length: int,
    algorithm: Algorithm = "bfd",
    overlong: OverlongPolicy = "error",
    window: int | None = None,
) -> PackedRows:
    """Pack documents `tokens[offsets[i]:offsets[i + 1]]` into rows of at most `seq_length` tokens.

    `window` packs that many documents at a time (a loader's packing buffer); None packs all at once.

    >>> rows = pack_token_arrays(np.arange(9), np.array([0, 3, 8, 9]), seq_length=5)
    >>> [rows.tokens[a:b].tolist() for a, b in zip(rows.row_offsets[:-1], rows.row_offsets[1:])]
    [[0, 1, 2, 8], [3, 4, 5, 6, 7]]
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    plan = plan_packs_in_windows(np.diff(offsets), seq_length, window, algorithm, overlong)
    return gather_rows(tokens, offsets, plan)


def gather_rows(tokens: np.ndarray, offsets: np.ndarray, plan: PackPlan) -> PackedRows:
    """Copy the plan's pieces out of the flat token array into packed rows (no copy when they are in place)."""
    lengths = plan.piece_lengths()
    sources = offsets[plan.documents] + plan.starts
    piece_offsets = np.concatenate(([0], np.cumsum(lengths)))
    row_offsets = piece_offsets[plan.bin_offsets]
    total = int(piece_offsets[-1])
    base = int(offsets[0]) if len(offsets) else 0
    if np.array_equal(sources, piece_offsets[:-1] + base):
        # The pieces already lie in order in the source (concat, or one window of next-fit): a view.
        packed = tokens[base : base + total]
    else:
        # One view per piece and one concatenate: cheaper than a Python loop of slice assignments.
        views = [tokens[s : s + n] for s, n in zip(sources.tolist(), lengths.tolist(), strict=True)]
        packed = np.concatenate(views) if views else tokens[:0].copy()
    return PackedRows(packed, row_offsets, lengths, plan.bin_offsets)
