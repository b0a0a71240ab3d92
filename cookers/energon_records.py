"""energon glue for record assembly: a cooker for record samples and the `RecordAssemblyTaskEncoder`, which
makes inside energon's loader the examples `cookers.records.assemble_stream` makes from the same records.

Records come from `shardprep write` (CSV, JSONL or Parquet): one sample per record, its row in a `json` part
(column order kept). For the grouped and sequential modes write them with `--group-by COL
--group-contiguous`, so that every group lies whole and contiguous in one shard.

The steps, one energon hook each:

1. cooker (`cook_record`): a crude sample's `json` part becomes a `RecordSample` holding the record dict.
   `build_encode_sample` puts `StreamSchemaDataset` after it: it gives every record the schema of its
   worker's stream, as `assemble_stream` takes it (`columns`, or the first record's columns), saved with the
   loader's state.
2. grouped, sequential: `build_encode_sample` puts `ContiguousGroupsDataset` after that: it gathers each
   run of consecutive records of one group into one `RecordGroup`. Its open group is saved with the loader's
   state (as energon's own buffers are), so a restored loader goes on where it was. Optionally an energon
   `ShuffleBufferDataset` of whole groups follows (`group_shuffle_buffer_size`).
3. `encode_sample` (stateless): tabular: tokenize one record; grouped: tokenize one group (records in
   `order_by` order, checked against the room of an example); sequential: cut one group into its examples,
   budgets drawn from the group's own seeded stream, so they depend on nothing but the group (in a val
   loader every budget is the full one, as in the reference's test split).
4. tabular, grouped: `select_samples_to_pack` (stateless) plans the packing buffer with the flush rule
   (next-fit as the reference, or best-fit): `packing_buffer_size` counts records (groups in grouped mode);
   `pack_selected_samples` (stateless) lays an example out.
5. `batch`: examples padded to the longest (`pad_id`, attention mask 0, label -100 on padding).

Whole groups in order. What the prepared layout guarantees: `--group-contiguous` writes each group whole and
in input order into one shard, so a shard boundary is a group boundary, and energon reads every slice of a
shard sample after sample. What energon may do: shuffle the order of shards (slices) every epoch, and divide
the dataset among workers. What it must not do, and what `build_encode_sample` refuses with the fix:

- its shuffle buffer (`shuffle_buffer_size`) draws single records from across groups: pass None and shuffle
  whole groups with `group_shuffle_buffer_size` instead;
- `parallel_shard_iters` > 1 interleaves records of several shards: pass 1;
- `max_samples_per_sequence` cuts shards into slices read at different times: pass None.

energon divides a dataset among all workers of all ranks by sample count, not by shard, so a group that
straddles one of those cut points is seen as two groups, one by each worker: at most `workers x ranks - 1`
groups per pass. A group also ends where the records' source jumps (another shard, or the next epoch).

Records that leave a column out (JSONL with optional fields): every example of a worker has its stream's
schema prompt, and a record's missing columns are written as null, as `assemble_stream` writes them. A record
with a column outside that schema is an error naming it (RecordSchemaError). Each worker's stream starts
with a record of its own, so when records leave columns out pass `columns=(...)` naming every column: then
every example of every worker gets the same prompt, whichever record comes first.

Errors (`cookers.records_errors`) name the sample; energon's `global_error_handler` decides what happens to
it: by default it logs the error and skips the record (tabular) or the group; `reraise_exception` stops.

    loader = get_loader(get_train_dataset(
        "prepared/", worker_config=WorkerConfig(rank=0, world_size=1, num_workers=2), batch_size=4,
        shuffle_buffer_size=None, max_samples_per_sequence=None, parallel_shard_iters=1,
        packing_buffer_size=256,
        task_encoder=RecordAssemblyTaskEncoder(tokenizer, mode="grouped", group_by="customer_id",
                                               order_by="date", column_types={"amount": float}),
    ))
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from megatron.energon import Batch, Cooker, Sample, TaskEncoder, edataclass, stateless
from megatron.energon.flavors.base_dataset import (
    SavableDataset,
    add_sample_restore_key,
    set_sample_restore_key,
)
from megatron.energon.flavors.webdataset.sample_loader import WebdatasetSampleLoaderDataset
from megatron.energon.task_encoder.cooking import basic_sample_keys
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers.base import BaseWrapperDataset, SampleIndex
from megatron.energon.wrappers.buffer import SavableSampleBuffer
from megatron.energon.wrappers.shuffle_buffer_dataset import ShuffleBufferDataset

from cookers.energon_batching import BatchingHook
from cookers.records import layout_for, plan_units, sequential_examples, tokenize_group, value_key
from cookers.records_errors import RecordSchemaError
from cookers.records_layout import IGNORE_INDEX, RecordExample, RecordLayout, TokenizedRecords
from cookers.records_options import AssemblyOptions
from cookers.tokenizer import TokenizerAdapter

#: The part of a sample that holds the record (`shardprep write`'s `json-line` / `json-row` parts).
RECORD_PART = "json"


@edataclass
class RecordSample(Sample):
    """A cooked record: its columns and values, in the order of the source, and the schema of the stream it
    came in (`StreamSchemaDataset`; empty when it came in none)."""

    record: dict
    columns: tuple = ()


@edataclass
class RecordGroup(Sample):
    """The records of one group, in the order they were read, with their samples' keys, the names that
    errors give them, and their stream's schema."""

    value: object
    records: list
    keys: list
    names: list
    columns: tuple = ()


