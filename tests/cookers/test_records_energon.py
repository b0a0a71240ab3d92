"""The record assembly task encoder inside energon's real loader, on shards written by `shardprep write
--group-by customer_id --group-contiguous` from a CSV: the same examples as `assemble_stream` over the records
in the order the loader reads them, whole groups, saved and restored state, and the set-ups it refuses."""

from __future__ import annotations

import csv
import json
import random
from collections import Counter
from dataclasses import replace
from itertools import groupby

import pytest
import torch
from megatron.energon import (
    Cooker,
    DefaultTaskEncoder,
    WorkerConfig,
    get_loader,
    get_savable_loader,
    get_val_dataset,
)
from megatron.energon.errors import reraise_exception
from megatron.energon.flavors.webdataset.sharder import Sharder

from cookers.energon_records import RecordAssemblyTaskEncoder, cook_record, sample_name
from cookers.records import assemble_records, assemble_stream, layout_for
from cookers.records_errors import GroupTooLongError, MissingColumnError, RecordSchemaError
from cookers.records_layout import IGNORE_INDEX
from cookers.records_options import AssemblyOptions
from cookers.tokenizer import load_tokenizer
from prep.write import open_sources, write_dataset
from tests.support.loader import batches_around_a_restore, train_dataset
from tools.train_tokenizer import train_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")
GROUPED = {"group_by": "customer_id", "order_by": "date"}
TYPES = {"amount": float}
MAX_SEQ_LENGTH = 400


def transactions(count: int, seed: int) -> list[dict]:
    """Transactions of `count` customers (1-7 each), shuffled: the CSV is in no particular order."""
    rng = random.Random(seed)
    rows = []
    for customer in range(count):
        for _ in range(rng.randint(1, 7)):
            rows.append(
                {
                    "customer_id": f"C-{customer:03d}",
                    "date": f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                    "amount": f"{rng.uniform(1, 300):.2f}",
                    "category": rng.choice(["grocery", "coffee", "electronics", "clothing", "fuel"]),
                }
            )
    rng.shuffle(rows)
    return rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    rows = transactions(40, seed=3)
    with open(root / "transactions.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    write_dataset(
        open_sources([root / "transactions.csv"]),
        root / "prepared",
        group_by="customer_id",
        group_contiguous=True,
        maxcount=30,
    )
    return root / "prepared"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    texts = [str(row) for row in transactions(60, seed=9)]
    train_tokenizer(texts, vocab_size=400).save(str(path))
    return load_tokenizer(path, bos_token="<s>", eos_token="</s>")


class RecordOrder(DefaultTaskEncoder):
    """The cooked records one by one, in the order the loader reads them."""

    cookers = (Cooker(cook_record),)


def load(path, encoder, *, batch_size=3, buffer=None, workers=0, error_handler=None, **settings):
    settings.setdefault("parallel_shard_iters", 1)
    return train_dataset(
        path,
        encoder,
        batch_size=batch_size,
        buffer=buffer,
        workers=workers,
        error_handler=error_handler,
        **settings,
    )


def loaded_records(path) -> tuple[list[dict], list[str]]:
    samples = list(get_loader(load(path, RecordOrder(), batch_size=None)))
    return [{**s.record, "amount": float(s.record["amount"])} for s in samples], [
        sample_name(s) for s in samples
    ]


def rows_of(batches) -> list[list[int]]:
    out = []
    for batch in batches:
        for row, length in enumerate(batch.lengths):
            assert batch.attention_mask[row, :length].all() and not batch.attention_mask[row, length:].any()
            assert (batch.labels[row, length:] == IGNORE_INDEX).all()
            out.append(batch.input_ids[row, :length].tolist())
    return out


CASES = [
    ("tabular", {}, 1000),
    ("tabular", {}, 16),
    ("tabular", {"packing": "best_fit", "max_sequences_per_example": None}, 40),
    ("grouped", GROUPED, 1000),
    ("grouped", {**GROUPED, "packing": "best_fit", "exact_budget": True}, 5),
    ("sequential", GROUPED, None),
]


@pytest.mark.parametrize(("mode", "settings", "buffer"), CASES)
def test_energon_makes_the_examples_assemble_stream_makes(dataset, tokenizer, mode, settings, buffer):
    encoder = RecordAssemblyTaskEncoder(
        tokenizer, mode, max_seq_length=MAX_SEQ_LENGTH, column_types=TYPES, **settings
    )
    got = rows_of(get_loader(load(dataset, encoder, buffer=buffer)))
    records, names = loaded_records(dataset)
    options = AssemblyOptions(mode=mode, max_seq_length=MAX_SEQ_LENGTH, **settings)
    expected = [
        e.input_ids.tolist() for e in assemble_stream(records, tokenizer, options, window=buffer, names=names)
    ]
    assert got == expected
    assert len(got) > 5


