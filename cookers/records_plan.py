"""The flush rules: which units (records, or groups in grouped mode) go into which example, from their sizes.

A plan is `(order, offsets)`: the unit indices in output order, and where each example starts in it.

- `next_fit` (the reference's rule): units in their order; the next unit joins the example unless the example
  holds `max_units` already or the next unit would take it past `room`. The first unit of an example always
  goes in (the callers have checked that it fits on its own).
- `best_fit`: best-fit decreasing under the same two limits: units longest first, each into the open example
  with the least room that still takes it; an example stops taking units at `max_units`. A unit larger than
  `room` (possible with the reference's grouped arithmetic) gets an example of its own. Examples come out in
  the order of their first unit, their units in input order.
- `sequential`: next-fit inside each run of units (one group's records, in one pass over the data), with a
  new budget drawn for every example; when the first record is larger than the budget drawn, the budget
  grows to take it (no record is ever refused by the draw).

>>> next_fit([3, 4, 2, 5], room=7, max_units=None)[1].tolist()
[0, 2, 4]
>>> order, offsets = best_fit([3, 4, 2, 5], room=7, max_units=None)
>>> [order[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
[[0, 1], [2, 3]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

Plan = tuple[np.ndarray, np.ndarray]


def next_fit(sizes: Sequence[int] | np.ndarray, room: int, max_units: int | None) -> Plan:
    """Units in order, a new example when the next would pass `room` or `max_units` are in."""
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = [0] if len(sizes) else []
    cap = max_units if max_units is not None else len(sizes) + 1
    fill, count = 0, 0
    for index, size in enumerate(sizes.tolist()):
        if count and (count == cap or fill + size > room):
            starts.append(index)
            fill, count = 0, 0
        fill += size
        count += 1
    offsets = np.asarray(starts + [len(sizes)], dtype=np.int64)
    return np.arange(len(sizes), dtype=np.int64), offsets


def best_fit(sizes: Sequence[int] | np.ndarray, room: int, max_units: int | None) -> Plan:
    """Best-fit decreasing with at most `max_units` units per example (see the module's text)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    n = len(sizes)
    by_size = np.argsort(-sizes, kind="stable")
    example_of = np.empty(n, dtype=np.int64)
    counts: list[int] = []
    by_room: dict[int, list[int]] = {}
    rooms = 0  # bit r is set while some open example has exactly r tokens of room left
    cap = max_units if max_units is not None else n + 1
    for unit, size in zip(by_size.tolist(), sizes[by_size].tolist(), strict=True):
        if size > room:
            example_of[unit] = len(counts)
            counts.append(cap)  # alone, and closed
            continue
        fitting = rooms >> size
        if fitting:
            left = size + (fitting & -fitting).bit_length() - 1
            stack = by_room[left]
            example = stack.pop()
            if not stack:
                rooms ^= 1 << left
        else:
            example, left = len(counts), room
            counts.append(0)
        example_of[unit] = example
        counts[example] += 1
        left -= size
        if counts[example] < cap:
            stack = by_room.get(left)
            if stack:
                stack.append(example)
            else:
                by_room[left] = [example]
                rooms |= 1 << left
    return _grouped_by_example(example_of, len(counts))


def sequential(
    sizes: Sequence[int] | np.ndarray,
    run_offsets: Sequence[int] | np.ndarray,
    max_units: int | None,
    budget: Callable[[int], int],
) -> Plan:
    """Next-fit inside each run `[run_offsets[k], run_offsets[k + 1])`, calling `budget(k)` once per example,
    in order, for its token budget.

    >>> sequential([5, 5, 5, 5, 9], [0, 3, 5], None, lambda run: 10)[1].tolist()
    [0, 2, 3, 4, 5]
    """
    sizes = np.asarray(sizes, dtype=np.int64).tolist()
    cap = max_units if max_units is not None else len(sizes) + 1
    starts: list[int] = []
    bounds = np.asarray(run_offsets, dtype=np.int64).tolist()
    for run, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        index = lo
        while index < hi:
            starts.append(index)
            limit = max(budget(run), sizes[index])
            fill, count = 0, 0
            while index < hi and count < cap and fill + sizes[index] <= limit:
                fill += sizes[index]
                count += 1
                index += 1
    offsets = np.asarray(starts + [len(sizes)], dtype=np.int64)
    return np.arange(len(sizes), dtype=np.int64), offsets


def _grouped_by_example(example_of: np.ndarray, num_examples: int) -> Plan:
    """(order, offsets) from each unit's example: examples by first unit, units in input order."""
    n = len(example_of)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64)
    first = np.full(num_examples, n, dtype=np.int64)
    np.minimum.at(first, example_of, np.arange(n, dtype=np.int64))
    rank = np.empty(num_examples, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(num_examples, dtype=np.int64)
    ranked = rank[example_of]
    order = np.argsort(ranked, kind="stable")
    offsets = np.concatenate(([0], np.cumsum(np.bincount(ranked, minlength=num_examples))))
    return order.astype(np.int64), offsets.astype(np.int64)
