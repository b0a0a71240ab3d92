"""Record assembly against the reference: the guide's three worked examples token by token, the reference's
arithmetic (slips included) against a plain restatement of its loops, and the options beyond it.

A character-level tokenizer (token id = code point, BOS 2, EOS 3) makes every expected token sequence easy
to write down independently of the code under test.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

from cookers.records import assemble_records, assemble_stream
from cookers.records_options import AssemblyOptions, select_mode
from cookers.tokenizer import TokenizerAdapter

BOS, EOS = 2, 3
PROMPT = "[INST] Generate a JSONL dataset with the following columns:  {schema} [/INST]"

TRANSACTIONS = [
    '{"customer_id":"C-001","date":"2024-01-15","amount":42.50,"category":"grocery"}',
    '{"customer_id":"C-002","date":"2024-01-16","amount":18.00,"category":"coffee"}',
    '{"customer_id":"C-003","date":"2024-01-16","amount":250.00,"category":"electronics"}',
    '{"customer_id":"C-001","date":"2024-01-17","amount":63.20,"category":"grocery"}',
]
CUSTOMERS = [
    '{"customer_id":"C-001","date":"2024-01-15","amount":42.50,"category":"grocery"}',
    '{"customer_id":"C-001","date":"2024-01-17","amount":63.20,"category":"grocery"}',
    '{"customer_id":"C-001","date":"2024-01-20","amount":11.00,"category":"coffee"}',
    '{"customer_id":"C-002","date":"2024-01-16","amount":18.00,"category":"coffee"}',
    '{"customer_id":"C-002","date":"2024-01-18","amount":250.00,"category":"electronics"}',
    '{"customer_id":"C-002","date":"2024-01-19","amount":95.40,"category":"clothing"}',
]
SENSORS = [
    '{"device_id":"sensor-A","timestamp":"2024-01-15T00:00","temp":21.3,"status":"ok"}',
    '{"device_id":"sensor-A","timestamp":"2024-01-15T01:00","temp":21.5,"status":"ok"}',
    '{"device_id":"sensor-A","timestamp":"2024-01-15T02:00","temp":22.1,"status":"ok"}',
    '{"device_id":"sensor-A","timestamp":"2024-01-15T03:00","temp":28.7,"status":"warn"}',
    '{"device_id":"sensor-A","timestamp":"2024-01-15T04:00","temp":30.2,"status":"alert"}',
    '{"device_id":"sensor-B","timestamp":"2024-01-15T00:00","temp":19.0,"status":"ok"}',
    '{"device_id":"sensor-B","timestamp":"2024-01-15T01:00","temp":19.1,"status":"ok"}',
    '{"device_id":"sensor-B","timestamp":"2024-01-15T02:00","temp":19.3,"status":"ok"}',
]


def char_tokenizer() -> TokenizerAdapter:
    """Every character its own token, id = code point (ASCII); BOS 2 and EOS 3 never occur in JSON text."""
    backend = Tokenizer(models.WordLevel({chr(i): i for i in range(128)}, unk_token="\x00"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    return TokenizerAdapter(backend, bos_id=BOS, eos_id=EOS, pad_id=0)


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def compact(line: str) -> str:
    """A record's text as the layout writes it: compact JSON of the parsed record, and a newline."""
    return json.dumps(json.loads(line), separators=(",", ":")) + "\n"


def framed_prompt(columns: list[str]) -> list[int]:
    return [BOS, *ids(PROMPT.format(schema=",".join(f'"{c}":<unk>' for c in columns))), EOS]


def expected_example(columns: list[str], blocks: list[list[str]]) -> list[int]:
    """[BOS] prompt [EOS], then BOS records EOS for every block."""
    out = framed_prompt(columns)
    for block in blocks:
        out += [BOS, *ids("".join(compact(line) for line in block)), EOS]
    return out


def rows(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines]


# -- the guide's worked examples ----------------------------------------------------------------------------