@edataclass
class TokenizedUnit(Sample):
    """What the packing buffer holds: one record (tabular) or one group (grouped) as tokens, with the schema
    (columns) whose prompt its example gets."""

    ids: np.ndarray
    schema: tuple
    record_keys: list
    value: object = None


@edataclass
class AssembledExample(Sample):
    """One example, and the keys of the samples (records) it was made of, in the order it holds them."""

    example: RecordExample
    record_keys: list


@edataclass
class RecordBatch(Batch):
    """Examples padded to the longest: tensors of shape [B, T]."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    attention_mask: torch.Tensor
    lengths: list
    num_records: list
    groups: list
    #: The keys of each example's record samples, in the order the example holds the records.
    record_keys: list


def sample_name(sample: Any) -> str:
    """A sample as errors name it: its shard and key."""
    sources = getattr(sample, "__sources__", None)
    if sources:
        return f"sample {sources[0].shard_name}/{sample.__key__}"
    return f"sample {sample.__key__}"


@stateless
def cook_record(sample: dict) -> RecordSample:
    """Cook a crude sample: its `json` part (raw bytes, or already decoded) as a dict."""
    if RECORD_PART not in sample:
        parts = sorted(k for k in sample if not k.startswith("__"))
        raise ValueError(
            f"sample {sample['__key__']}: no {RECORD_PART} part holding a record (parts: {parts})"
        )
    record = sample[RECORD_PART]
    if isinstance(record, bytes | bytearray | str):
        record = json.loads(record)
    if not isinstance(record, dict):
        raise ValueError(
            f"sample {sample['__key__']}: the {RECORD_PART} part is a {type(record).__name__}, not a record"
        )
    return RecordSample(**basic_sample_keys(sample), record=record)


class StreamSchemaDataset(BaseWrapperDataset[RecordSample, RecordSample]):
    """Gives every record the schema of its worker's stream, as `assemble_stream` takes it: `columns`, or the
    columns of the first record the worker reads. The schema is saved with the loader's state and is part of
    each record's restore key, so a restored record keeps it."""

    _savable_fields = ("_columns",)

    def __init__(
        self, dataset: SavableDataset, columns: tuple[str, ...] | None, *, worker_config: WorkerConfig
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.columns = columns
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._columns = self.columns

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)

    def __iter__(self) -> Iterator[RecordSample]:
        for sample in self.dataset:
            if self._columns is None:
                self._columns = tuple(sample.record)
            yield self._stamped(sample, tuple(self._columns))

    def _stamped(self, sample: RecordSample, columns: tuple) -> RecordSample:
        sample.columns = columns
        return add_sample_restore_key(sample, columns, src=self)

    def restore_sample(self, restore_key: tuple) -> RecordSample:
        kind, columns, *inner = restore_key
        assert kind == type(self).__name__
        return self._stamped(self.dataset.restore_sample(tuple(inner)), tuple(columns))

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "columns": self.columns,
            "dataset": self.dataset.config(),
            "worker_config": self.worker_config.config(),
        }

    def __str__(self) -> str:
        return f"StreamSchemaDataset(columns={self.columns!r}, dataset={self.dataset})"


