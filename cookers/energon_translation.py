"""energon glue for parallel text: a cooker for sentence pairs and the `TranslationTaskEncoder`, which
batches by length bucket through energon's `batch_group_criterion`.

`shardprep write --format parallel SOURCE TARGET [ALIGNMENT] OUT` writes one sample per line with the
parts `src.txt`, `tgt.txt` (and `align.txt`); a `json` part with `src`, `tgt` (and `align`) works too.
The steps map onto energon's hooks:

- cooker (`cook_translation_pair`): the parts become a `TranslationPair`.
- `encode_sample`: tokenize both sides (`tokenizers` JSON, sentencepiece model, through
  `cookers.tokenizer`), make the target's `ids` / `ids_out`, drop pairs by `LengthLimits` (counted),
  read the alignment and check it against the token counts.
- `batch_group_criterion`: the pair's bucket and that bucket's batch size (`LengthBuckets`). energon
  fills one bucket per key and emits a batch when it is full, so this composes with its shuffling,
  its workers (each fills its own buckets) and its saved state (which holds the buckets' samples).
- `batch`: pad to the longest source and target, alignments to the same widths; an irregular batch
  (`batch_multiplier`) is skipped.

Because every bucket says its own batch size, `get_train_dataset` must be given `batch_size=None`.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import torch
from megatron.energon import (
    Batch,
    Cooker,
    Sample,
    SavableDataset,
    SkipSample,
    TaskEncoder,
    WorkerConfig,
    basic_sample_keys,
    edataclass,
    stateless,
)

from cookers.energon_batching import BatchingHook
from cookers.tokenizer import TokenizerAdapter
from cookers.translation import (
    LengthBuckets,
    LengthLimits,
    alignment_pairs,
    check_alignment,
    pad_alignments,
    pad_sequences,
    shifted_targets,
    target_sequences,
)

#: Parts of a parallel-text sample as `shardprep write --format parallel` names them.
TEXT_PARTS = {"source": "src.txt", "target": "tgt.txt", "alignment": "align.txt"}
#: Fields of a `json` part holding a pair instead.
JSON_FIELDS = {"source": "src", "target": "tgt", "alignment": "align"}
#: The drop counter's name for pairs lost in batches skipped as irregular.
IRREGULAR = "irregular batch"


@edataclass
class TranslationPair(Sample):
    """A cooked sentence pair, with its pharaoh alignment line when there is one."""

    source: str
    target: str
    alignment: str | None = None


@edataclass
class TokenizedPair(Sample):
    """A pair as tokens: `target_ids` starts with `<s>`, `target_ids_out` ends with `</s>`; `alignment`
    holds (source, target) token positions, int64 [K, 2], or None."""

    source_ids: np.ndarray
    target_ids: np.ndarray
    target_ids_out: np.ndarray
    alignment: np.ndarray | None = None


@edataclass
class TranslationBatch(Batch):
    """Pairs of one bucket, padded: ids [B, S] / [B, T] (int64), lengths [B], alignment [B, T, S] float32.

    `target_length` counts `target_ids` (tokens + 1). `num_padding` is the padding of `source_ids` and
    `target_ids` (`target_ids_out` pads the same places). `dropped` counts pairs this worker dropped (by
    reason) since its previous batch: informational, not part of the loader's saved state.
    """

    source_ids: torch.Tensor
    source_length: torch.Tensor
    target_ids: torch.Tensor
    target_ids_out: torch.Tensor
    target_length: torch.Tensor
    alignment: torch.Tensor | None
    bucket: int | tuple[int, int]
    num_padding: int
    dropped: dict[str, int]


def _text(value: object, key: str, name: str) -> str:
    """A side of the pair as text; ValueError naming the sample for anything else (a JSON null, number
    or list would otherwise be trained on as its printed form)."""
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8")
    if not isinstance(value, str):
        raise ValueError(f"sample {key}: the {name} is a {type(value).__name__}, not text")
    return value


@stateless
def cook_translation_pair(sample: dict) -> TranslationPair:
    """Cook a crude sample: `src.txt` + `tgt.txt` (+ `align.txt`) parts, or a `json` part with `src`,
    `tgt` (and `align`) fields."""
    key = sample["__key__"]
    if TEXT_PARTS["source"] in sample and TEXT_PARTS["target"] in sample:
        fields = {name: sample.get(part) for name, part in TEXT_PARTS.items()}
    elif "json" in sample:
        record = sample["json"]
        record = json.loads(record) if isinstance(record, str | bytes | bytearray) else record
        if (
            not isinstance(record, dict)
            or JSON_FIELDS["source"] not in record
            or JSON_FIELDS["target"] not in record
        ):
            raise ValueError(f"sample {key}: the json part has no 'src' and 'tgt' fields")
        fields = {name: record.get(field) for name, field in JSON_FIELDS.items()}
    else:
        parts = sorted(k for k in sample if not k.startswith("__"))
        raise ValueError(
            f"sample {key}: no src.txt and tgt.txt parts (nor a json part) to cook (parts: {', '.join(parts)})"
        )
    alignment = fields["alignment"]
    return TranslationPair(
        **basic_sample_keys(sample),
        source=_text(fields["source"], key, "source"),
        target=_text(fields["target"], key, "target"),
        alignment=None if alignment is None else _text(alignment, key, "alignment"),
    )


class TranslationTaskEncoder(
    BatchingHook, TaskEncoder[TranslationPair, TokenizedPair, TranslationBatch, TranslationBatch]
):
    """Tokenize sentence pairs, drop those `limits` refuses, and batch them by length bucket.

    `target_tokenizer` defaults to `source_tokenizer` (a shared vocabulary); it must know `<s>` and
    `</s>` (its `bos_id` / `eos_id`). The tokenizers' own BOS/EOS settings are ignored: the source gets
    no marks and the target gets them as OpenNMT-tf does. Alignment positions are token positions of
    these tokenizers. Use with `get_train_dataset(..., batch_size=None, task_encoder=...)`.

    `drop_counts` counts the pairs dropped in this process; with worker processes, each batch's
    `dropped` tells what its worker dropped since its previous batch.
    """

    cookers = (Cooker(cook_translation_pair),)

    def __init__(
        self,
        source_tokenizer: TokenizerAdapter,
        buckets: LengthBuckets,
        target_tokenizer: TokenizerAdapter | None = None,
        limits: LengthLimits | None = None,
    ) -> None:
        target_tokenizer = target_tokenizer or source_tokenizer
        if target_tokenizer.bos_id is None or target_tokenizer.eos_id is None:
            missing = "<s> (bos_id)" if target_tokenizer.bos_id is None else "</s> (eos_id)"
            raise ValueError(
                f"the target tokenizer has no {missing}; name it when loading (load_tokenizer(..., bos_token=,"
                " eos_token=))"
            )
        self.source_tokenizer = dataclasses.replace(source_tokenizer, add_bos=False, add_eos=False)
        self.target_tokenizer = dataclasses.replace(target_tokenizer, add_bos=False, add_eos=False)
        self.shared = target_tokenizer is source_tokenizer
        self.buckets = buckets
        self.limits = limits or LengthLimits()
        self.bos_id, self.eos_id = target_tokenizer.bos_id, target_tokenizer.eos_id
        self.drop_counts: Counter[str] = Counter()  # every pair dropped in this process, by reason
        self._pending: Counter[str] = Counter()  # those not yet reported on a batch
        self._keys: dict[tuple[int, int], tuple[int | tuple[int, int], int]] = {}

    def _drop(self, reason: str, count: int = 1) -> None:
        self.drop_counts[reason] += count
        self._pending[reason] += count

    def _tokens(self, sample: TranslationPair) -> tuple[np.ndarray, np.ndarray]:
        if self.shared:
            source, target = self.source_tokenizer.encode_batch([sample.source, sample.target])
            return source, target
        return self.source_tokenizer.encode(sample.source), self.target_tokenizer.encode(sample.target)

    @stateless
    def encode_sample(self, sample: TranslationPair) -> TokenizedPair:
        """Tokenize one pair; skip it (counted) when the limits drop it."""
        source, target = self._tokens(sample)
        reason = self.limits.drop_reason(len(source), len(target))
        if reason is not None:
            self._drop(reason)
            raise SkipSample()
        alignment = None
        if sample.alignment is not None:
            try:
                alignment = alignment_pairs(sample.alignment)
                check_alignment(alignment, len(source), len(target), sample.alignment)
            except ValueError as error:
                raise ValueError(f"sample {sample.__key__}: {error}") from None
        ids, ids_out = target_sequences(target, self.bos_id, self.eos_id)
        return TokenizedPair.derive_from(
            sample, source_ids=source, target_ids=ids, target_ids_out=ids_out, alignment=alignment
        )

    def before_batching(
        self,
        dataset: SavableDataset,
        *,
        batch_size: int | None,
        packing_buffer_size: int | None,
        worker_config: WorkerConfig,
    ) -> tuple[SavableDataset, int | None]:
        """Refuse a fixed batch size when the dataset is built (energon would assert on every pair in the
        loader, log each and stop after a hundred)."""
        if batch_size is not None:
            raise ValueError(
                f"the TranslationTaskEncoder batches by length bucket, each bucket with its own batch size;"
                f" pass batch_size=None (got {batch_size}) and set the size in its LengthBuckets"
            )
        return dataset, packing_buffer_size

    def batch_group_criterion(self, sample: TokenizedPair) -> tuple[int | tuple[int, int], int]:
        """The pair's bucket key and that bucket's batch size (remembered per pair of lengths)."""
        lengths = len(sample.source_ids), len(sample.target_ids)
        found = self._keys.get(lengths)
        if found is None:
            found = self._keys[lengths] = self.buckets.key_of(*lengths)
        return found

    @stateless
    def batch(self, samples: list[TokenizedPair]) -> TranslationBatch:
        """Pad one bucket's pairs into tensors; skip an irregular batch."""
        if not self.buckets.is_regular(len(samples)):
            self._drop(IRREGULAR, len(samples))
            raise SkipSample()
        source, source_length = pad_sequences([s.source_ids for s in samples], self.source_tokenizer.pad_id)
        target, target_length = pad_sequences([s.target_ids for s in samples], self.target_tokenizer.pad_id)
        target_out = shifted_targets(target, target_length, self.eos_id, self.target_tokenizer.pad_id)
        aligned = [s.alignment is not None for s in samples]
        alignment = None
        if any(aligned):
            if not all(aligned):
                without = [s.__key__ for s, a in zip(samples, aligned, strict=True) if not a]
                raise ValueError(
                    f"samples {', '.join(without)} have no alignment, but others in their batch do"
                )
            matrices = pad_alignments([s.alignment for s in samples], target.shape[1], source.shape[1])
            alignment = torch.from_numpy(matrices)
        dropped, self._pending = dict(self._pending), Counter()
        return TranslationBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            source_ids=torch.from_numpy(source),
            source_length=torch.from_numpy(source_length),
            target_ids=torch.from_numpy(target),
            target_ids_out=torch.from_numpy(target_out),
            target_length=torch.from_numpy(target_length),
            alignment=alignment,
            bucket=self.batch_group_criterion(samples[0])[0],  # the key every pair of the batch shares
            num_padding=int(source.size + target.size - source_length.sum() - target_length.sum()),
            dropped=dropped,
        )