def test_tabular_worked_example_flushes_after_three_records(tokenizer):
    # The guide's example, records in the order it shows them: at most 3 records per example.
    order = [TRANSACTIONS[2], TRANSACTIONS[3], TRANSACTIONS[1], TRANSACTIONS[0]]
    result = assemble_records(rows(order), tokenizer, max_sequences_per_example=3, shuffle=False)
    columns = ["customer_id", "date", "amount", "category"]
    assert [e.input_ids.tolist() for e in result.train] == [
        expected_example(columns, [order[:3]]),
        expected_example(columns, [order[3:]]),
    ]
    prompt = len(framed_prompt(columns))
    for example in result.train:
        labels = example.labels.tolist()
        assert labels[:prompt] == [-100] * prompt
        assert labels[prompt:] == example.input_ids.tolist()[prompt:]  # the records' BOS and EOS are labels
        assert example.attention_mask.tolist() == [1] * len(example)
    assert result.validation == []


def test_grouped_worked_example_puts_both_customers_in_one_example(tokenizer):
    columns = ["customer_id", "date", "amount", "category"]
    two = assemble_records(
        rows(CUSTOMERS),
        tokenizer,
        "grouped",
        max_sequences_per_example=2,
        group_by="customer_id",
        order_by="date",
        shuffle=False,
    )
    assert [e.input_ids.tolist() for e in two.train] == [
        expected_example(columns, [CUSTOMERS[:3], CUSTOMERS[3:]])
    ]
    assert two.train[0].groups == ("C-001", "C-002") and two.train[0].num_records == 6
    one = assemble_records(
        rows(CUSTOMERS),
        tokenizer,
        "grouped",
        max_sequences_per_example=1,
        group_by="customer_id",
        order_by="date",
        shuffle=False,
    )
    assert [e.input_ids.tolist() for e in one.train] == [
        expected_example(columns, [CUSTOMERS[:3]]),
        expected_example(columns, [CUSTOMERS[3:]]),
    ]


def test_sequential_worked_example_continues_sensor_a_in_a_second_example(tokenizer):
    columns = ["device_id", "timestamp", "temp", "status"]
    lengths = [len(compact(line)) for line in SENSORS]
    prompt = len(framed_prompt(columns)) - 2
    # A budget that takes sensor-A's first 4 records but not its 5th (the reference's L - P - 4).
    max_seq_length = prompt + 4 + sum(lengths[:4]) + lengths[4] // 2
    shuffled_input = [SENSORS[i] for i in (6, 3, 0, 5, 4, 1, 7, 2)]  # sorted back by device, then time
    result = assemble_records(
        rows(shuffled_input),
        tokenizer,
        "sequential",
        max_seq_length=max_seq_length,
        group_by="device_id",
        order_by="timestamp",
        randomize_budget=False,
    )
    assert [e.input_ids.tolist() for e in result.train] == [
        expected_example(columns, [SENSORS[:4]]),
        expected_example(columns, [SENSORS[4:5]]),
        expected_example(columns, [SENSORS[5:]]),
    ]
    assert [e.groups for e in result.train] == [("sensor-A",), ("sensor-A",), ("sensor-B",)]
    assert result.stats["examples_per_group"].total == 3 and result.stats["examples_per_group"].max == 2
    assert result.initial_prefill == {
        "sensor-A": " " + "\n".join(compact(line) for line in SENSORS[:3]),
        "sensor-B": " " + "\n".join(compact(line) for line in SENSORS[5:]),
    }


def test_sequential_mode_puts_the_group_and_order_columns_first(tokenizer):
    records = [{"temp": 1.5, "ts": "t1", "dev": "a"}, {"temp": 2.5, "ts": "t0", "dev": "a"}]
    result = assemble_records(
        records, tokenizer, "sequential", group_by="dev", order_by="ts", randomize_budget=False
    )
    text = bytes(result.train[0].input_ids.tolist()).decode()
    assert '"dev":<unk>,"ts":<unk>,"temp":<unk>' in text
    assert '{"dev":"a","ts":"t0","temp":2.5}\n{"dev":"a","ts":"t1","temp":1.5}\n' in text


