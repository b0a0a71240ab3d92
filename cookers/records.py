"""Record assembly: tabular records (JSON objects) into training examples, as NeMo Safe Synthesizer's
assemblers make them (reference/safe-synthesizer-example-assembly.md), token for token by default.

Two entry points over the same stages:

- `assemble_records`: a whole dataset at once, the reference's pass: split, shuffle (with the reference's
  own random stream, so `seed` gives Safe Synthesizer's examples), repeat for `data_fraction`, assemble.
- `assemble_stream`: records as a loader hands them over, a window at a time (energon's packing buffer), in
  the given order; what `cookers.energon_records.RecordAssemblyTaskEncoder` computes inside energon.

The stages of `assemble_records`, in order; every check is done before the first example is made:

1. columns and layout (`records_layout.RecordLayout`): the schema, the prompt, the budget arithmetic;
   PromptTooLongError, MissingColumnError;
2. records to tokens, each record on its own; RecordSchemaError, RecordTooLongError;
3. groups (grouped, sequential): records gathered by group value, groups sorted by value (the reference's
   order; first appearance with `shuffle=False`), records inside a group by `order_by` (stable);
   GroupTooLongError;
4. split (`test_size`): records, or whole groups; SplitTooLargeError below 100 training records;
5. passes: `data_fraction` copies, each shuffled by a fresh permutation of the reference's random stream
   (`numpy.random.default_rng(seed)`, drawn as Hugging Face's `Dataset.shuffle` draws it), the fractional part
   a prefix; sequential mode never shuffles and flushes at each restart;
6. flush rules (`records_plan`): next-fit (the reference), best-fit, or sequential cuts under drawn budgets;
7. layout of the examples, statistics, the sequential initial prefill.

A character-level tokenizer (id = code point, BOS 2, EOS 3) shows the layout:

>>> from tokenizers import Regex, Tokenizer, models, pre_tokenizers
>>> chars = Tokenizer(models.WordLevel({chr(i): i for i in range(128)}, unk_token="\\x00"))
>>> chars.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\\s\\S]"), "isolated")
>>> tokenizer = TokenizerAdapter(chars, bos_id=2, eos_id=3)
>>> rows = [{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "c", "v": 3}]
>>> result = assemble_records(rows, tokenizer, max_seq_length=60, max_sequences_per_example=2, shuffle=False,
...                           prompt_template="{schema}")
>>> [bytes(example.input_ids.tolist()) for example in result.train]  # doctest: +NORMALIZE_WHITESPACE
[b'\\x02"id":<unk>,"v":<unk>\\x03\\x02{"id":"a","v":1}\\n{"id":"b","v":2}\\n\\x03',
 b'\\x02"id":<unk>,"v":<unk>\\x03\\x02{"id":"c","v":3}\\n\\x03']
>>> result.train[1].labels[:24].tolist().count(-100), result.stats["records_per_example"].total
(22, 3)
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal

import numpy as np

from cookers import records_plan
from cookers.records_errors import (
    GroupTooLongError,
    MissingColumnError,
    RecordSchemaError,
    SplitTooLargeError,
)
from cookers.records_layout import RecordExample, RecordLayout, TokenizedRecords
from cookers.records_options import (
    DEFAULT_INSTRUCTION,
    DEFAULT_PROMPT_TEMPLATE,
    FILL_RATIO,
    AssemblyOptions,
    Mode,
    Packing,
)
from cookers.tokenizer import TokenizerAdapter

#: The reference keeps at least this many training records when it splits off validation records.
MIN_TRAIN_RECORDS = 100
#: Sequential mode's prefill holds this many records of each group.
PREFILL_RECORDS = 3
#: assemble_stream tokenizes at least this many records at once (whole groups) in sequential mode.
_STREAM_BATCH_RECORDS = 4096
#: A second random stream, for the split, so the reference's stream stays as the reference draws it.
_SPLIT_STREAM = 1


@dataclass(frozen=True)
class Summary:
    """count, total, min, max (and mean) of one statistic."""

    count: int = 0
    total: int = 0
    min: int = 0
    max: int = 0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    @classmethod
    def of(cls, values: Sequence[int] | np.ndarray) -> Summary:
        values = np.asarray(values, dtype=np.int64)
        if len(values) == 0:
            return cls()
        return cls(len(values), int(values.sum()), int(values.min()), int(values.max()))


@dataclass(frozen=True)
class RecordAssembly:
    """What `assemble_records` made: the examples of both splits, statistics of the training examples, and
    sequential mode's prefill (group value -> the text of its first 3 training records)."""

    train: list[RecordExample]
    validation: list[RecordExample]
    stats: dict[str, Summary]
    initial_prefill: dict[object, str] = field(default_factory=dict)
    layout: RecordLayout | None = None