class ContiguousGroupsDataset(BaseWrapperDataset[RecordSample, RecordGroup]):
    """Gathers each run of consecutive records with one group value (`group_by`; None: every record is of
    one group) from one source into one `RecordGroup`. A run ends where the value changes, or where the
    records' source does not go on sample after sample (another shard, an epoch's restart)."""

    _savable_fields = ("_open", "_group_index")

    def __init__(self, dataset: SavableDataset, group_by: str | None, *, worker_config: WorkerConfig) -> None:
        super().__init__(dataset, worker_config=worker_config)
        self.group_by = group_by
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._open = SavableSampleBuffer(self.dataset, worker_config=self.worker_config)
        self._group_index = SampleIndex(self.worker_config, src=self)

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)  # an upper bound: there are fewer groups than records

    def _mark(self, sample: RecordSample) -> tuple:
        """(group value, source, position) of a record, to tell where a run ends."""
        value = value_key(sample.record.get(self.group_by) if self.group_by is not None else None)
        sources = sample.__sources__
        if not sources:
            return value, None, None
        source = sources[0]
        return value, (str(source.dataset_path), source.shard_name), source.index

    @staticmethod
    def _continues(last: tuple, mark: tuple) -> bool:
        same = last[0] == mark[0] and last[1] == mark[1]
        if not same or last[2] is None or mark[2] is None:
            return same
        return isinstance(last[2], int) and mark[2] == last[2] + 1

    def __iter__(self) -> Iterator[RecordGroup]:
        self._open.worker_start()
        last = self._mark(self._open.buffer[-1]) if self._open.len_worker() else None
        for sample in self.dataset:
            mark = self._mark(sample)
            done = self._flush() if last is not None and not self._continues(last, mark) else None
            # The record goes into the buffer before the finished group is handed on: state saved while
            # this generator waits at the yield must hold every record taken from the source.
            self._open.append(sample)
            last = mark
            if done is not None:
                yield done
        if self._open.len_worker():
            yield self._flush()

    def _flush(self) -> RecordGroup:
        samples, restore_keys = self._open.flush()
        with self._group_index.ctx() as index:
            group = self._group(samples)
        set_sample_restore_key(group, index, *restore_keys, src=self)
        return group

    def _group(self, samples: list[RecordSample]) -> RecordGroup:
        first = samples[0]
        value = first.record.get(self.group_by) if self.group_by is not None else None
        return RecordGroup(
            __key__=first.__key__,
            __restore_key__=(),
            __subflavors__=first.__subflavors__,
            __sources__=tuple(source for s in samples for source in (s.__sources__ or ())),
            value=value,
            records=[s.record for s in samples],
            keys=[s.__key__ for s in samples],
            names=[sample_name(s) for s in samples],
            columns=first.columns,
        )

    def restore_sample(self, restore_key: tuple) -> RecordGroup:
        kind, index, *restore_keys = restore_key
        assert kind == type(self).__name__
        samples = [self.dataset.restore_sample(key) for key in restore_keys]
        with self._group_index.ctx(index):
            group = self._group(samples)
        set_sample_restore_key(group, index, *restore_keys, src=self)
        return group

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "group_by": self.group_by,
            "dataset": self.dataset.config(),
            "worker_config": self.worker_config.config(),
        }

    def __str__(self) -> str:
        return f"ContiguousGroupsDataset(group_by={self.group_by!r}, dataset={self.dataset})"


