"""Packing documents into bins of at most `seq_length` tokens, looking only at their lengths.

A packing is a *plan*: a list of pieces (document index, first token, end token) grouped by bin. A piece
is a whole document unless the over-long policy cut it (`truncate`, `chunk`) or the `concat` algorithm
streamed across it. Turning a plan into token arrays is `cookers.packed_layout`'s job.

Algorithms:

- `bfd`: best-fit decreasing. Documents sorted longest first; each goes into the open bin whose room is
  the smallest that still fits it. Open bins are indexed by their room in a bitmap (one Python int of
  `seq_length + 1` bits) plus a stack of bins per room, so finding the best fit is one shift and one
  lowest-set-bit: O(n log n) for the sort plus O(seq_length / 64) word operations per document.
- `ffd`: first-fit decreasing. Each document goes into the oldest open bin that fits it, found by a
  descent in a segment tree of bin rooms (O(log n) per document).
- `next_fit`: documents in their order; a new bin opens when the current one cannot take the next.
- `concat`: documents in their order as one stream, cut every `seq_length` tokens; document boundaries
  inside a bin are kept as separate pieces.

Everything is deterministic: equal inputs give equal plans.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Algorithm = Literal["bfd", "ffd", "next_fit", "concat"]
OverlongPolicy = Literal["error", "truncate", "chunk"]

ALGORITHMS: tuple[str, ...] = ("bfd", "ffd", "next_fit", "concat")
OVERLONG_POLICIES: tuple[str, ...] = ("error", "truncate", "chunk")
#: Earlier names of over-long policies, still accepted: `split` is `chunk` ("split" means train/val/test).
_OVERLONG_ALIASES = {"split": "chunk"}


class OverlongDocumentError(ValueError):
    """A document is longer than the sequence length and the over-long policy is `error`."""


@dataclass(frozen=True)
class PackPlan:
    """Pieces of documents grouped into bins.

    The pieces of bin `b` are `range(bin_offsets[b], bin_offsets[b + 1])`; piece `i` is the token range
    `[starts[i], stops[i])` of document `documents[i]`.
    """

    documents: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    bin_offsets: np.ndarray
    seq_length: int

    @property
    def num_bins(self) -> int:
        """How many bins (packs) the plan has."""
        return len(self.bin_offsets) - 1

    def piece_lengths(self) -> np.ndarray:
        """Token count of every piece, in plan order."""
        return self.stops - self.starts

    def bin_lengths(self) -> np.ndarray:
        """Token count of every bin."""
        cumulative = np.concatenate(([0], np.cumsum(self.piece_lengths())))
        return cumulative[self.bin_offsets[1:]] - cumulative[self.bin_offsets[:-1]]

    def utilisation(self) -> float:
        """Real tokens divided by `num_bins * seq_length` (1.0 for an empty plan)."""
        if self.num_bins == 0:
            return 1.0
        return float(self.piece_lengths().sum()) / (self.num_bins * self.seq_length)

    def bin_pieces(self, b: int) -> list[tuple[int, int, int]]:
        """The pieces of bin `b` as `(document, start, stop)` tuples."""
        lo, hi = int(self.bin_offsets[b]), int(self.bin_offsets[b + 1])
        return list(
            zip(
                self.documents[lo:hi].tolist(),
                self.starts[lo:hi].tolist(),
                self.stops[lo:hi].tolist(),
                strict=True,
            )
        )

    def bins(self) -> list[list[int]]:
        """The document indices of every bin (a chunked document appears in several bins)."""
        docs = self.documents.tolist()
        offsets = self.bin_offsets.tolist()
        return [docs[offsets[b] : offsets[b + 1]] for b in range(self.num_bins)]

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        return (self.bin_pieces(b) for b in range(self.num_bins))


def plan_packs(
    lengths: Sequence[int] | np.ndarray,
    seq_length: int,
    algorithm: Algorithm = "bfd",
    overlong: OverlongPolicy = "error",
    names: Sequence[str] | None = None,
    seed: int | None = None,
) -> PackPlan:
    """Plan how documents of the given lengths go into bins of at most `seq_length` tokens.

    Bins come out ordered by their first document (so packs follow the input order roughly), or
    shuffled by `seed` when one is given. Inside a bin, pieces follow the input order.
    `overlong` says what happens to a document longer than `seq_length`: `error` raises
    `OverlongDocumentError` naming it (by `names[i]` when given), `truncate` keeps its first
    `seq_length` tokens, `chunk` cuts it into `seq_length`-token pieces that are packed like documents.
    `concat` never needs the policy: it cuts every document where the stream crosses a bin edge.

    >>> plan_packs([3, 5, 2, 4], seq_length=7).bins()
    [[0, 3], [1, 2]]
    """
    if seq_length < 1:
        raise ValueError(f"seq_length must be at least 1, got {seq_length}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown packing algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    overlong = overlong_policy(overlong)
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if len(lengths) and lengths.min() < 0:
        raise ValueError("document lengths must not be negative")

    if algorithm == "concat":
        documents, starts, stops, bin_of_piece = _concat_pieces(lengths, seq_length)
    else:
        documents, starts, stops = fit_pieces(lengths, seq_length, overlong, names)
        bin_of_piece = _ASSIGNERS[algorithm](stops - starts, seq_length)
    return _plan_from_assignment(documents, starts, stops, bin_of_piece, seq_length, seed)


def plan_packs_in_windows(
    lengths: Sequence[int] | np.ndarray,
    seq_length: int,
    window: int | None,
    algorithm: Algorithm = "bfd",
    overlong: OverlongPolicy = "error",
    names: Sequence[str] | None = None,
) -> PackPlan:
    """Plan packs window by window, as a loader with a packing buffer of `window` documents does.

    `window=None` packs everything at once (offline). Document indices in the result are global.
    """
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if window is None or window >= len(lengths):
        return plan_packs(lengths, seq_length, algorithm, overlong, names)
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    parts: list[PackPlan] = []
    for lo in range(0, len(lengths), window):
        part = plan_packs(
            lengths[lo : lo + window],
            seq_length,
            algorithm,
            overlong,
            None if names is None else names[lo : lo + window],
        )
        parts.append(PackPlan(part.documents + lo, part.starts, part.stops, part.bin_offsets, seq_length))
    return concatenate_plans(parts, seq_length)


def concatenate_plans(parts: Sequence[PackPlan], seq_length: int) -> PackPlan:
    """Join plans bin list after bin list (document indices are taken as they are)."""
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return PackPlan(empty, empty, empty, np.zeros(1, dtype=np.int64), seq_length)
    piece_counts = np.cumsum([0] + [len(p.documents) for p in parts[:-1]])
    offsets = [parts[0].bin_offsets[:1]] + [
        p.bin_offsets[1:] + shift for p, shift in zip(parts, piece_counts, strict=True)
    ]
    return PackPlan(
        np.concatenate([p.documents for p in parts]),
        np.concatenate([p.starts for p in parts]),
        np.concatenate([p.stops for p in parts]),
        np.concatenate(offsets),
        seq_length,
    )


def overlong_policy(name: str) -> OverlongPolicy:
    """The over-long policy called `name` (an earlier name is taken for today's); ValueError if none.

    >>> overlong_policy("truncate"), overlong_policy("split")
    ('truncate', 'chunk')
    """
    name = _OVERLONG_ALIASES.get(name, name)
    if name not in OVERLONG_POLICIES:
        raise ValueError(f"unknown over-long policy {name!r}; choose one of {', '.join(OVERLONG_POLICIES)}")
    return name  # type: ignore[return-value]


def fit_pieces(
    lengths: np.ndarray, seq_length: int, overlong: OverlongPolicy, names: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces (document, start, stop) of documents of `lengths` after the over-long policy: the one
    place the policy is applied, for whole corpora and for one document at a time (the task encoder).

    >>> fit_pieces(np.array([3, 10]), 4, "chunk")
    (array([0, 1, 1, 1]), array([0, 0, 4, 8]), array([ 3,  4,  8, 10]))
    """
    overlong = overlong_policy(overlong)
    too_long = np.flatnonzero(lengths > seq_length)
    documents = np.arange(len(lengths), dtype=np.int64)
    starts = np.zeros(len(lengths), dtype=np.int64)
    if len(too_long) == 0 or overlong == "truncate":
        return documents, starts, np.minimum(lengths, seq_length)
    if overlong == "error":
        first = int(too_long[0])
        name = names[first] if names is not None else f"document #{first}"
        more = f" ({len(too_long) - 1} more over-long documents follow)" if len(too_long) > 1 else ""
        raise OverlongDocumentError(
            f"{name} has {int(lengths[first])} tokens, more than the sequence length {seq_length}{more}; "
            "use the over-long policy 'truncate' or 'chunk' to pack it"
        )
    # chunk: piece k of a document covers [k * seq_length, min((k + 1) * seq_length, length)).
    counts = np.maximum(1, -(-lengths // seq_length))
    documents = np.repeat(documents, counts)
    first_piece = np.cumsum(counts) - counts
    piece_number = np.arange(len(documents), dtype=np.int64) - np.repeat(first_piece, counts)
    starts = piece_number * seq_length
    stops = np.minimum(starts + seq_length, lengths[documents])
    return documents, starts, stops


def _concat_pieces(
    lengths: np.ndarray, seq_length: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut the stream of documents every `seq_length` tokens; returns pieces and their bin."""
    ends = np.cumsum(lengths)
    begins = ends - lengths
    # A document is cut once per bin edge strictly inside it.
    # An empty document joins the bin of the token before it, so it never opens a bin of its own.
    first_bin = np.where(lengths > 0, begins, np.maximum(begins - 1, 0)) // seq_length
    last_bin = np.where(lengths > 0, (ends - 1) // seq_length, first_bin)
    counts = last_bin - first_bin + 1
    documents = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    first_piece = np.cumsum(counts) - counts
    bins = np.repeat(first_bin, counts) + (
        np.arange(len(documents), dtype=np.int64) - np.repeat(first_piece, counts)
    )
    doc_begin = begins[documents]
    stream_start = np.maximum(bins * seq_length, doc_begin)
    stream_stop = np.minimum((bins + 1) * seq_length, ends[documents])
    return documents, stream_start - doc_begin, stream_stop - doc_begin, bins


def _plan_from_assignment(
    documents: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    bin_of_piece: np.ndarray,
    seq_length: int,
    seed: int | None,
) -> PackPlan:
    """Group pieces by bin; order bins by their first piece (or shuffle them by seed)."""
    num_pieces = len(documents)
    if num_pieces == 0:
        return concatenate_plans([], seq_length)
    # Pieces are in input order, so a bin's first piece is its minimum piece index.
    num_bins = int(bin_of_piece.max()) + 1
    first_piece = np.full(num_bins, num_pieces, dtype=np.int64)
    np.minimum.at(first_piece, bin_of_piece, np.arange(num_pieces, dtype=np.int64))
    bin_order = np.argsort(first_piece, kind="stable")
    if seed is not None:
        bin_order = np.random.default_rng(seed).permutation(bin_order)
    rank = np.empty(num_bins, dtype=np.int64)
    rank[bin_order] = np.arange(num_bins, dtype=np.int64)
    ranked = rank[bin_of_piece]
    order = np.argsort(ranked, kind="stable")
    counts = np.bincount(ranked, minlength=num_bins)
    bin_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return PackPlan(documents[order], starts[order], stops[order], bin_offsets, seq_length)


def _best_fit_decreasing(sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Bin index of every item under best-fit decreasing (all sizes at most `capacity`)."""
    order = np.argsort(-sizes, kind="stable")
    bin_of_sorted: list[int] = []
    place = bin_of_sorted.append
    bins_by_room: dict[int, list[int]] = {}
    rooms = 0  # bit r is set while some open bin has exactly r tokens of room
    num_bins = 0
    for size in sizes[order].tolist():
        fitting = rooms >> size
        if fitting:
            room = size + (fitting & -fitting).bit_length() - 1
            stack = bins_by_room[room]
            b = stack.pop()
            if not stack:
                rooms ^= 1 << room
        else:
            b = num_bins
            num_bins += 1
            room = capacity
        place(b)
        room -= size
        stack = bins_by_room.get(room)
        if stack:
            stack.append(b)
        else:
            bins_by_room[room] = [b]
            rooms |= 1 << room
    result = np.empty(len(order), dtype=np.int64)
    result[order] = bin_of_sorted
    return result


def _first_fit_decreasing(sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Bin index of every item under first-fit decreasing, via a max segment tree over bin rooms."""
    n = len(sizes)
    order = np.argsort(-sizes, kind="stable")
    leaves = 1 << max(0, (n - 1).bit_length())
    # Every leaf starts with full room: the leftmost never-used leaf is the next new bin.
    tree = [capacity] * (2 * leaves)
    bin_of_sorted = [0] * n
    for i, size in enumerate(sizes[order].tolist()):
        node = 1
        while node < leaves:
            node <<= 1
            if tree[node] < size:
                node += 1
        bin_of_sorted[i] = node - leaves
        tree[node] -= size
        node >>= 1
        while node:
            left, right = tree[node << 1], tree[(node << 1) + 1]
            tree[node] = left if left >= right else right
            node >>= 1
    result = np.empty(n, dtype=np.int64)
    result[order] = bin_of_sorted
    return result


def _next_fit(sizes: np.ndarray, capacity: int) -> np.ndarray:
    """Bin index of every item under next-fit in input order."""
    result = [0] * len(sizes)
    b, fill = 0, 0
    for i, size in enumerate(sizes.tolist()):
        if fill + size > capacity and i > 0:
            b += 1
            fill = 0
        fill += size
        result[i] = b
    return np.asarray(result, dtype=np.int64)


_ASSIGNERS = {"bfd": _best_fit_decreasing, "ffd": _first_fit_decreasing, "next_fit": _next_fit}
