"""Every way records cannot become examples is a ValueError raised before any example, naming the record or
group, its token count, the budget, and what to change."""

from __future__ import annotations

import pytest

from cookers.records import assemble_records, assemble_stream
from cookers.records_errors import (
    GroupTooLongError,
    MissingColumnError,
    PromptTooLongError,
    RecordAssemblyError,
    RecordSchemaError,
    RecordTooLongError,
    SplitTooLargeError,
)
from cookers.records_options import AssemblyOptions
from tests.cookers.test_records import char_tokenizer, record_ids

TOKENIZER = char_tokenizer()


def rows(count: int, long_at: int | None = None, groups: int = 5) -> list[dict]:
    return [{"g": f"g{i % groups}", "k": i, "v": "x" * (300 if i == long_at else 5)} for i in range(count)]


def test_every_error_is_a_value_error():
    for error in (
        PromptTooLongError,
        RecordTooLongError,
        GroupTooLongError,
        MissingColumnError,
        RecordSchemaError,
        SplitTooLargeError,
    ):
        assert issubclass(error, RecordAssemblyError) and issubclass(error, ValueError)


def test_a_prompt_that_leaves_no_room_names_its_size_and_the_fix():
    with pytest.raises(
        PromptTooLongError, match=r"prompt takes 98 tokens, and with 4 BOS/EOS.*max_seq_length 90.*Drop"
    ):
        assemble_records(rows(3), TOKENIZER, max_seq_length=90)


def test_a_record_too_long_is_named_with_its_tokens_and_the_budget():
    # The prompt is 98 tokens without its BOS/EOS; the reference leaves L - 98 - 4 for records.
    records = rows(40, long_at=17)
    with pytest.raises(RecordTooLongError) as caught:
        assemble_records(records, TOKENIZER, max_seq_length=300)
    message = str(caught.value)
    assert message.startswith(
        f"record #17 takes {len(record_ids(records[17]))} tokens, more than the 198 a record"
    )
    assert "max_seq_length 300" in message and "filter out records with long text values" in message


def test_a_record_too_long_in_a_stream_stops_its_window_before_any_of_its_examples():
    options = AssemblyOptions(max_seq_length=300)
    records = rows(40, long_at=17)
    stream = assemble_stream(records, TOKENIZER, options, window=10, names=[f"r{i}" for i in range(40)])
    made = []
    with pytest.raises(RecordTooLongError, match=rf"^r17 takes {len(record_ids(records[17]))} tokens"):
        for example in stream:
            made.append(example)
    assert sum(e.num_records for e in made) == 10  # the first window only


def test_a_group_too_long_is_named_with_its_records_tokens_and_budget():
    records = [{"g": "big" if i < 12 else f"g{i}", "k": i, "v": "x" * 10} for i in range(20)]
    with pytest.raises(GroupTooLongError) as caught:
        assemble_records(records, TOKENIZER, "grouped", group_by="g", max_seq_length=400)
    tokens = sum(len(record_ids(r)) for r in records[:12]) + 2
    message = str(caught.value)
    assert message.startswith(
        f"group 'big' (12 records) takes {tokens} tokens with its BOS and EOS, more than the 300"
    )
    assert "mode='sequential'" in message and "max_seq_length 400" in message


def test_a_missing_group_or_order_column_is_named_with_the_columns_there_are():
    with pytest.raises(
        MissingColumnError, match=r"group_by column 'customer' is not among the records' columns \(g, k, v\)"
    ):
        assemble_records(rows(3), TOKENIZER, "grouped", group_by="customer")
    with pytest.raises(MissingColumnError, match=r"order_by column 'time'"):
        assemble_records(rows(3), TOKENIZER, "sequential", group_by="g", order_by="time")
    records = rows(3)
    records[1]["g"] = None
    with pytest.raises(MissingColumnError, match=r"record #1 has no value in group_by column 'g'"):
        assemble_records(records, TOKENIZER, "grouped", group_by="g")


def test_a_split_that_leaves_fewer_than_100_training_records_is_refused():
    with pytest.raises(
        SplitTooLargeError, match=r"leaves 90 training records of 150 \(60 records go to validation\)"
    ):
        assemble_records(rows(150), TOKENIZER, test_size=60)
    assemble_records(rows(150), TOKENIZER, test_size=50)  # 100 stay: allowed


def test_a_record_outside_the_schema_is_named():
    records = rows(3)
    records[2]["extra"] = 1
    with pytest.raises(RecordSchemaError, match=r"record #2 has column 'extra', which is not in the schema"):
        assemble_records(records, TOKENIZER)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mode": "grouped"}, "needs group_by"),
        ({"mode": "tabular", "group_by": "g"}, "takes no group_by"),
        ({"mode": "sequential", "packing": "best_fit"}, "best_fit"),
        ({"prompt_template": "{columns}"}, "may use only"),
        ({"max_sequences_per_example": 0}, "max_sequences_per_example"),
        ({"mode": "spreadsheet"}, "unknown mode"),
    ],
)
def test_settings_that_cannot_work_are_refused_as_they_are_made(settings, message):
    with pytest.raises(ValueError, match=message):
        AssemblyOptions(**settings)