def assemble_records(
    records: Iterable[Mapping],
    tokenizer: TokenizerAdapter,
    mode: Mode = "tabular",
    max_seq_length: int = 2048,
    max_sequences_per_example: int | Literal["auto"] | None = "auto",
    group_by: str | None = None,
    order_by: str | None = None,
    shuffle: bool = True,
    seed: int = 0,
    test_size: int | float | None = None,
    data_fraction: float = 1.0,
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
    instruction: str = DEFAULT_INSTRUCTION,
    add_bos_token_to_prompt: bool = True,
    add_eos_token_to_prompt: bool = True,
    *,
    exact_budget: bool = False,
    packing: Packing = "next_fit",
    differential_privacy: bool = False,
    columns: Sequence[str] | None = None,
    randomize_budget: bool = True,
) -> RecordAssembly:
    """Assemble training (and validation) examples from records, as Safe Synthesizer does.

    `records` are dicts (column order kept; the first record's keys are the schema unless `columns` says);
    `tokenizer`'s `bos_id`/`eos_id` frame the blocks, its own `add_bos`/`add_eos` are not used. `mode` is
    `tabular`, `grouped` (needs `group_by`) or `sequential` (`group_by` optional: one group; `order_by`
    optional: the given order); `select_mode` picks it as the reference does. `max_sequences_per_example`
    caps the units of an example (records; groups in grouped mode): "auto" is 10, or 1 with
    `differential_privacy`; None is no cap. `shuffle=False` keeps the given record (and group) order.
    `test_size`: records (groups in the grouped and sequential modes) for validation, as a count or a
    fraction. `data_fraction` > 1 repeats the training data (the guide's "dataset restart"). `exact_budget`
    replaces the reference's arithmetic with the true token counts; `packing="best_fit"` packs tabular
    records or groups best-fit decreasing instead of next-fit. `randomize_budget=False` fills sequential
    training examples to the full budget, as validation examples are.
    """
    options = AssemblyOptions(
        mode=mode,
        max_seq_length=max_seq_length,
        max_sequences_per_example=max_sequences_per_example,
        differential_privacy=differential_privacy,
        group_by=group_by,
        order_by=order_by,
        packing=packing,
        exact_budget=exact_budget,
        prompt_template=prompt_template,
        instruction=instruction,
        add_bos_token_to_prompt=add_bos_token_to_prompt,
        add_eos_token_to_prompt=add_eos_token_to_prompt,
        columns=tuple(columns) if columns is not None else None,
        seed=seed,
        randomize_budget=randomize_budget,
    )
    if not data_fraction > 0:
        raise ValueError(f"data_fraction must be positive, got {data_fraction}")
    rows = records if isinstance(records, list) else list(records)
    table = _Table.read(rows, tokenizer, options, _position_name, sort_groups=shuffle)
    train_units, validation_units = table.split(test_size)
    rng = np.random.default_rng(seed)
    if mode == "tabular":
        train = table.tabular(_passes(train_units, data_fraction, shuffle, rng))
        validation = table.tabular(_passes(validation_units, 1.0, shuffle, rng))
    elif mode == "grouped":
        train = table.grouped(table.grouped_passes(train_units, data_fraction, shuffle, rng))
        validation = table.grouped(_passes(validation_units, 1.0, shuffle, rng))
    else:
        draws = rng if randomize_budget else None
        train = table.sequential(table.sequential_passes(train_units, data_fraction), draws)
        validation = table.sequential([table.records_of(validation_units)], None)
    return RecordAssembly(
        train=train,
        validation=validation,
        stats=table.stats(train, train_units),
        initial_prefill=table.prefill(train_units) if mode == "sequential" else {},
        layout=table.layout,
    )


