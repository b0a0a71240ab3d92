"""Properties of record assembly over generated records: the flush rules, group integrity, budget bounds,
every record once per pass, determinism under a seed, and validation apart from training."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cookers import records_plan
from cookers.records import assemble_records
from tests.cookers.test_records import BOS, EOS, char_tokenizer

TOKENIZER = char_tokenizer()
PROPERTIES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def blocks_of(example) -> list[list[dict]]:
    """The records of every BOS ... EOS block of an example (the char tokenizer makes ids code points)."""
    ids = example.input_ids[example.num_prompt_tokens :].tolist()
    blocks, current = [], None
    for token in ids:
        if token == BOS:
            current = []
        elif token == EOS:
            text = bytes(current).decode()
            blocks.append([json.loads(line) for line in text.splitlines()])
            current = None
        else:
            current.append(token)
    return blocks


def records_of(example) -> list[dict]:
    return [record for block in blocks_of(example) for record in block]


@st.composite
def record_sets(draw, grouped: bool = False) -> list[dict]:
    count = draw(st.integers(1, 60))
    lengths = draw(st.lists(st.integers(0, 40), min_size=count, max_size=count))
    groups = draw(st.lists(st.integers(0, 9), min_size=count, max_size=count))
    rows = []
    for index, (length, group) in enumerate(zip(lengths, groups, strict=True)):
        row = {"g": f"g{group}"} if grouped else {}
        row.update({"k": index, "v": "x" * length})
        rows.append(row)
    return rows


# -- the flush rules alone ------------------------------------------------------------------------------------


@PROPERTIES
@given(
    sizes=st.lists(st.integers(0, 50), max_size=80),
    room=st.integers(1, 120),
    cap=st.one_of(st.none(), st.integers(1, 6)),
)
def test_next_fit_keeps_order_and_flushes_only_when_the_next_unit_cannot_join(sizes, room, cap):
    order, offsets = records_plan.next_fit(sizes, room, cap)
    assert order.tolist() == list(range(len(sizes)))
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        units = sizes[a:b]
        assert units and (cap is None or len(units) <= cap)
        assert sum(units) <= room or len(units) == 1  # a unit alone may be larger (grouped slips)
        if b < len(sizes):
            assert (cap is not None and len(units) == cap) or sum(units) + sizes[b] > room


@PROPERTIES
@given(
    sizes=st.lists(st.integers(0, 50), max_size=80),
    room=st.integers(1, 120),
    cap=st.one_of(st.none(), st.integers(1, 6)),
)
def test_best_fit_places_every_unit_once_within_room_and_cap(sizes, room, cap):
    order, offsets = records_plan.best_fit(sizes, room, cap)
    assert sorted(order.tolist()) == list(range(len(sizes)))
    firsts = []
    for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        members = order[a:b].tolist()
        assert members == sorted(members)  # input order inside an example
        total = sum(sizes[i] for i in members)
        assert total <= room or len(members) == 1
        assert cap is None or len(members) <= cap
        firsts.append(members[0])
    assert firsts == sorted(firsts)  # examples in the order of their first unit


# -- assembled examples ---------------------------------------------------------------------------------------


@PROPERTIES
@given(
    rows=record_sets(),
    cap=st.one_of(st.none(), st.integers(1, 5)),
    seed=st.integers(0, 3),
    packing=st.sampled_from(["next_fit", "best_fit"]),
    fraction=st.sampled_from([1.0, 2.0, 1.5]),
)
def test_tabular_uses_every_record_once_per_pass_within_budget(rows, cap, seed, packing, fraction):
    L = 200
    result = assemble_records(
        rows,
        TOKENIZER,
        max_seq_length=L,
        max_sequences_per_example=cap,
        seed=seed,
        packing=packing,
        data_fraction=fraction,
    )
    seen = [record["k"] for example in result.train for record in records_of(example)]
    counts = np.bincount(seen, minlength=len(rows))
    whole = int(fraction)
    assert counts.min() >= whole and counts.max() <= whole + (fraction > whole)
    assert counts.sum() == whole * len(rows) + (
        np.ceil((fraction - whole) * len(rows)) if fraction > whole else 0
    )
    for example in result.train:
        assert len(example) <= L and len(blocks_of(example)) == 1
        assert cap is None or example.num_records <= cap


@PROPERTIES
@given(
    rows=record_sets(grouped=True),
    cap=st.one_of(st.none(), st.integers(1, 4)),
    seed=st.integers(0, 3),
    exact=st.booleans(),
    packing=st.sampled_from(["next_fit", "best_fit"]),
)
def test_grouped_keeps_every_group_whole_in_one_block_in_order(rows, cap, seed, exact, packing):
    L = 4000
    result = assemble_records(
        rows,
        TOKENIZER,
        "grouped",
        max_seq_length=L,
        max_sequences_per_example=cap,
        group_by="g",
        order_by="k",
        seed=seed,
        exact_budget=exact,
        packing=packing,
    )
    placed = {}
    for example in result.train:
        assert len(example) <= L and (cap is None or len(example.groups) <= cap)
        for block, value in zip(blocks_of(example), example.groups, strict=True):
            assert {record["g"] for record in block} == {value}
            assert value not in placed, "a group in two blocks"
            placed[value] = [record["k"] for record in block]
    for value in {row["g"] for row in rows}:
        assert placed[value] == [row["k"] for row in rows if row["g"] == value]  # whole, in order


@PROPERTIES
@given(rows=record_sets(grouped=True), cap=st.one_of(st.none(), st.integers(1, 8)), seed=st.integers(0, 3))
def test_sequential_examples_stay_inside_one_group_and_the_drawn_budget(rows, cap, seed):
    rows = sorted(rows, key=lambda r: (r["g"], r["k"]))
    L = 260
    result = assemble_records(
        rows,
        TOKENIZER,
        "sequential",
        max_seq_length=L,
        max_sequences_per_example=cap,
        group_by="g",
        order_by="k",
        seed=seed,
    )
    room = L - (result.layout.prompt_tokens + 4)
    keys = []
    for example in result.train:
        records = records_of(example)
        assert {r["g"] for r in records} == {example.groups[0]}
        record_tokens = len(example) - result.layout.framed_prompt_tokens - 2
        assert record_tokens <= room and len(example) <= L
        assert cap is None or len(records) <= cap
        keys += [r["k"] for r in records]
    assert keys == [r["k"] for r in rows]  # every record once, in order


@PROPERTIES
@given(rows=record_sets(grouped=True), seed=st.integers(0, 1000))
def test_a_seed_gives_the_same_examples_every_time(rows, seed):
    for mode in ("tabular", "grouped"):
        extra = {"group_by": "g"} if mode == "grouped" else {}
        one = assemble_records(rows, TOKENIZER, mode, max_seq_length=4000, seed=seed, **extra)
        two = assemble_records(rows, TOKENIZER, mode, max_seq_length=4000, seed=seed, **extra)
        assert [e.input_ids.tolist() for e in one.train] == [e.input_ids.tolist() for e in two.train]


@settings(max_examples=15, deadline=None)
@given(
    count=st.integers(130, 200),
    test_size=st.one_of(st.integers(1, 10), st.sampled_from([0.05, 0.1])),
    seed=st.integers(0, 5),
)
def test_validation_never_overlaps_training(count, test_size, seed):
    rows = [{"g": f"g{i % 23}", "k": i, "v": "x" * (i % 7)} for i in range(count)]
    tabular = assemble_records(rows, TOKENIZER, max_seq_length=400, test_size=test_size, seed=seed)
    train = {r["k"] for e in tabular.train for r in records_of(e)}
    validation = {r["k"] for e in tabular.validation for r in records_of(e)}
    assert not train & validation and train | validation == set(range(count))
    assert len(validation) == (test_size if isinstance(test_size, int) else int(np.ceil(test_size * count)))
    grouped = assemble_records(
        rows, TOKENIZER, "grouped", group_by="g", max_seq_length=4000, test_size=3, seed=seed
    )
    train_groups = {g for e in grouped.train for g in e.groups}
    validation_groups = {g for e in grouped.validation for g in e.groups}
    assert len(validation_groups) == 3 and not train_groups & validation_groups