def check_whole_groups(dataset: SavableDataset) -> None:
    """ValueError, with the fix, when energon is set up to hand over records of a group out of order or
    interleaved with others (see the module's text); loaders it does not know are left unchecked."""
    for inner in _inner_datasets(dataset):
        if isinstance(inner, ShuffleBufferDataset):
            raise ValueError(
                f"energon's shuffle buffer (shuffle_buffer_size={inner.size}) mixes records of different groups,"
                " and grouped and sequential assembly need whole groups in order: pass shuffle_buffer_size=None,"
                " and RecordAssemblyTaskEncoder(..., group_shuffle_buffer_size=N) to shuffle whole groups"
            )
        if isinstance(inner, WebdatasetSampleLoaderDataset):
            if inner.parallel_slice_iters > 1:
                raise ValueError(
                    f"parallel_shard_iters={inner.parallel_slice_iters} interleaves the records of several"
                    " shards, and grouped and sequential assembly need whole groups in order: pass"
                    " parallel_shard_iters=1 to get_train_dataset"
                )
            shard_edges = set()
            for reader in inner.join_readers[:1]:
                shard_edges.update(getattr(reader, "shard_count_cumsum", ()))
            for offsets in inner.workers_slice_offsets if shard_edges else ():
                inside = [o for o in list(offsets)[1:-1] if o not in shard_edges]
                if inside:
                    raise ValueError(
                        f"max_samples_per_sequence cuts shards into slices (at sample {inside[0]}) that energon"
                        " reads at different times, which can cut a group in two: pass max_samples_per_sequence=None"
                    )


def _inner_datasets(dataset: SavableDataset) -> Iterator[SavableDataset]:
    yield dataset
    for inner in getattr(dataset, "datasets", ()):
        yield from _inner_datasets(inner)