@pytest.mark.parametrize(("mode", "buffer"), [("grouped", 6), ("sequential", None)])
def test_record_keys_name_the_records_of_each_block_in_order(dataset, tokenizer, mode, buffer):
    """The shards keep each customer's records in CSV order, not by date: an example's record_keys are its
    records in the order its blocks hold them (by date), one BOS ... EOS block per run of one customer."""
    encoder = RecordAssemblyTaskEncoder(
        tokenizer, mode, max_seq_length=MAX_SEQ_LENGTH, column_types=TYPES, **GROUPED
    )
    samples = list(get_loader(load(dataset, RecordOrder(), batch_size=None)))
    by_key = {s.__key__: {**s.record, "amount": float(s.record["amount"])} for s in samples}
    columns = tuple(samples[0].record)
    layout = layout_for(
        AssemblyOptions(mode=mode, max_seq_length=MAX_SEQ_LENGTH, **GROUPED), tokenizer, columns
    )
    out_of_order = 0
    for batch in get_loader(load(dataset, encoder, buffer=buffer, batch_size=1)):
        keys = batch.record_keys[0]
        records = [by_key[key] for key in keys]
        blocks = [list(run) for _, run in groupby(records, key=lambda r: r["customer_id"])]
        expected = []
        for block in blocks:
            tokens = layout.tokenize(block, str).tokens.tolist()
            expected += [tokenizer.bos_id, *tokens, tokenizer.eos_id]
        labels = batch.labels[0, : batch.lengths[0]]
        assert labels[labels != IGNORE_INDEX].tolist() == expected
        out_of_order += sorted(keys) != keys
    assert out_of_order, "the data set should have records read out of date order"


@pytest.mark.parametrize(
    ("mode", "settings", "buffer"),
    [
        ("tabular", {}, 1000),
        ("grouped", GROUPED, 1000),
        ("sequential", {**GROUPED, "randomize_budget": False}, None),
    ],
)
def test_energon_in_one_window_makes_what_assemble_records_makes(dataset, tokenizer, mode, settings, buffer):
    """With a packing buffer that holds everything (and full sequential budgets), the loader's examples are
    assemble_records' over the records in the loader's order, shuffle off."""
    encoder = RecordAssemblyTaskEncoder(
        tokenizer, mode, max_seq_length=MAX_SEQ_LENGTH, column_types=TYPES, **settings
    )
    got = rows_of(get_loader(load(dataset, encoder, buffer=buffer)))
    records, _ = loaded_records(dataset)
    whole = assemble_records(
        records, tokenizer, mode, max_seq_length=MAX_SEQ_LENGTH, shuffle=False, **settings
    )
    assert got == [e.input_ids.tolist() for e in whole.train]


def sparse_rows(count: int, first: int = 0) -> list[dict]:
    """JSONL rows of customers in runs of 5, the optional `note` left out of all rows but every third (from
    row `first`)."""
    rows = []
    for index in range(count):
        row = {"customer_id": f"C-{index // 5}", "date": f"2024-01-{index % 28 + 1:02d}", "amount": index}
        if index % 3 == first:
            row["note"] = f"note {index}"
        rows.append(row)
    return rows