def assemble_stream(
    records: Iterable[Mapping],
    tokenizer: TokenizerAdapter,
    options: AssemblyOptions,
    *,
    window: int | None = None,
    names: Iterable[str] | None = None,
) -> Iterator[RecordExample]:
    """Examples of records in the order given, assembled `window` units at a time (records in tabular mode,
    groups in grouped mode; None: all at once), as a loader's packing buffer does: no split, no shuffle, no
    repetition (the loader does those). A group is a run of consecutive records with one group value.
    Sequential mode draws each group's budgets from its own stream (seeded by `options.seed` and the group
    value), so a group's examples do not depend on what came before it. Each window is checked before its
    examples are yielded; `names` (one per record) name records in errors.
    """
    if window is not None and window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    rows = iter(records)
    named = iter(names) if names is not None else None
    head = list(islice(rows, 1))
    if not head:
        return
    columns = options.columns if options.columns is not None else tuple(head[0])
    layout = layout_for(options, tokenizer, columns)
    stream = _chain(head, rows)
    if options.mode == "tabular":
        for chunk, chunk_names in _chunks(stream, named, window):
            table = _Table.of(chunk, layout, _names(chunk_names))
            yield from table.tabular([np.arange(len(chunk), dtype=np.int64)])
        return
    groups = _group_runs(stream, named, options.group_by)
    if options.mode == "grouped":
        for chunk in _batched(groups, window, None):
            table = _Table.of_runs(chunk, layout)
            yield from table.grouped([np.arange(len(chunk), dtype=np.int64)])
        return
    for chunk in _batched(groups, None, _STREAM_BATCH_RECORDS):
        table = _Table.of_runs(chunk, layout)
        yield from table.sequential([table.record_order], None, per_group=options.randomize_budget)


# -- the pieces a loader uses, one record or one group at a time ----------------------------------------------


def layout_for(options: AssemblyOptions, tokenizer: TokenizerAdapter, columns: Sequence[str]) -> RecordLayout:
    """The layout of records with these columns, after checking the group and order columns are among them."""
    layout = RecordLayout.build(options, tokenizer, columns)
    _check_columns(options, tuple(columns))
    return layout


def plan_units(options: AssemblyOptions, sizes: Sequence[int] | np.ndarray, room: int) -> records_plan.Plan:
    """The flush rule the options choose (next-fit or best-fit) over units of these sizes."""
    if options.packing == "best_fit":
        return records_plan.best_fit(sizes, room, options.max_sequences)
    return records_plan.next_fit(sizes, room, options.max_sequences)