class RecordAssemblyTaskEncoder(BatchingHook, TaskEncoder[RecordSample, Any, RecordBatch, RecordBatch]):
    """Assemble Safe Synthesizer's tabular, grouped or sequential examples from record samples.

    `settings` are `cookers.records_options.AssemblyOptions` fields (`max_seq_length`,
    `max_sequences_per_example`, `group_by`, `order_by`, `packing`, `exact_budget`, `prompt_template`, ...).
    `column_types` converts values as records are read (`{"amount": float}`: CSV values are text).
    `group_shuffle_buffer_size` shuffles whole groups (grouped, sequential). Tabular and grouped modes need
    `packing_buffer_size` (records, or groups) in `get_train_dataset`; sequential mode takes none.
    """

    cookers = (Cooker(cook_record),)

    def __init__(
        self,
        tokenizer: TokenizerAdapter,
        mode: str = "tabular",
        *,
        column_types: Mapping[str, Callable[[Any], Any]] | None = None,
        group_shuffle_buffer_size: int | None = None,
        pad_to_multiple_of: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        self.options = AssemblyOptions(mode=mode, **settings)  # type: ignore[arg-type]
        if group_shuffle_buffer_size is not None and self.options.mode == "tabular":
            raise ValueError(
                "group_shuffle_buffer_size shuffles whole groups (grouped, sequential); tabular mode shuffles"
                " records with energon's shuffle_buffer_size"
            )
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
        self.tokenizer = tokenizer
        self.column_types = dict(column_types or {})
        self.group_shuffle_buffer_size = group_shuffle_buffer_size
        self.pad_to_multiple_of = pad_to_multiple_of
        self._layouts: dict[tuple, RecordLayout] = {}

    # -- the loader's shape -----------------------------------------------------------------------------------
    def build_encode_sample(self, dataset: SavableDataset, *, worker_config: WorkerConfig) -> SavableDataset:
        """Give records their stream's schema; grouped and sequential: gather whole groups (and shuffle them)
        before encoding."""
        dataset = StreamSchemaDataset(dataset, self.options.columns, worker_config=worker_config)
        if self.options.mode != "tabular":
            check_whole_groups(dataset)
            dataset = ContiguousGroupsDataset(dataset, self.options.group_by, worker_config=worker_config)
            if self.group_shuffle_buffer_size is not None and self.group_shuffle_buffer_size > 1:
                dataset = ShuffleBufferDataset(
                    dataset, size=self.group_shuffle_buffer_size, worker_config=worker_config
                )
        return super().build_encode_sample(dataset, worker_config=worker_config)

    def before_batching(
        self,
        dataset: SavableDataset,
        *,
        batch_size: int | None,
        packing_buffer_size: int | None,
        worker_config: WorkerConfig,
    ) -> tuple[SavableDataset, int | None]:
        """Refuse a packing buffer the mode cannot use, or its absence where it is needed."""
        mode = self.options.mode
        if mode == "sequential" and packing_buffer_size is not None:
            raise ValueError(
                "sequential mode makes each group's examples on its own: pass packing_buffer_size=None"
            )
        if mode != "sequential" and packing_buffer_size is None:
            unit = "records" if mode == "tabular" else "groups"
            raise ValueError(
                f"{mode} mode packs {unit} in energon's packing buffer: pass packing_buffer_size=N"
            )
        return dataset, packing_buffer_size

    def build_val_datasets(self, **settings: Any) -> SavableDataset:
        """Validation examples as the reference makes its test split's: sequential mode fills every example to
        the full budget (no draw), whatever `randomize_budget` says for training."""
        if self.options.mode == "sequential" and self.options.randomize_budget:
            full = copy.copy(self)
            full.options = replace(self.options, randomize_budget=False)
            full._layouts = {}
            return full.build_val_datasets(**settings)
        return super().build_val_datasets(**settings)

    # -- the hooks --------------------------------------------------------------------------------------------
    def _typed(self, record: dict, name: str) -> dict:
        """The record with `column_types` applied; RecordSchemaError naming a value that does not convert."""
        if not self.column_types:
            return record
        typed = dict(record)
        for column, convert in self.column_types.items():
            value = typed.get(column)
            if value is None:
                continue
            try:
                typed[column] = convert(value)
            except (TypeError, ValueError) as error:
                raise RecordSchemaError(f"{name}: {column}={value!r} does not convert ({error})") from None
        return typed

    def _layout(self, schema: tuple) -> RecordLayout:
        """The layout of one schema (the records' columns), made once per process."""
        layout = self._layouts.get(schema)
        if layout is None:
            layout = self._layouts[schema] = layout_for(self.options, self.tokenizer, schema)
        return layout

    def _schema(self, sample: RecordSample | RecordGroup, record: Mapping) -> tuple:
        """The stream's schema; for a sample that came in no stream, `columns` or its (first) record's."""
        if sample.columns:
            return tuple(sample.columns)
        return self.options.columns if self.options.columns is not None else tuple(record)

    @stateless
    def encode_sample(self, sample: RecordSample | RecordGroup) -> Generator[Any, None, None]:
        """A record (tabular) or a group as tokens for the packing buffer; a group's examples (sequential)."""
        if isinstance(sample, RecordSample):
            name = sample_name(sample)
            record = self._typed(sample.record, name)
            schema = self._schema(sample, record)
            tokens = self._layout(schema).tokenize([record], lambda _: name)
            yield TokenizedUnit.derive_from(
                sample, ids=tokens.tokens, schema=schema, record_keys=[sample.__key__]
            )
            return
        records = [self._typed(r, n) for r, n in zip(sample.records, sample.names, strict=True)]
        schema = self._schema(sample, records[0])
        layout = self._layout(schema)
        if self.options.mode == "grouped":
            ids, order = tokenize_group(layout, sample.value, records, sample.names)
            keys = [sample.keys[i] for i in order.tolist()]
            yield TokenizedUnit.derive_from(
                sample, ids=ids, schema=schema, record_keys=keys, value=sample.value
            )
            return
        examples, order = sequential_examples(layout, sample.value, records, sample.names)
        ordered_keys = [sample.keys[i] for i in order.tolist()]
        start = 0
        for number, example in enumerate(examples):
            keys = ordered_keys[start : start + example.num_records]
            start += example.num_records
            yield AssembledExample.derive_from(
                sample, __key__=f"{sample.__key__}#{number}", example=example, record_keys=keys
            )

    @stateless
    def select_samples_to_pack(self, samples: list[TokenizedUnit]) -> list[list[TokenizedUnit]]:
        """Plan the buffer with the flush rule; units of different schemas never share an example."""
        schemas: dict[tuple, list[int]] = {}
        for index, unit in enumerate(samples):
            schemas.setdefault(unit.schema, []).append(index)
        grouped = self.options.mode == "grouped"
        packs = []
        for schema, members in schemas.items():
            layout = self._layout(schema)
            sizes = [len(samples[i].ids) + (2 if grouped else 0) for i in members]
            order, offsets = plan_units(
                self.options, sizes, layout.group_room if grouped else layout.record_budget
            )
            chosen = [members[i] for i in order.tolist()]
            packs.extend(
                [samples[i] for i in chosen[a:b]] for a, b in zip(offsets[:-1], offsets[1:], strict=True)
            )
        return packs

    @stateless
    def pack_selected_samples(self, samples: list[TokenizedUnit]) -> AssembledExample:
        """Lay one example out: one block of records (tabular), one block per group (grouped)."""
        layout = self._layout(samples[0].schema)
        count = len(samples)
        lengths = [len(s.ids) for s in samples]
        units = TokenizedRecords(
            np.concatenate([s.ids for s in samples]), np.concatenate(([0], np.cumsum(lengths)))
        )
        order = np.arange(count, dtype=np.int64)
        if self.options.mode == "grouped":  # every unit (a group's tokens) is a block of its own
            blocks, values = np.arange(count + 1, dtype=np.int64), [s.value for s in samples]
            example = layout.examples(units, order, blocks, np.array([0, count]), values)[0]
            example = replace(example, num_records=sum(len(s.record_keys) for s in samples))
        else:
            example = layout.examples(units, order, np.array([0, count]), np.array([0, 1]))[0]
        return AssembledExample.derive_from(
            samples[0],
            __key__="+".join(s.__key__ for s in samples),
            example=example,
            record_keys=[key for s in samples for key in s.record_keys],
        )

    @stateless
    def batch(self, samples: list[AssembledExample]) -> RecordBatch:
        """Pad examples to the longest (to a multiple of `pad_to_multiple_of`): pad id, mask 0, label -100."""
        lengths = [len(s.example) for s in samples]
        width = max(lengths)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = np.full((len(samples), width), self.tokenizer.pad_id, dtype=np.int64)
        labels = np.full((len(samples), width), IGNORE_INDEX, dtype=np.int64)
        mask = np.zeros((len(samples), width), dtype=np.int64)
        for row, (sample, length) in enumerate(zip(samples, lengths, strict=True)):
            ids[row, :length] = sample.example.input_ids
            labels[row, :length] = sample.example.labels
            mask[row, :length] = 1
        return RecordBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            input_ids=torch.from_numpy(ids),
            labels=torch.from_numpy(labels),
            attention_mask=torch.from_numpy(mask),
            lengths=lengths,
            num_records=[s.example.num_records for s in samples],
            groups=[s.example.groups for s in samples],
            record_keys=[s.record_keys for s in samples],
        )