def jsonl_dataset(root, rows: list[dict]):
    (root / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    write_dataset(
        open_sources([root / "rows.jsonl"]),
        root / "prepared",
        group_by="customer_id",
        group_contiguous=True,
        maxcount=12,
    )
    return root / "prepared"


@pytest.fixture(scope="module")
def sparse_dataset(tmp_path_factory):
    return jsonl_dataset(tmp_path_factory.mktemp("sparse"), sparse_rows(30))


@pytest.mark.parametrize(("mode", "settings", "buffer"), [("tabular", {}, 4), ("grouped", GROUPED, 2)])
def test_records_that_leave_a_column_out_get_the_streams_schema_and_null(
    sparse_dataset, tokenizer, mode, settings, buffer
):
    """One schema prompt for every example, the first record's, and null for a column a record leaves out,
    as assemble_stream gives them (energon gave each set of columns its own prompt)."""
    encoder = RecordAssemblyTaskEncoder(tokenizer, mode, max_seq_length=MAX_SEQ_LENGTH, **settings)
    got = rows_of(get_loader(load(sparse_dataset, encoder, buffer=buffer)))
    samples = list(get_loader(load(sparse_dataset, RecordOrder(), batch_size=None)))
    records = [s.record for s in samples]
    assert "note" in records[0] and "note" not in records[1]
    options = AssemblyOptions(mode=mode, max_seq_length=MAX_SEQ_LENGTH, **settings)
    expected = assemble_stream(records, tokenizer, options, window=buffer, names=map(sample_name, samples))
    assert got == [e.input_ids.tolist() for e in expected]


def test_a_record_with_a_column_outside_the_streams_schema_is_named_until_columns_names_it(
    tmp_path, tokenizer
):
    """The stream's first record leaves `note` out: a later record that has one is refused, as assemble_stream
    refuses it, until `columns` names every column."""
    dataset = jsonl_dataset(tmp_path, sparse_rows(9, first=2))

    def batches(**settings):
        encoder = RecordAssemblyTaskEncoder(tokenizer, max_seq_length=MAX_SEQ_LENGTH, **settings)
        return list(get_loader(load(dataset, encoder, buffer=4, error_handler=reraise_exception)))

    with pytest.raises(
        RecordSchemaError, match=r"/00+2 has column 'note', which is not in the schema.*columns="
    ):
        batches()
    got = batches(columns=("customer_id", "date", "amount", "note"))
    assert sum(len(keys) for batch in got for keys in batch.record_keys) == 9


def test_a_restored_loader_keeps_its_streams_schema(sparse_dataset, tokenizer):
    """State saved while the packing buffer holds rows 0-3; row 4, read next, leaves `note` out: the restored
    loader still writes row 0's schema."""

    def fresh():
        encoder = RecordAssemblyTaskEncoder(tokenizer, max_seq_length=MAX_SEQ_LENGTH)
        return get_savable_loader(load(sparse_dataset, encoder, buffer=4, workers=1, batch_size=1))

    expected, got = batches_around_a_restore(fresh, taken=1)
    assert len(expected) > 3 and [a.__key__ for a in got] == [b.__key__ for b in expected]
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.input_ids, b.input_ids)


def test_groups_stay_whole_across_epochs_and_shuffled_shards(dataset, tokenizer):
    """Two epochs with energon reshuffling the shards: every customer's group comes whole, twice."""
    encoder = RecordAssemblyTaskEncoder(
        tokenizer,
        "grouped",
        max_seq_length=MAX_SEQ_LENGTH,
        column_types=TYPES,
        max_sequences_per_example=1,
        group_shuffle_buffer_size=8,
        **GROUPED,
    )
    records, _ = loaded_records(dataset)
    sizes = {}
    for record in records:
        sizes[record["customer_id"]] = sizes.get(record["customer_id"], 0) + 1
    seen: dict[str, list[int]] = {}
    batches = get_loader(load(dataset, encoder, buffer=20, repeat=True))
    for _, batch in zip(range(2 * len(sizes) // 3 + 3), batches, strict=False):
        for groups, count in zip(batch.groups, batch.num_records, strict=True):
            seen.setdefault(groups[0], []).append(count)
    assert all(counts == [sizes[group]] * len(counts) for group, counts in seen.items())
    assert sum(len(c) for c in seen.values()) >= 2 * len(sizes)


@pytest.mark.parametrize(
    ("mode", "settings", "buffer"),
    [
        ("tabular", {}, 12),
        ("grouped", {**GROUPED, "group_shuffle_buffer_size": 4}, 6),
        ("sequential", GROUPED, None),
    ],
)
def test_restored_loader_state_gives_the_same_next_batches(dataset, tokenizer, mode, settings, buffer):
    def fresh():
        encoder = RecordAssemblyTaskEncoder(
            tokenizer, mode, max_seq_length=MAX_SEQ_LENGTH, column_types=TYPES, **settings
        )
        return get_savable_loader(load(dataset, encoder, buffer=buffer, workers=1, batch_size=1))

    expected, got = batches_around_a_restore(fresh)
    assert len(expected) > 3 and [a.__key__ for a in got] == [b.__key__ for b in expected]
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"shuffle_buffer_size": 10}, "shuffle buffer.*group_shuffle_buffer_size"),
        ({"parallel_shard_iters": 2}, "parallel_shard_iters=1"),
        ({"max_samples_per_sequence": 4}, "max_samples_per_sequence=None"),
    ],
)
def test_energon_set_ups_that_would_break_groups_are_refused(dataset, tokenizer, settings, message):
    encoder = RecordAssemblyTaskEncoder(tokenizer, "sequential", column_types=TYPES, **GROUPED)
    with pytest.raises(ValueError, match=message):
        load(dataset, encoder, **settings)


def test_the_packing_buffer_is_asked_for_where_the_mode_needs_it(dataset, tokenizer):
    with pytest.raises(ValueError, match="grouped mode packs groups.*packing_buffer_size=N"):
        load(dataset, RecordAssemblyTaskEncoder(tokenizer, "grouped", **GROUPED))
    with pytest.raises(ValueError, match="pass packing_buffer_size=None"):
        load(dataset, RecordAssemblyTaskEncoder(tokenizer, "sequential", **GROUPED), buffer=10)


