"""Parallel text for translation: length filter, length buckets with token-budget batch sizes, padded
batches and alignment matrices, as OpenNMT-tf's training pipeline makes them.

The conventions (OpenNMT-tf's; the source side is the "features", the target side the "labels"):

- the source is its tokens; the target becomes two sequences one token longer than the target text:
  `ids` with `<s>` prepended (the decoder's input) and `ids_out` with `</s>` appended (what it predicts);
- a pair is dropped when the source has no tokens or more than `maximum_features_length`, or when the
  target's `ids` (its tokens + 1: `<s>` counted, the length OpenNMT-tf's filter reads) are more than
  `maximum_labels_length`; a target without tokens is kept (`ids` is `<s>`, `ids_out` is `</s>`);
- a pair's bucket is `max(ceil(length / width) - 1, 0)` over the longer of the two sequences it is
  batched as (source tokens, target tokens + 1), so a bucket holds lengths `(k * width, (k + 1) * width]`
  (beyond OpenNMT-tf, `bucket_sides="both"` buckets each side, so the shorter side pads less too);
- in `tokens` mode bucket k's batch size is `batch_size // ((k + 1) * width)` (its longest pair fills
  the token budget), rounded down to a multiple of `batch_size_multiple * batch_multiplier` and at least
  that multiple; in `examples` mode every bucket takes `batch_size * batch_multiplier` pairs;
- a batch is padded to its longest source and its longest target; with `batch_multiplier` > 1 (the
  batch is split in that many parts), a batch whose size is not a multiple of it is dropped;
- an alignment line is pharaoh `i-j` pairs (source token i, target token j, 0-based); its matrix is
  float32 [target, source] with ones at the pairs, and is padded with the tokens of its batch.

Batching happens in energon (`cookers.energon_translation`, through `batch_group_criterion`); this
module holds the rules, and simulates the batching over length arrays for the padding report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from prep.alignment import pharaoh_pair

BatchType = Literal["examples", "tokens"]
BATCH_TYPES: tuple[str, ...] = ("examples", "tokens")
BucketSides = Literal["longer", "both"]
BUCKET_SIDES: tuple[str, ...] = ("longer", "both")
#: The target is batched one token longer than its text: `<s>` before `ids`, `</s>` after `ids_out`.
TARGET_MARKS = 1


def alignment_pairs(line: str) -> np.ndarray:
    """The (source, target) position pairs of a pharaoh alignment line, as an int64 [K, 2] array.

    >>> alignment_pairs("0-0 2-1").tolist()
    [[0, 0], [2, 1]]
    """
    words = line.split()
    pairs = np.zeros((len(words), 2), dtype=np.int64)
    for number, word in enumerate(words):
        pair = pharaoh_pair(word)
        if pair is None:
            raise ValueError(f"alignment pair {word!r} is not a pharaoh pair i-j (in {line!r})")
        pairs[number] = pair
    return pairs


def check_alignment(pairs: np.ndarray, source_length: int, target_length: int, line: str = "") -> None:
    """ValueError naming the first pair outside a `source_length` x `target_length` sentence pair."""
    outside = np.flatnonzero((pairs[:, 0] >= source_length) | (pairs[:, 1] >= target_length))
    if len(outside) == 0:
        return
    source, target = pairs[outside[0]].tolist()
    side = (
        f"source position {source} is past the {source_length} source tokens"
        if source >= source_length
        else f"target position {target} is past the {target_length} target tokens"
    )
    where = f" (in {line!r})" if line else ""
    raise ValueError(f"alignment pair '{source}-{target}' is out of range: {side}{where}")


def alignment_matrix_from_pharaoh(line: str, source_length: int, target_length: int) -> np.ndarray:
    """The alignment matrix of a pharaoh line: float32 [target_length, source_length], 1 at each pair.

    >>> alignment_matrix_from_pharaoh("0-0 1-1 2-2", 3, 3).tolist()
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    >>> alignment_matrix_from_pharaoh("0-1", 2, 3)[1].tolist()
    [1.0, 0.0]
    """
    pairs = alignment_pairs(line)
    check_alignment(pairs, source_length, target_length, line)
    matrix = np.zeros((target_length, source_length), dtype=np.float32)
    matrix[pairs[:, 1], pairs[:, 0]] = 1.0
    return matrix


def target_sequences(tokens: np.ndarray, bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The decoder's input `ids` (`<s>` + tokens) and its expected output `ids_out` (tokens + `</s>`).

    >>> [a.tolist() for a in target_sequences(np.array([29, 202, 498]), bos_id=1, eos_id=2)]
    [[1, 29, 202, 498], [29, 202, 498, 2]]
    """
    tokens = np.asarray(tokens)
    ids = np.concatenate((np.array([bos_id], dtype=tokens.dtype), tokens))
    ids_out = np.concatenate((tokens, np.array([eos_id], dtype=tokens.dtype)))
    return ids, ids_out