def test_time_series_wins_over_a_group_column():
    assert select_mode(time_series=True, group_by="device_id") == "sequential"
    assert select_mode(group_by="device_id") == "grouped"
    assert select_mode() == "tabular"


# -- the reference's arithmetic, restated -------------------------------------------------------------------


def reference_tabular(
    records: list[list[int]], prompt: list[int], L: int, cap: int | None
) -> list[list[int]]:
    """The reference's tabular loop: flush after record j-1 when j is the end, the cap is reached, or records
    i..j together pass L - P - 4 (P without the prompt's BOS/EOS)."""
    budget = L - (len(prompt) - 2) - 4
    out, first, count = [], 0, 0
    for j in range(1, len(records) + 1):
        count += 1
        if j == len(records) or count == cap or sum(map(len, records[first : j + 1])) > budget:
            out.append(prompt + [BOS] + [t for r in records[first:j] for t in r] + [EOS])
            first, count = j, 0
    return out


def reference_grouped(groups: list[list[int]], prompt: list[int], L: int, cap: int | None) -> list[list[int]]:
    """The reference's grouped loop: add the group, then flush if it was the last, the cap is reached, or the
    example so far plus the next group's record tokens pass L - P - 2."""
    room = L - (len(prompt) - 2) - 2
    out, example, count = [], list(prompt), 0
    for i, group in enumerate(groups):
        count += 1
        example += [BOS, *group, EOS]
        assert len(example) <= L
        if i == len(groups) - 1 or count == cap or len(example) + len(groups[i + 1]) > room:
            out.append(example)
            example, count = list(prompt), 0
    return out


def reference_sequential(
    records: list[list[int]], groups: list[str], prompt: list[int], L: int, cap: int | None, seed: int | None
) -> list[list[int]]:
    """The reference's sequential loop: a budget of 70-100% of L - P - 4 drawn per example (None: full), grown
    to the first record; flush on group change, cap, or budget."""
    room = L - (len(prompt) - 2) - 4
    rng = np.random.default_rng(seed) if seed is not None else None

    def draw() -> int:
        return room if rng is None else max(1, min(room, int(room * float(rng.uniform(0.7, 1.0)))))

    out, start, index, total, count, group, budget = [], 0, 0, 0, 0, None, draw()
    while index < len(records):
        size = len(records[index])
        if total == 0:
            budget, group = max(budget, size), groups[index]
        if groups[index] != group or count >= (cap or math.inf) or total + size > budget:
            out.append(prompt + [BOS] + [t for r in records[start:index] for t in r] + [EOS])
            start, total, count, group, budget = index, 0, 0, None, draw()
            continue
        total, count, index = total + size, count + 1, index + 1
    if start < len(records):
        out.append(prompt + [BOS] + [t for r in records[start:] for t in r] + [EOS])
    return out


def synthetic_rows(lengths: list[int], groups: list[int] | None = None) -> list[dict]:
    """Records whose text is `len(compact) == length + 12` characters; group g's records are in its order."""
    out = []
    for index, length in enumerate(lengths):
        row = {"g": f"g{groups[index]:02d}"} if groups is not None else {}
        row["k"] = index
        row["v"] = "x" * length
        out.append(row)
    return out


def record_ids(row: dict) -> list[int]:
    return ids(json.dumps(row, separators=(",", ":")) + "\n")


def prompt_of(columns: list[str]) -> list[int]:
    return framed_prompt(columns)