@pytest.mark.parametrize("multiple", [0, -4])
def test_a_padding_multiple_below_one_is_refused_when_the_encoder_is_made(tokenizer, multiple):
    """-4 made some batches narrower than their longest example: each failed in `batch` and energon skipped it
    (8 of 28 batches came); 0 was taken as no padding."""
    with pytest.raises(ValueError, match=f"pad_to_multiple_of must be at least 1, got {multiple}"):
        RecordAssemblyTaskEncoder(tokenizer, pad_to_multiple_of=multiple)


def test_a_group_too_long_is_named_when_the_loader_reraises(dataset, tokenizer):
    encoder = RecordAssemblyTaskEncoder(
        tokenizer, "grouped", max_seq_length=150, column_types=TYPES, **GROUPED
    )
    with pytest.raises(GroupTooLongError, match=r"group 'C-\d{3}' \(\d records\) takes \d+ tokens"):
        list(get_loader(load(dataset, encoder, buffer=10, error_handler=reraise_exception)))


@pytest.mark.parametrize(("mode", "buffer"), [("grouped", 4), ("sequential", None)])
def test_a_record_without_a_group_value_is_named_as_assemble_stream_names_it(
    tmp_path, tokenizer, mode, buffer
):
    """`write --group-by` puts records of no group value together at the end; the loader made them one more
    group (of value None) where assemble_stream and assemble_records refuse such a record."""
    rows = [{"customer_id": f"C-{i // 4}", "date": f"2024-01-{i + 1:02d}", "amount": i} for i in range(8)]
    rows[5]["customer_id"] = None
    dataset = jsonl_dataset(tmp_path, rows)
    encoder = RecordAssemblyTaskEncoder(tokenizer, mode, max_seq_length=MAX_SEQ_LENGTH, **GROUPED)
    with pytest.raises(MissingColumnError, match=r"sample shard-0+\.tar/0+5 has no value in group_by column"):
        list(get_loader(load(dataset, encoder, buffer=buffer, error_handler=reraise_exception)))


def test_a_val_loader_fills_sequential_examples_to_the_full_budget(dataset, tokenizer):
    """The reference fills its test split's sequential examples to 100% of the budget; a val loader drew
    budgets of 70-100% as for training."""
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)

    def val(encoder, batch_size):
        return get_loader(
            get_val_dataset(
                dataset, split_part="train", worker_config=config, batch_size=batch_size, task_encoder=encoder
            )
        )

    samples = list(val(RecordOrder(), None))  # a val loader reads in file order, unlike a train loader
    records = [{**s.record, "amount": float(s.record["amount"])} for s in samples]
    options = AssemblyOptions(mode="sequential", max_seq_length=MAX_SEQ_LENGTH, **GROUPED)

    def stream(**settings):
        examples = assemble_stream(
            records, tokenizer, replace(options, **settings), names=map(sample_name, samples)
        )
        return [e.input_ids.tolist() for e in examples]

    encoder = RecordAssemblyTaskEncoder(
        tokenizer, "sequential", max_seq_length=MAX_SEQ_LENGTH, column_types=TYPES, **GROUPED
    )
    assert rows_of(val(encoder, 3)) == stream(randomize_budget=False) != stream()


def test_two_workers_divide_the_records_by_count_so_only_the_group_across_the_cut_is_cut(dataset, tokenizer):
    """energon divides the dataset among workers by sample count, not by shard: every record still comes once,
    and every group comes whole but the one that straddles the cut point (at most workers - 1 of them)."""
    encoder = RecordAssemblyTaskEncoder(
        tokenizer,
        "grouped",
        max_seq_length=MAX_SEQ_LENGTH,
        column_types=TYPES,
        max_sequences_per_example=1,
        **GROUPED,
    )
    samples = list(get_loader(load(dataset, RecordOrder(), batch_size=None)))
    by_index = [s.record["customer_id"] for s in sorted(samples, key=lambda s: s.__sources__[0].index)]
    config = WorkerConfig(rank=0, world_size=1, num_workers=2)
    _, cut_at, _ = Sharder.split_samples_to_workers(0, len(by_index), config)
    straddling = [by_index[cut_at]] if by_index[cut_at - 1] == by_index[cut_at] else []
    pieces: dict[str, list[int]] = {}
    for batch in get_loader(load(dataset, encoder, buffer=8, workers=2)):
        for groups, count in zip(batch.groups, batch.num_records, strict=True):
            pieces.setdefault(groups[0], []).append(count)
    assert {group: sum(counts) for group, counts in pieces.items()} == dict(Counter(by_index))
    assert [group for group, counts in pieces.items() if len(counts) > 1] == straddling
    assert straddling, "this data set has a group across the cut, so the test shows one"