@dataclass(frozen=True)
class LengthLimits:
    """Which pairs training keeps, by OpenNMT-tf's filter: each side's length above 0 and within its
    maximum, the source as its tokens, the target as its `ids` (tokens + `TARGET_MARKS`). Callers give
    token counts without marks."""

    maximum_features_length: int | None = None
    maximum_labels_length: int | None = None

    def drop_reason(self, source_length: int, target_length: int) -> str | None:
        """Why a pair of these token counts is dropped (one of `DROP_REASONS`), or None to keep it.

        >>> LengthLimits(maximum_labels_length=4).drop_reason(3, 4)
        'target over maximum_labels_length'
        """
        if source_length == 0:
            return DROP_REASONS[0]
        if self.maximum_features_length is not None and source_length > self.maximum_features_length:
            return DROP_REASONS[1]
        labels_length = target_length + TARGET_MARKS
        if self.maximum_labels_length is not None and labels_length > self.maximum_labels_length:
            return DROP_REASONS[2]
        return None

    def keep(
        self, source_lengths: np.ndarray, target_lengths: np.ndarray
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Which pairs of these token counts are kept, and how many were dropped for each reason.

        >>> keep, dropped = LengthLimits(maximum_features_length=3).keep(np.array([2, 0, 5]), np.array([1, 1, 1]))
        >>> keep.tolist(), dropped
        ([True, False, False], {'empty source': 1, 'source over maximum_features_length': 1, 'target over maximum_labels_length': 0})
        """
        source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
        unlimited = np.iinfo(np.int64).max
        source_limit = unlimited if self.maximum_features_length is None else self.maximum_features_length
        target_limit = unlimited if self.maximum_labels_length is None else self.maximum_labels_length
        reasons = [
            source_lengths == 0,
            source_lengths > source_limit,
            target_lengths + TARGET_MARKS > target_limit,
        ]
        dropped, counts = np.zeros(len(source_lengths), dtype=bool), {}
        for reason, hit in zip(DROP_REASONS, reasons, strict=True):
            counts[reason] = int((hit & ~dropped).sum())  # each pair counted once, for its first reason
            dropped |= hit
        return ~dropped, counts


DROP_REASONS: tuple[str, ...] = (
    "empty source",
    "source over maximum_features_length",
    "target over maximum_labels_length",
)


@dataclass(frozen=True)
class LengthBuckets:
    """How pairs are grouped into batches: by length bucket, with a batch size per bucket.

    `batch_size` counts pairs (`examples`) or tokens of the longest pair times the batch size (`tokens`).
    `length_bucket_width` None puts every pair in one bucket (`examples` only). `bucket_sides` is
    `longer` (OpenNMT-tf: one bucket per length of the longer side) or `both` (one bucket per pair of
    source and target buckets: far less padding of the shorter side, for many more buckets waiting to
    fill); the batch size comes from the longer side either way.

    >>> buckets = LengthBuckets(100, "tokens", length_bucket_width=1, batch_size_multiple=8)
    >>> buckets.bucket_of(5), buckets.batch_size_of(4)
    (4, 16)
    """

    batch_size: int
    batch_type: BatchType = "examples"
    length_bucket_width: int | None = None
    batch_size_multiple: int = 1
    batch_multiplier: int = 1
    bucket_sides: BucketSides = "longer"

    def __post_init__(self) -> None:
        if self.batch_type not in BATCH_TYPES:
            raise ValueError(
                f"unknown batch_type {self.batch_type!r}; choose one of {', '.join(BATCH_TYPES)}"
            )
        if self.bucket_sides not in BUCKET_SIDES:
            raise ValueError(
                f"unknown bucket_sides {self.bucket_sides!r}; choose one of {', '.join(BUCKET_SIDES)}"
            )
        for name in ("batch_size", "batch_size_multiple", "batch_multiplier"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.length_bucket_width is not None and self.length_bucket_width < 1:
            raise ValueError(
                f"length_bucket_width must be at least 1 or None, got {self.length_bucket_width}"
            )
        if self.batch_type == "tokens" and self.length_bucket_width is None:
            raise ValueError(
                "batch_type 'tokens' needs a length_bucket_width: a bucket's batch size comes from its longest"
                " length"
            )

    @property
    def required_multiple(self) -> int:
        """Every bucket's batch size is a multiple of this in `tokens` mode."""
        return self.batch_size_multiple * self.batch_multiplier

    def bucket_of(self, length: int) -> int:
        """The bucket of a length: `max(ceil(length / width) - 1, 0)`, or 0 without buckets."""
        if self.length_bucket_width is None:
            return 0
        return max(-(-length // self.length_bucket_width) - 1, 0)

    def batch_size_of(self, bucket: int) -> int:
        """How many pairs a batch takes whose longer side is in this bucket."""
        if self.batch_type == "examples":
            return self.batch_size * self.batch_multiplier
        multiple = self.required_multiple
        size = self.batch_size * self.batch_multiplier // ((bucket + 1) * self.length_bucket_width)
        return max(size // multiple * multiple, multiple)

    def key_of(self, source_length: int, target_length: int) -> tuple[int | tuple[int, int], int]:
        """The bucket key of a pair batched as these lengths, and that bucket's batch size.

        >>> LengthBuckets(64, "tokens", 2).key_of(5, 9), LengthBuckets(64, "tokens", 2, bucket_sides="both").key_of(5, 9)
        ((4, 6), ((2, 4), 6))
        """
        size = self.batch_size_of(self.bucket_of(max(source_length, target_length)))
        if self.bucket_sides == "both":
            return (self.bucket_of(source_length), self.bucket_of(target_length)), size
        return self.bucket_of(max(source_length, target_length)), size

    def bucket_ids(self, lengths: np.ndarray) -> np.ndarray:
        """`bucket_of` over an array of lengths."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if self.length_bucket_width is None:
            return np.zeros(len(lengths), dtype=np.int64)
        return np.maximum(-(-lengths // self.length_bucket_width) - 1, 0)

    def batch_sizes(self, buckets: np.ndarray) -> np.ndarray:
        """`batch_size_of` over an array of (longer-side) bucket ids."""
        buckets = np.asarray(buckets, dtype=np.int64)
        if self.batch_type == "examples":
            return np.full(len(buckets), self.batch_size * self.batch_multiplier, dtype=np.int64)
        multiple = self.required_multiple
        sizes = self.batch_size * self.batch_multiplier // ((buckets + 1) * self.length_bucket_width)
        return np.maximum(sizes // multiple * multiple, multiple)

    def key_ids(self, source_lengths: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
        """`key_of` over arrays of batched lengths, each key as one int64."""
        longer = self.bucket_ids(np.maximum(source_lengths, target_lengths))
        if self.bucket_sides == "longer":
            return longer
        return (self.bucket_ids(source_lengths) << 32) | self.bucket_ids(target_lengths)

    def is_regular(self, size: int) -> bool:
        """Whether a batch of `size` pairs splits into `batch_multiplier` equal parts (else it is dropped)."""
        return size % self.batch_multiplier == 0


def batched_lengths(source_lengths: np.ndarray, target_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lengths pairs of these token counts are batched as: source tokens, target tokens + 1."""
    source = np.asarray(source_lengths, dtype=np.int64)
    return source, np.asarray(target_lengths, dtype=np.int64) + TARGET_MARKS


@dataclass(frozen=True)
class BatchPlan:
    """Batches of a stream of pairs: batch b is the pairs `order[offsets[b]:offsets[b + 1]]`."""

    order: np.ndarray
    offsets: np.ndarray
    #: The most pairs waiting in unfilled buckets at any one time.
    max_waiting: int

    @property
    def num_batches(self) -> int:
        return len(self.offsets) - 1

    def batches(self) -> list[list[int]]:
        """The pairs of every batch."""
        return [self.order[a:b].tolist() for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True)]


def group_into_batches(
    source_lengths: np.ndarray, target_lengths: np.ndarray, buckets: LengthBuckets, drop_last: bool = False
) -> BatchPlan:
    """The batches energon's grouped batching makes of a stream of pairs in one worker: each bucket's pairs
    in stream order, cut every batch size; the last, partial batch of a bucket is kept unless
    `drop_last`; irregular batches are dropped. Batches come ordered by bucket, not by when energon
    emits them (when full, the partial ones at the end).

    Lengths are the batched ones (`batched_lengths`).

    >>> plan = group_into_batches(np.array([3, 1, 3, 2, 3]), np.array([1, 1, 1, 1, 1]), LengthBuckets(2, length_bucket_width=2))
    >>> plan.batches(), plan.max_waiting
    ([[1, 3], [0, 2], [4]], 2)
    """
    source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
    key = buckets.key_ids(source_lengths, target_lengths)
    order = np.argsort(key, kind="stable")
    count = len(order)
    if count == 0:
        return BatchPlan(order, np.zeros(1, dtype=np.int64), 0)
    ordered = key[order]
    new_bucket = np.concatenate(([True], ordered[1:] != ordered[:-1]))
    run_starts = np.flatnonzero(new_bucket)
    run_lengths = np.diff(np.append(run_starts, count))
    position = np.arange(count) - np.repeat(run_starts, run_lengths)
    size = buckets.batch_sizes(buckets.bucket_ids(np.maximum(source_lengths, target_lengths)[order]))
    batch_in_run = position // size
    starts = np.flatnonzero(new_bucket | np.concatenate(([True], batch_in_run[1:] != batch_in_run[:-1])))
    offsets = np.append(starts, count)
    sizes = np.diff(offsets)
    full = sizes == size[starts]
    # A full batch leaves when its last pair arrives; the others wait to the end of the stream.
    left = np.zeros(count, dtype=np.int64)
    np.add.at(left, np.maximum.reduceat(order, starts)[full], sizes[full])
    max_waiting = int((np.arange(1, count + 1) - np.cumsum(left)).max())
    keep = sizes % buckets.batch_multiplier == 0
    if drop_last:
        keep &= full
    if not keep.all():
        order = order[np.repeat(keep, sizes)]
        offsets = np.concatenate(([0], np.cumsum(sizes[keep])))
    return BatchPlan(order, offsets, max_waiting)


@dataclass(frozen=True)
class PaddingFigures:
    """Padding of one batching configuration over a set of pairs."""

    width: int | None
    batch_type: str
    bucket_sides: str
    batches: int
    pairs: int
    #: Padding tokens over all tokens of all batches (source and target sides together).
    padding: float
    source_padding: float
    target_padding: float
    #: The mean, over batches, of each batch's padding fraction.
    mean_batch_padding: float
    max_batch_padding: float
    mean_batch_pairs: float
    mean_batch_tokens: float
    #: The most pairs waiting in unfilled buckets at once (one worker), a cost of many buckets.
    max_waiting: int


def batch_padding(
    source_lengths: np.ndarray, target_lengths: np.ndarray, buckets: LengthBuckets, width: int | None = None
) -> PaddingFigures:
    """Padding of the batches `group_into_batches` makes of pairs of these token counts (no marks)."""
    source, target = batched_lengths(source_lengths, target_lengths)
    plan = group_into_batches(source, target, buckets)
    if len(plan.order) == 0:
        return PaddingFigures(width, buckets.batch_type, buckets.bucket_sides, 0, 0, *[0.0] * 8, 0)
    starts, sizes = plan.offsets[:-1], np.diff(plan.offsets)
    source, target = source[plan.order], target[plan.order]
    real_source, real_target = np.add.reduceat(source, starts), np.add.reduceat(target, starts)
    padded_source = sizes * np.maximum.reduceat(source, starts)
    padded_target = sizes * np.maximum.reduceat(target, starts)
    real, padded = real_source + real_target, padded_source + padded_target
    fractions = 1.0 - real / padded
    return PaddingFigures(
        width=width,
        batch_type=buckets.batch_type,
        bucket_sides=buckets.bucket_sides,
        batches=len(sizes),
        pairs=len(plan.order),
        padding=float(1.0 - real.sum() / padded.sum()),
        source_padding=float(1.0 - real_source.sum() / padded_source.sum()),
        target_padding=float(1.0 - real_target.sum() / padded_target.sum()),
        mean_batch_padding=float(fractions.mean()),
        max_batch_padding=float(fractions.max()),
        mean_batch_pairs=float(sizes.mean()),
        mean_batch_tokens=float(padded.mean()),
        max_waiting=plan.max_waiting,
    )


def padding_report(
    source_lengths: Sequence[int] | np.ndarray,
    target_lengths: Sequence[int] | np.ndarray,
    batch_size: int,
    widths: Sequence[int | None] = (1, 2, 4, 8, None),
    batch_type: BatchType = "tokens",
    batch_size_multiple: int = 1,
    batch_multiplier: int = 1,
    bucket_sides: BucketSides = "longer",
) -> list[PaddingFigures]:
    """Padding of the batches for each bucket width, so that a width can be chosen from the data.

    Lengths are token counts without `<s>`/`</s>`. Width None means no buckets; in `tokens` mode it
    batches a fixed number of pairs instead, as many as the budget holds at the mean batched length.

    >>> figures = padding_report([5, 5, 9, 9], [5, 5, 9, 9], batch_size=20, widths=(1, None))
    >>> [(f.width, f.batches, round(f.padding, 2)) for f in figures]
    [(1, 2, 0.0), (None, 2, 0.0)]
    """
    source, target = batched_lengths(source_lengths, target_lengths)
    figures = []
    for width in widths:
        if width is None:
            pairs = (
                unbucketed_batch_size(source, target, batch_size) if batch_type == "tokens" else batch_size
            )
            buckets = LengthBuckets(pairs, batch_multiplier=batch_multiplier)
        else:
            buckets = LengthBuckets(
                batch_size, batch_type, width, batch_size_multiple, batch_multiplier, bucket_sides
            )
        figures.append(batch_padding(source_lengths, target_lengths, buckets, width))
    return figures


def unbucketed_batch_size(batched_source: np.ndarray, batched_target: np.ndarray, token_budget: int) -> int:
    """Pairs per batch without buckets in `tokens` mode: as many as `token_budget` holds at the mean
    batched length of the longer side.

    >>> unbucketed_batch_size(np.array([9, 19]), np.array([11, 21]), 64)
    4
    """
    mean = float(np.maximum(batched_source, batched_target).mean()) if len(batched_source) else 1.0
    return max(1, int(token_budget // max(mean, 1.0)))


def format_padding_report(figures: Sequence[PaddingFigures]) -> str:
    """The report as a table for people: one line per configuration."""
    lines = [
        f"{'width':>6} {'buckets':>7} {'batches':>8} {'pairs/b':>8} {'tokens/b':>8} {'padding':>8}"
        f" {'source':>7} {'target':>7} {'max/b':>7} {'waiting':>8}"
    ]
    for f in figures:
        width = "none" if f.width is None else str(f.width)
        sides = "-" if f.width is None else f.bucket_sides
        lines.append(
            f"{width:>6} {sides:>7} {f.batches:>8} {f.mean_batch_pairs:>8.1f} {f.mean_batch_tokens:>8.0f}"
            f" {100 * f.padding:>7.2f}% {100 * f.source_padding:>6.2f}% {100 * f.target_padding:>6.2f}%"
            f" {100 * f.max_batch_padding:>6.2f}% {f.max_waiting:>8}"
        )
    return "\n".join(lines)


def pad_sequences(sequences: Sequence[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequences padded to the longest, as int64 [B, max], and their lengths.

    >>> padded, lengths = pad_sequences([np.array([1, 2, 3]), np.array([4])], pad_id=0)
    >>> padded.tolist(), lengths.tolist()
    ([[1, 2, 3], [4, 0, 0]], [3, 1])
    """
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    padded = np.full((len(sequences), width), pad_id, dtype=np.int64)
    if len(sequences):
        mask = np.arange(width) < lengths[:, None]
        padded[mask] = np.concatenate(sequences)
    return padded, lengths


def shifted_targets(padded_ids: np.ndarray, lengths: np.ndarray, eos_id: int, pad_id: int) -> np.ndarray:
    """The padded `ids_out` of padded target `ids` (`<s>` first): each row one to the left, `</s>` last.

    The same as padding every `target_sequences(...)[1]`, without a second pass over the pairs.

    >>> shifted_targets(np.array([[1, 7, 8], [1, 9, 0]]), np.array([3, 2]), eos_id=2, pad_id=0).tolist()
    [[7, 8, 2], [9, 2, 0]]
    """
    shifted = np.full_like(padded_ids, pad_id)
    shifted[:, :-1] = padded_ids[:, 1:]
    shifted[np.arange(len(lengths)), lengths - 1] = eos_id
    return shifted


def pad_alignments(alignments: Sequence[np.ndarray], target_width: int, source_width: int) -> np.ndarray:
    """Alignment pairs (int [K, 2] of source, target positions) as float32 [B, target_width, source_width].

    Widths are those of the padded token batches, so row t of a matrix lines up with `ids_out[t]`.

    >>> pad_alignments([np.array([[0, 0], [1, 1]]), np.array([[0, 1]])], 3, 2)[1].tolist()
    [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    """
    matrices = np.zeros((len(alignments), target_width, source_width), dtype=np.float32)
    counts = [len(pairs) for pairs in alignments]
    if sum(counts):
        pairs = np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1, 2) for p in alignments])
        batch = np.repeat(np.arange(len(alignments)), counts)
        matrices[batch, pairs[:, 1], pairs[:, 0]] = 1.0
    return matrices