@pytest.mark.parametrize("cap", [None, 1, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_tabular_default_mode_is_the_reference_loop(tokenizer, cap, shuffle):
    generator = np.random.default_rng(5)
    lengths = generator.integers(0, 60, size=120).tolist()
    records = synthetic_rows(lengths)
    L = 260
    result = assemble_records(
        records, tokenizer, max_seq_length=L, max_sequences_per_example=cap, shuffle=shuffle, seed=11
    )
    # The reference shuffles with Dataset.shuffle(generator=default_rng(seed)), i.e. one permutation.
    order = np.random.default_rng(11).permutation(len(records)) if shuffle else range(len(records))
    expected = reference_tabular([record_ids(records[i]) for i in order], prompt_of(["k", "v"]), L, cap)
    assert [e.input_ids.tolist() for e in result.train] == expected
    assert all(len(e) <= L for e in result.train)


@pytest.mark.parametrize("cap", [None, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_grouped_default_mode_is_the_reference_loop_with_its_slips(tokenizer, cap, shuffle):
    generator = np.random.default_rng(7)
    groups = generator.integers(0, 30, size=150).tolist()
    records = synthetic_rows(generator.integers(0, 25, size=150).tolist(), groups)
    L = 900
    result = assemble_records(
        records,
        tokenizer,
        "grouped",
        max_seq_length=L,
        max_sequences_per_example=cap,
        group_by="g",
        order_by="k",
        shuffle=shuffle,
        seed=3,
    )
    if shuffle:  # the reference groups with pandas (groups sorted by value), then shuffles the groups
        values = sorted(set(r["g"] for r in records))
        values = [values[i] for i in np.random.default_rng(3).permutation(len(values))]
    else:  # shuffle=False keeps the groups in order of first appearance
        values = list(dict.fromkeys(r["g"] for r in records))
    tokens = [[t for r in records if r["g"] == v for t in record_ids(r)] for v in values]
    assert [e.input_ids.tolist() for e in result.train] == reference_grouped(
        tokens, prompt_of(["g", "k", "v"]), L, cap
    )


def test_exact_budget_counts_the_true_tokens_and_packs_more_groups(tokenizer):
    generator = np.random.default_rng(2)
    groups = generator.integers(0, 40, size=200).tolist()
    records = synthetic_rows(generator.integers(0, 20, size=200).tolist(), groups)
    L = 500
    kwargs = dict(max_seq_length=L, max_sequences_per_example=None, group_by="g", shuffle=False)
    reference = assemble_records(records, tokenizer, "grouped", **kwargs)
    exact = assemble_records(records, tokenizer, "grouped", exact_budget=True, **kwargs)

    def block(value: str) -> int:
        return sum(len(record_ids(r)) for r in records if r["g"] == value) + 2

    prompt = len(prompt_of(["g", "k", "v"])) - 2  # P, the prompt without its BOS/EOS
    for examples, slack in ((exact.train, 0), (reference.train, prompt)):
        for example, following in zip(examples, examples[1:], strict=False):
            assert len(example) <= L
            # next-fit: the next group did not fit; the reference counts the prompt once more
            assert len(example) + block(following.groups[0]) > L - slack
    assert sum(e.num_records for e in exact.train) == sum(e.num_records for e in reference.train) == 200
    assert len(exact.train) < len(reference.train)


@pytest.mark.parametrize("randomize", [False, True])
def test_sequential_default_mode_is_the_reference_loop_with_its_budget_draws(tokenizer, randomize):
    generator = np.random.default_rng(9)
    groups = sorted(generator.integers(0, 8, size=160).tolist())
    records = synthetic_rows(generator.integers(0, 40, size=160).tolist(), groups)
    L = 300
    result = assemble_records(
        records,
        tokenizer,
        "sequential",
        max_seq_length=L,
        max_sequences_per_example=6,
        group_by="g",
        order_by="k",
        seed=4,
        randomize_budget=randomize,
    )
    expected = reference_sequential(
        [record_ids(r) for r in records],
        [r["g"] for r in records],
        prompt_of(["g", "k", "v"]),
        L,
        6,
        4 if randomize else None,
    )
    assert [e.input_ids.tolist() for e in result.train] == expected


def test_data_fraction_repeats_the_records_and_sequential_flushes_at_each_restart(tokenizer):
    records = synthetic_rows([5] * 10)
    tabular = assemble_records(records, tokenizer, data_fraction=2.5, max_sequences_per_example=4, seed=1)
    assert sum(e.num_records for e in tabular.train) == 25
    one_group = assemble_records(
        records,
        tokenizer,
        "sequential",
        data_fraction=2,
        max_sequences_per_example=4,
        order_by="k",
        randomize_budget=False,
    )
    # 10 records in one group, two passes: 4 + 4 + 2, then again from the start (never across the restart).
    assert [e.num_records for e in one_group.train] == [4, 4, 2, 4, 4, 2]


def test_best_fit_makes_fewer_examples_than_next_fit_with_every_record_once(tokenizer):
    generator = np.random.default_rng(1)
    records = synthetic_rows(generator.integers(0, 80, size=300).tolist())
    kwargs = dict(max_seq_length=400, max_sequences_per_example=None, shuffle=True, seed=2)
    next_fit = assemble_records(records, tokenizer, **kwargs)
    best_fit = assemble_records(records, tokenizer, packing="best_fit", **kwargs)
    assert len(best_fit.train) < len(next_fit.train)
    assert sum(e.num_records for e in best_fit.train) == 300
    assert all(len(e) <= 400 for e in best_fit.train)


def test_assemble_stream_in_one_window_equals_assemble_records_without_shuffle(tokenizer):
    generator = np.random.default_rng(3)
    groups = sorted(generator.integers(0, 40, size=120).tolist())
    records = synthetic_rows(generator.integers(0, 30, size=120).tolist(), groups)
    for mode, extra in (("tabular", {}), ("grouped", {"group_by": "g", "order_by": "k"})):
        options = AssemblyOptions(mode=mode, max_seq_length=700, **extra)
        streamed = [e.input_ids.tolist() for e in assemble_stream(records, tokenizer, options)]
        whole = assemble_records(records, tokenizer, mode, max_seq_length=700, shuffle=False, **extra)
        assert streamed == [e.input_ids.tolist() for e in whole.train]


def test_a_first_record_larger_than_the_drawn_budget_grows_the_budget(tokenizer):
    # Records between 60% and 100% of the room: draws of 70-100% often fall short of the first record.
    L = 300
    room = L - (len(prompt_of(["g", "k", "v"])) - 2) - 4
    generator = np.random.default_rng(8)
    lengths = generator.integers(int(0.6 * room) - 26, room - 26, size=40).tolist()
    records = synthetic_rows(lengths, [0] * 40)
    assert max(len(record_ids(r)) for r in records) <= room
    result = assemble_records(
        records, tokenizer, "sequential", max_seq_length=L, group_by="g", order_by="k", seed=6
    )
    expected = reference_sequential(
        [record_ids(r) for r in records], [r["g"] for r in records], prompt_of(["g", "k", "v"]), L, 10, 6
    )
    assert [e.input_ids.tolist() for e in result.train] == expected
    assert len(result.train) == 40  # no two such records fit one budget; none is refused
    draws = [int(room * u) for u in np.random.default_rng(6).uniform(0.7, 1.0, size=40)]
    assert any(draw < len(record_ids(r)) for draw, r in zip(draws, records, strict=True)), "the rule was used"


def test_auto_takes_one_unit_per_example_with_differential_privacy(tokenizer):
    records = synthetic_rows([3] * 12, [i // 4 for i in range(12)])
    tabular = assemble_records(records, tokenizer, max_seq_length=600, differential_privacy=True)
    assert [e.num_records for e in tabular.train] == [1] * 12
    grouped = assemble_records(
        records, tokenizer, "grouped", group_by="g", max_seq_length=600, differential_privacy=True
    )
    assert [len(e.groups) for e in grouped.train] == [1, 1, 1]
    default = assemble_records(records, tokenizer, max_seq_length=600)
    assert [e.num_records for e in default.train] == [10, 2]