def tokenize_group(
    layout: RecordLayout, value: object, rows: Sequence[Mapping], names: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """One group's record tokens, records in `order_by` order, and that order (indices into `rows`);
    GroupTooLongError (grouped mode) when the group cannot fit an example alone, MissingColumnError naming a
    record without a value in the group column."""
    _group_keys(rows, layout.options.group_by, names.__getitem__)
    table = _Table.of_runs([(value, list(rows), list(names))], layout)
    tokens, offsets = table.tokens.tokens, table.tokens.offsets
    pieces = [tokens[offsets[i] : offsets[i + 1]] for i in table.record_order.tolist()]
    return (np.concatenate(pieces) if pieces else tokens[:0]), table.record_order


def sequential_examples(
    layout: RecordLayout, value: object, rows: Sequence[Mapping], names: Sequence[str]
) -> tuple[list[RecordExample], np.ndarray]:
    """One group's examples in sequential mode, budgets drawn from the group's own stream, and the order of
    the records in them (indices into `rows`, `order_by` order): example k holds the next `num_records`.
    MissingColumnError names a record without a value in the group column."""
    _group_keys(rows, layout.options.group_by, names.__getitem__)
    table = _Table.of_runs([(value, list(rows), list(names))], layout)
    examples = table.sequential([table.record_order], None, per_group=layout.options.randomize_budget)
    return examples, table.record_order


# -- the table of one assembly ------------------------------------------------------------------------------


@dataclass
class _Table:
    """Records tokenized once, and (grouped, sequential) gathered into groups: group `g` is
    `record_order[group_offsets[g]:group_offsets[g + 1]]`, its value `group_values[g]`."""

    rows: Sequence[Mapping]
    layout: RecordLayout
    tokens: TokenizedRecords
    record_order: np.ndarray
    group_offsets: np.ndarray
    group_values: list

    @property
    def options(self) -> AssemblyOptions:
        return self.layout.options

    @classmethod
    def read(
        cls,
        rows: Sequence[Mapping],
        tokenizer: TokenizerAdapter,
        options: AssemblyOptions,
        name: Callable[[int], str],
        sort_groups: bool,
    ) -> _Table:
        """Stages 1-3 of `assemble_records` over a whole dataset."""
        columns = options.columns if options.columns is not None else (tuple(rows[0]) if rows else ())
        layout = layout_for(options, tokenizer, columns)
        if options.mode == "tabular":
            return cls.of(rows, layout, name)
        keys = _group_keys(rows, options.group_by, name)
        record_order, group_offsets, group_values = _gather(keys, sort_groups)
        table = cls(rows, layout, layout.tokenize(rows, name), record_order, group_offsets, group_values)
        table._order_within_groups(name)
        table._check_groups()
        return table

    @classmethod
    def of(cls, rows: Sequence[Mapping], layout: RecordLayout, name: Callable[[int], str]) -> _Table:
        """A table of ungrouped records (tabular)."""
        n = len(rows)
        order = np.arange(n, dtype=np.int64)
        return cls(rows, layout, layout.tokenize(rows, name), order, np.array([0, n], dtype=np.int64), [None])

    @classmethod
    def of_runs(cls, runs: Sequence[tuple[object, list[Mapping], Sequence]], layout: RecordLayout) -> _Table:
        """A table of groups given as (value, records, names) runs, records kept together in run order; a
        name that is a position is made into text only when an error needs it."""
        rows = [row for _, group_rows, _ in runs for row in group_rows]
        all_names: list = []
        for _, _, group_names in runs:
            all_names.extend(group_names)
        sizes = [len(group_rows) for _, group_rows, _ in runs]

        def name(index: int) -> str:
            found = all_names[index]
            return found if isinstance(found, str) else _position_name(found)

        table = cls(
            rows,
            layout,
            layout.tokenize(rows, name),
            np.arange(len(rows), dtype=np.int64),
            np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
            [value for value, _, _ in runs],
        )
        table._order_within_groups(name)
        table._check_groups()
        return table

    # -- stage 3: groups ---------------------------------------------------------------------------------
    def _order_within_groups(self, name: Callable[[int], str]) -> None:
        """Sort each group's records by the order column (stable; missing values last)."""
        column = self.options.order_by
        if column is None or len(self.rows) == 0:
            return
        rows, order, offsets = self.rows, self.record_order, self.group_offsets.tolist()
        values = [rows[i].get(column) for i in order.tolist()]
        if _all_of_one_kind(values):
            group_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
            self.record_order = order[np.lexsort((np.asarray(values), group_of))]
            return
        for group, (lo, hi) in enumerate(zip(offsets[:-1], offsets[1:], strict=True)):
            try:
                inside = sorted(range(lo, hi), key=lambda k: (values[k] is None, values[k]))
            except TypeError:
                raise RecordSchemaError(
                    f"group {self.group_values[group]!r} has values of different types in order column"
                    f" {column!r} ({name(int(order[lo]))} and others); give them one type"
                ) from None
            order[lo:hi] = order[inside]

    def _check_groups(self) -> None:
        """GroupTooLongError for the first group (in group order) that cannot fit an example alone."""
        if self.options.mode != "grouped":
            return
        sizes = self.group_tokens() + 2
        too_long = np.flatnonzero(sizes > self.layout.group_limit)
        if len(too_long):
            g = int(too_long[0])
            layout = self.layout
            raise GroupTooLongError.build(
                self.group_values[g],
                int(self.group_offsets[g + 1] - self.group_offsets[g]),
                int(sizes[g]),
                limit=layout.group_limit,
                max_seq_length=self.options.max_seq_length,
                prompt_tokens=layout.framed_prompt_tokens,
            )

    def group_tokens(self) -> np.ndarray:
        """Record tokens of every group (without its BOS/EOS)."""
        lengths = self.tokens.lengths[self.record_order]
        ends = np.concatenate(([0], np.cumsum(lengths)))
        return np.diff(ends[self.group_offsets])

    def records_of(self, groups: np.ndarray) -> np.ndarray:
        """The records of these groups, group after group, each in its order."""
        offsets = self.group_offsets
        counts = offsets[1:][groups] - offsets[:-1][groups]
        starts = offsets[:-1][groups]
        firsts = np.cumsum(counts) - counts
        total = int(counts.sum())
        return self.record_order[np.arange(total, dtype=np.int64) + np.repeat(starts - firsts, counts)]

    # -- stage 4: split --------------------------------------------------------------------------------------
    def split(self, test_size: int | float | None) -> tuple[np.ndarray, np.ndarray]:
        """(training units, validation units): records in tabular mode, groups otherwise, in table order."""
        units = len(self.rows) if self.options.mode == "tabular" else len(self.group_values)
        everything = np.arange(units, dtype=np.int64)
        count = _test_count(test_size, units)
        if count == 0:
            return everything, everything[:0]
        stream = np.random.default_rng([self.options.seed, _SPLIT_STREAM])
        chosen = np.zeros(units, dtype=bool)
        chosen[stream.permutation(units)[:count]] = True
        train, validation = everything[~chosen], everything[chosen]
        train_records = len(train) if self.options.mode == "tabular" else len(self.records_of(train))
        if train_records < MIN_TRAIN_RECORDS:
            raise SplitTooLargeError(
                f"test_size {test_size!r} leaves {train_records} training records of {len(self.rows)}"
                f" ({count} {'records' if self.options.mode == 'tabular' else 'groups'} go to validation); at"
                f" least {MIN_TRAIN_RECORDS} must stay for training. Lower test_size or give more records."
            )
        return train, validation

    # -- stage 5: passes -------------------------------------------------------------------------------------
    def grouped_passes(
        self, groups: np.ndarray, data_fraction: float, shuffle: bool, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Shuffled copies of the groups; the fractional part adds groups until it holds enough records."""
        fraction, whole = math.modf(data_fraction)
        passes = [_shuffled(groups, shuffle, rng) for _ in range(int(whole))]
        if fraction > 0 and len(groups):
            counts = np.diff(self.group_offsets)[groups]
            needed = math.ceil(fraction * int(counts.sum()))
            shuffled = _shuffled(groups, shuffle, rng)
            cumulative = np.cumsum(np.diff(self.group_offsets)[shuffled])
            last = int(np.flatnonzero(cumulative >= needed)[0])
            passes.append(shuffled[: last + 1])
        return passes

    def sequential_passes(self, groups: np.ndarray, data_fraction: float) -> list[np.ndarray]:
        """Copies of the records of these groups in order (never shuffled); the fractional part a prefix."""
        records = self.records_of(groups)
        fraction, whole = math.modf(data_fraction)
        passes = [records] * int(whole)
        if fraction > 0:
            passes.append(records[: math.ceil(fraction * len(records))])
        return passes

    # -- stages 6-7: examples ----------------------------------------------------------------------------------
    def tabular(self, passes: list[np.ndarray]) -> list[RecordExample]:
        """One block per example. Next-fit runs through all passes as one stream (the reference does not
        flush where a pass ends); best-fit packs each pass on its own."""
        chunks = passes if self.options.packing == "best_fit" else [_concat(passes)]
        out: list[RecordExample] = []
        for records in chunks:
            order, offsets = plan_units(self.options, self.tokens.lengths[records], self.layout.record_budget)
            every = np.arange(len(offsets), dtype=np.int64)
            out.extend(self.layout.examples(self.tokens, records[order], offsets, every))
        return out

    def grouped(self, passes: list[np.ndarray]) -> list[RecordExample]:
        """One block per group; next-fit over all passes as one stream, best-fit pass by pass."""
        chunks = passes if self.options.packing == "best_fit" else [_concat(passes)]
        sizes = self.group_tokens() + 2
        counts = np.diff(self.group_offsets)
        out: list[RecordExample] = []
        for groups in chunks:
            order, offsets = plan_units(self.options, sizes[groups], self.layout.group_room)
            placed = groups[order]
            block_offsets = np.concatenate(([0], np.cumsum(counts[placed])))
            values = [self.group_values[g] for g in placed.tolist()]
            out.extend(
                self.layout.examples(self.tokens, self.records_of(placed), block_offsets, offsets, values)
            )
        return out

    def sequential(
        self, passes: list[np.ndarray], draws: np.random.Generator | None, per_group: bool = False
    ) -> list[RecordExample]:
        """One block per example, never across a group or a pass. Budgets come from `draws`, one per example
        in order (None: the full budget), or with `per_group` from each group's own stream."""
        group_of_record = np.empty(len(self.rows), dtype=np.int64)
        group_of_record[self.record_order] = np.repeat(
            np.arange(len(self.group_values), dtype=np.int64), np.diff(self.group_offsets)
        )
        records = _concat(passes)
        groups = group_of_record[records]
        cuts = np.flatnonzero(groups[1:] != groups[:-1]) + 1
        pass_starts = np.cumsum([len(p) for p in passes])[:-1]
        runs = np.unique(np.concatenate(([0], cuts, pass_starts, [len(records)]))).astype(np.int64)
        room = self.layout.record_budget
        if per_group:
            seed, values = self.options.seed, self.group_values
            run_groups = groups[runs[:-1]].tolist()
            streams = [_group_budgets(room, seed, values[g]) for g in run_groups]
            budget = lambda run: streams[run]()  # noqa: E731
        else:
            shared = _budget(room, draws)
            budget = lambda run: shared()  # noqa: E731
        order, offsets = records_plan.sequential(
            self.tokens.lengths[records], runs, self.options.max_sequences, budget
        )
        values = [self.group_values[g] for g in groups[offsets[:-1]].tolist()] if len(records) else []
        every = np.arange(len(offsets), dtype=np.int64)
        return self.layout.examples(self.tokens, records[order], offsets, every, values)

    # -- stage 7: what else the reference reports --------------------------------------------------------------
    def stats(self, examples: list[RecordExample], units: np.ndarray) -> dict[str, Summary]:
        """Statistics of the training split and its examples."""
        mode = self.options.mode
        records = units if mode == "tabular" else self.records_of(units)
        stats = {
            "tokens_per_record": Summary.of(self.tokens.lengths[records]),
            "tokens_per_example": Summary.of([len(e) for e in examples]),
            "records_per_example": Summary.of([e.num_records for e in examples]),
        }
        if mode != "tabular":
            stats["tokens_per_group"] = Summary.of(self.group_tokens()[units])
            stats["records_per_group"] = Summary.of(np.diff(self.group_offsets)[units])
        if mode == "grouped":
            stats["groups_per_example"] = Summary.of([len(e.groups) for e in examples])
        if mode == "sequential":
            per_group: dict[int, int] = {}
            index = {value_key(v): g for g, v in enumerate(self.group_values)}
            for example in examples:
                key = index[value_key(example.groups[0])]
                per_group[key] = per_group.get(key, 0) + 1
            stats["examples_per_group"] = Summary.of(list(per_group.values()))
        return stats

    def prefill(self, groups: np.ndarray) -> dict[object, str]:
        """Each training group's first records as text, the way the reference's prefill joins them."""
        out = {}
        columns = self.layout.columns
        for g in groups.tolist():
            lo = int(self.group_offsets[g])
            hi = min(int(self.group_offsets[g + 1]), lo + PREFILL_RECORDS)
            texts = [
                RecordLayout.record_text(self.rows[i], columns) for i in self.record_order[lo:hi].tolist()
            ]
            out[self.group_values[g]] = " " + "\n".join(texts)
        return out


# -- small pieces ------------------------------------------------------------------------------------------------


def value_key(value: object) -> tuple[str, object]:
    """A group value as a dict key that keeps 1, 1.0 and True apart (JSON tells them apart)."""
    return (type(value).__name__, value)


def _position_name(index: int) -> str:
    return f"record #{index}"


def _names(names: list[str] | None) -> Callable[[int], str]:
    return names.__getitem__ if names is not None else _position_name


def _check_columns(options: AssemblyOptions, columns: tuple[str, ...]) -> None:
    for role, column in (("group_by", options.group_by), ("order_by", options.order_by)):
        if column is not None and column not in columns:
            raise MissingColumnError(
                f"{role} column {column!r} is not among the records' columns ({', '.join(columns) or 'none'});"
                f" name one of them, or leave {role} out"
            )


def _group_keys(rows: Sequence[Mapping], column: str | None, name: Callable[[int], str]) -> list:
    """The group value of every record (None for all when there is no group column)."""
    if column is None:
        return [None] * len(rows)
    return [_group_value(row, column, name, index) for index, row in enumerate(rows)]


def _group_value(row: Mapping, column: str, name: Callable[[int], str], index: int) -> object:
    """A record's value in the group column; MissingColumnError when it has none (or a list or object)."""
    value = row.get(column)
    if value is None or isinstance(value, list | dict):
        what = "no value" if value is None else f"a {type(value).__name__}, not a single value,"
        raise MissingColumnError(f"{name(index)} has {what} in group_by column {column!r}")
    return value


def _gather(keys: list, sort_groups: bool) -> tuple[np.ndarray, np.ndarray, list]:
    """Records gathered by group: (record order, group offsets, group values); groups by first appearance,
    or sorted by value (the reference's order)."""
    ids: dict[tuple[str, object], int] = {}
    values: list = []
    group_of = np.empty(len(keys), dtype=np.int64)
    for index, key in enumerate(keys):
        k = value_key(key)
        g = ids.get(k)
        if g is None:
            g = ids[k] = len(values)
            values.append(key)
        group_of[index] = g
    if sort_groups and len(values) > 1:
        try:
            ranked = sorted(range(len(values)), key=values.__getitem__)
        except TypeError:
            kinds = sorted({type(v).__name__ for v in values})
            raise RecordSchemaError(
                f"the group values are of different types ({', '.join(kinds)}) and cannot be sorted; give"
                " them one type, or pass shuffle=False to keep the groups in order of appearance"
            ) from None
        rank = np.empty(len(values), dtype=np.int64)
        rank[ranked] = np.arange(len(values), dtype=np.int64)
        group_of = rank[group_of]
        values = [values[g] for g in ranked]
    order = np.argsort(group_of, kind="stable")
    offsets = np.concatenate(([0], np.cumsum(np.bincount(group_of, minlength=len(values)))))
    return order.astype(np.int64), offsets.astype(np.int64), values


def _all_of_one_kind(values: list) -> bool:
    """True when numpy sorts the values as Python would: all strings, or all plain numbers."""
    if all(type(v) is str for v in values):
        return True
    return all(type(v) in (int, float) for v in values) and all(abs(v) < 2**53 for v in values)


def _test_count(test_size: int | float | None, units: int) -> int:
    if test_size is None or test_size == 0:
        return 0
    if isinstance(test_size, bool) or not isinstance(test_size, int | float) or test_size < 0:
        raise ValueError(f"test_size must be a count or a fraction in (0, 1), not {test_size!r}")
    if isinstance(test_size, float):
        if test_size >= 1:
            raise ValueError(f"test_size {test_size} is a float: give a fraction in (0, 1), or an int count")
        return math.ceil(test_size * units)
    return min(test_size, units)


def _shuffled(units: np.ndarray, shuffle: bool, rng: np.random.Generator) -> np.ndarray:
    """The units in a fresh permutation of the reference's stream (as `Dataset.shuffle(generator=rng)`)."""
    return units[rng.permutation(len(units))] if shuffle else units


def _passes(
    units: np.ndarray, data_fraction: float, shuffle: bool, rng: np.random.Generator
) -> list[np.ndarray]:
    """Shuffled copies of the units; the fractional part a prefix of one more shuffled copy."""
    fraction, whole = math.modf(data_fraction)
    passes = [_shuffled(units, shuffle, rng) for _ in range(int(whole))]
    if fraction > 0:
        passes.append(_shuffled(units, shuffle, rng)[: math.ceil(fraction * len(units))])
    return passes


def _concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def _budget(room: int, draws: np.random.Generator | None) -> Callable[[], int]:
    """Each example's token budget: `room`, or a uniform share of it in FILL_RATIO (the reference's draw)."""
    if draws is None:
        return lambda: room
    low, high = FILL_RATIO

    def draw() -> int:
        return max(1, min(room, int(room * float(draws.uniform(low, high)))))

    return draw


def _group_budgets(room: int, seed: int, group: object) -> Callable[[], int]:
    """A group's own budget draws, uniform in FILL_RATIO like the reference's: draw k is a hash of the seed,
    the group value and k, so the same group gives the same examples wherever and whenever it comes."""
    low, high = FILL_RATIO
    base = hashlib.blake2b(f"{seed}\0{value_key(group)!r}".encode(), digest_size=16).digest()
    drawn = itertools.count()

    def draw() -> int:
        digest = hashlib.blake2b(base + next(drawn).to_bytes(8, "little"), digest_size=8).digest()
        share = low + (high - low) * (int.from_bytes(digest, "little") / 2**64)
        return max(1, min(room, int(room * share)))

    return draw


def _chain(head: list, rest: Iterator) -> Iterator:
    yield from head
    yield from rest


def _chunks(
    rows: Iterator[Mapping], names: Iterator[str] | None, size: int | None
) -> Iterator[tuple[list[Mapping], list[str] | None]]:
    """The rows (and their names) `size` at a time; None: all at once."""
    offset = 0
    while True:
        chunk = list(islice(rows, size)) if size is not None else list(rows)
        if not chunk:
            return
        chunk_names = list(islice(names, len(chunk))) if names is not None else None
        if chunk_names is None:
            chunk_names = [_position_name(offset + i) for i in range(len(chunk))]
        offset += len(chunk)
        yield chunk, chunk_names


def _group_runs(
    rows: Iterator[Mapping], names: Iterator[str] | None, column: str | None
) -> Iterator[tuple[object, list[Mapping], Sequence]]:
    """(group value, records, names) of each run of consecutive records with one group value; without
    `names`, a run names its records by their positions (a range, made into text only for an error)."""
    current: tuple[str, object] | None = None
    value: object = None
    run: list[Mapping] = []
    run_names: list[str] = []
    start = 0
    for index, row in enumerate(rows):
        row_value = row.get(column) if column is not None else None
        if column is not None and (row_value is None or isinstance(row_value, list | dict)):
            row_name = next(names) if names is not None else _position_name(index)
            _group_value(row, column, lambda _, n=row_name: n, index)  # raises, naming the record
        key = (type(row_value).__name__, row_value)
        if key != current and run:
            yield value, run, run_names if names is not None else range(start, index)
            run, run_names, start = [], [], index
        current, value = key, row_value
        run.append(row)
        if names is not None:
            run_names.append(next(names))
    if run:
        yield value, run, run_names if names is not None else range(start, start + len(run))


def _batched(
    runs: Iterator[tuple[object, list[Mapping], list[str]]], groups: int | None, records: int | None
) -> Iterator[list[tuple[object, list[Mapping], list[str]]]]:
    """Runs in batches of `groups` runs, or of at least `records` records (None for both: all at once)."""
    batch: list = []
    count = 0
    for run in runs:
        batch.append(run)
        count += len(run[1])
        if (groups is not None and len(batch) >= groups) or (records is not None and count >= records):
            yield batch
            batch, count = [], 0
    if batch:
        yield batch
