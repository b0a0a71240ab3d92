"""energon glue for token packing: a cooker for text/JSON crude samples and the `PackingTaskEncoder`.

The steps map onto energon's hooks one to one:

- cooker (`cook_text_document`): a crude sample's `txt` part, or its `json` part's `text` field (or its
  `prompt` + `completion` fields for SFT) becomes a `TextDocument`.
- `encode_sample`: tokenize; apply the over-long policy here, so that energon's packing buffer only holds
  pieces that fit (`chunk` yields several pieces of one document; it is a generator for that reason); the
  policy itself is `cookers.packing.fit_pieces`, applied to one document. A document of no tokens yields
  nothing.
- `select_samples_to_pack` (stateless): plan bins over the buffer's lengths with `cookers.packing`; every
  sample of the buffer lands in exactly one group (energon drops what this leaves out).
- `pack_selected_samples` (stateless): lay a group out with `cookers.packed_layout`.
- `concat` takes no part in energon's packing buffer: `before_batching` puts a `ConcatPacksDataset` in its
  place, which cuts each window of `packing_buffer_size` documents, as one stream, into packs of
  `seq_length` tokens. energon's buffer forgets a group once it starts packing it, so a loader saved part-way through
  a window's packs would lose the rest; `ConcatPacksDataset` saves its window and the packs handed on.
- `batch`: join the packs of a batch into one padding-free row of torch tensors, the layout of Hugging
  Face's flash-attention path (`cu_seq_lens_q/k`, `max_length_q/k`, `position_ids`); Megatron's
  `PackedSeqParams` come from `PackedBatch.megatron_packed_seq_params()`.

The algorithms live in pure modules; this module only adapts them to energon's types.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from itertools import islice
from typing import Any

import numpy as np
import torch
from megatron.energon import Batch, Cooker, Sample, TaskEncoder, edataclass, stateless
from megatron.energon.flavors.base_dataset import SavableDataset, set_sample_restore_key
from megatron.energon.worker import WorkerConfig
from megatron.energon.wrappers.base import BaseWrapperDataset, SampleIndex
from megatron.energon.wrappers.buffer import SavableSampleBuffer

from cookers.energon_batching import BatchingHook
from cookers.packed_layout import LABEL_CONVENTIONS, PackedSequence, flatten_packs, layout_pack
from cookers.packing import ALGORITHMS, fit_pieces, overlong_policy, plan_packs
from cookers.tokenizer import TokenizerAdapter


@edataclass
class TextDocument(Sample):
    """A cooked text sample: plain text, or a prompt and a completion (SFT)."""

    text: str | None = None
    prompt: str | None = None
    completion: str | None = None


@edataclass
class TokenizedDocument(Sample):
    """A document (or a piece of one, for `chunk`) as tokens; `loss_mask` None supervises all tokens."""

    input_ids: np.ndarray
    loss_mask: np.ndarray | None = None


@edataclass
class PackedSample(Sample):
    """One pack: the layout arrays of `cookers.packed_layout.PackedSequence` plus the keys of its documents."""

    pack: PackedSequence
    document_keys: list[str]


@edataclass
class PackedBatch(Batch):
    """Packs joined into one row: tensors of shape [1, T], boundaries in `cu_seq_lens_q/k` (int32)."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    seq_ids: torch.Tensor
    cu_seq_lens_q: torch.Tensor
    cu_seq_lens_k: torch.Tensor
    max_length_q: int
    max_length_k: int
    num_tokens: int
    num_packs: int
    document_keys: list[list[str]]
    layout: PackedSequence

    def flash_attention_kwargs(self) -> dict[str, object]:
        """Keyword arguments for a Hugging Face model's forward on the flash-attention varlen path."""
        return {
            "input_ids": self.input_ids,
            "labels": self.labels,
            "position_ids": self.position_ids,
            "cu_seq_lens_q": self.cu_seq_lens_q,
            "cu_seq_lens_k": self.cu_seq_lens_k,
            "max_length_q": self.max_length_q,
            "max_length_k": self.max_length_k,
        }

    def megatron_packed_seq_params(self) -> dict[str, object]:
        """Keyword arguments for Megatron-core's `PackedSeqParams` (THD), boundaries as int32 tensors."""
        params = self.layout.megatron_packed_seq_params()
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in params.items()}


def _part_text(value: object) -> object:
    """A part as energon handed it over: decoded already (str/dict) or raw bytes."""
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else value


def _shown(value: object) -> str:
    """A JSON value as the sample holds it, cut short."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else text[:37] + "..."


@stateless
def cook_text_document(sample: dict) -> TextDocument:
    """Cook a crude sample: `txt` part, or `json` part with `text` or `prompt` + `completion` fields."""
    key = sample["__key__"]
    base = {
        k: sample[k] for k in ("__key__", "__restore_key__", "__subflavors__", "__sources__") if k in sample
    }
    if "json" in sample:
        record = _part_text(sample["json"])
        if isinstance(record, str):
            try:
                record = json.loads(record)
            except json.JSONDecodeError as error:
                raise ValueError(f"sample {key}: json part is not JSON ({error})") from None
        if not isinstance(record, dict):
            raise ValueError(f"sample {key}: json part holds {_shown(record)}, not an object")
        fields = ("prompt", "completion") if "prompt" in record and "completion" in record else ("text",)
        if fields == ("text",) and "text" not in record:
            raise ValueError(f"sample {key}: json part has neither 'text' nor 'prompt' + 'completion'")
        for name in fields:
            if not isinstance(record[name], str):
                raise ValueError(f"sample {key}: json field {name!r} is {_shown(record[name])}, not a string")
        return TextDocument(**base, **{name: record[name] for name in fields})
    if "txt" in sample:
        return TextDocument(**base, text=_part_text(sample["txt"]))
    parts = sorted(k for k in sample if not k.startswith("__"))
    raise ValueError(f"sample {key}: no txt or json part to cook (parts: {', '.join(parts)})")


#: A pack's pieces in order: (document, first token, end token).
Pieces = list[tuple[TokenizedDocument, int, int]]


class ConcatPacksDataset(BaseWrapperDataset[TokenizedDocument, PackedSample]):
    """`concat` packing: each window of `window` documents, in the order read, is one token stream cut every
    `seq_length` tokens (a window's last pack may be shorter); `lay_out` makes a pack of its pieces.

    The open window and the count of its packs handed on are saved with the loader's state, the count raised
    before a pack is handed on, so a restored loader goes on with the window's next pack.
    """

    _savable_fields = ("_window", "_packs_done", "_pack_index")

    def __init__(
        self,
        dataset: SavableDataset,
        seq_length: int,
        window: int,
        lay_out: Callable[[Pieces], PackedSample],
        *,
        worker_config: WorkerConfig,
    ) -> None:
        super().__init__(dataset, worker_config=worker_config)
        if window < 1:
            raise ValueError(f"packing_buffer_size must be at least 1, got {window}")
        self.seq_length = seq_length
        self.window = window
        self.lay_out = lay_out
        self.reset_state_own()

    def reset_state_own(self) -> None:
        self._window = SavableSampleBuffer(self.dataset, worker_config=self.worker_config)
        self._packs_done = 0
        self._pack_index = SampleIndex(self.worker_config, src=self)

    def len_worker(self, worker_idx: int | None = None) -> int:
        return self.dataset.len_worker(worker_idx)  # an estimate: packs are not documents

    def __iter__(self) -> Iterator[PackedSample]:
        self._window.worker_start()
        source = iter(self.dataset)
        while True:
            if not self._window.len_worker():  # a restored window is finished before reading on
                for sample in islice(source, self.window):
                    self._window.append(sample)
                if not self._window.len_worker():
                    return
            documents = self._window.buffer
            plan = plan_packs([len(d.input_ids) for d in documents], self.seq_length, "concat")
            while self._packs_done < plan.num_bins:
                pieces = [(documents[d], a, b) for d, a, b in plan.bin_pieces(self._packs_done)]
                self._packs_done += 1
                yield self._pack(pieces)
            self._window.clear()
            self._packs_done = 0

    def _pack(self, pieces: Pieces, index: int | None = None) -> PackedSample:
        """The pack of these pieces (one per document); its restore key holds its documents' restore keys
        and where its first piece starts and its last ends."""
        with self._pack_index.ctx(index) as index:
            pack = self.lay_out(pieces)
        keys = [d.__restore_key__ for d, _, _ in pieces]
        return set_sample_restore_key(pack, index, pieces[0][1], pieces[-1][2], *keys, src=self)

    def restore_sample(self, restore_key: tuple) -> PackedSample:
        kind, index, start, stop, *keys = restore_key
        assert kind == type(self).__name__
        documents = [self.dataset.restore_sample(key) for key in keys]
        last = len(documents) - 1
        pieces = [
            (doc, start if d == 0 else 0, stop if d == last else len(doc.input_ids))
            for d, doc in enumerate(documents)
        ]
        return self._pack(pieces, index)

    def config(self) -> dict[str, Any]:
        return {
            "type": type(self).__qualname__,
            "seq_length": self.seq_length,
            "window": self.window,
            "dataset": self.dataset.config(),
            "worker_config": self.worker_config.config(),
        }

    def __str__(self) -> str:
        return (
            f"ConcatPacksDataset(seq_length={self.seq_length}, window={self.window}, dataset={self.dataset})"
        )


class PackingTaskEncoder(
    BatchingHook, TaskEncoder[TextDocument, TokenizedDocument, PackedBatch, PackedBatch]
):
    """Tokenize text samples and pack them into sequences of at most `seq_length` tokens.

    Use with `get_train_dataset(..., packing_buffer_size=N, task_encoder=PackingTaskEncoder(...))`;
    `batch_size` then counts packs.
    """

    cookers = (Cooker(cook_text_document),)

    def __init__(
        self,
        tokenizer: TokenizerAdapter,
        seq_length: int,
        algorithm: str = "bfd",
        labels: str = "unshifted",
        overlong: str = "chunk",
        pad_to_multiple_of: int | None = None,
    ) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(
                f"unknown packing algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}"
            )
        if labels not in LABEL_CONVENTIONS:
            raise ValueError(
                f"unknown label convention {labels!r}; choose one of {', '.join(LABEL_CONVENTIONS)}"
            )
        if seq_length < 1:
            raise ValueError(f"seq_length must be at least 1, got {seq_length}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
        if pad_to_multiple_of is not None and seq_length % pad_to_multiple_of:
            raise ValueError(
                f"seq_length {seq_length} is not a multiple of pad_to_multiple_of {pad_to_multiple_of}"
            )
        self.tokenizer = tokenizer
        self.seq_length = seq_length
        self.algorithm = algorithm
        self.labels = labels
        self.overlong = overlong_policy(overlong)
        self.pad_to_multiple_of = pad_to_multiple_of

    @stateless
    def encode_sample(self, sample: TextDocument) -> Generator[TokenizedDocument, None, None]:
        """Tokenize one document and yield it, or its pieces when it is over-long and the policy cuts it.
        A document of no tokens (empty text, with a tokenizer that adds no marks) yields nothing: packed,
        it would be a sequence of length 0, and a buffer of only such documents a batch of no tokens."""
        if sample.text is not None:
            ids, mask = self.tokenizer.encode(sample.text), None
        else:
            ids, mask = self.tokenizer.encode_prompt_completion(sample.prompt, sample.completion)
        if not len(ids):
            return
        if len(ids) <= self.seq_length or self.algorithm == "concat":  # concat cuts the stream itself
            yield TokenizedDocument.derive_from(sample, input_ids=ids, loss_mask=mask)
            return
        _, starts, stops = fit_pieces(
            np.array([len(ids)]), self.seq_length, self.overlong, [f"sample {sample.__key__}"]
        )
        for piece, (start, stop) in enumerate(zip(starts.tolist(), stops.tolist(), strict=True)):
            yield TokenizedDocument.derive_from(
                sample,
                __key__=sample.__key__ if self.overlong == "truncate" else f"{sample.__key__}#{piece}",
                input_ids=ids[start:stop],
                loss_mask=None if mask is None else mask[start:stop],
            )

    def before_batching(
        self,
        dataset: SavableDataset,
        *,
        batch_size: int | None,
        packing_buffer_size: int | None,
        worker_config: WorkerConfig,
    ) -> tuple[SavableDataset, int | None]:
        """`concat`: a `ConcatPacksDataset` (windows of `packing_buffer_size` documents) takes the place of
        energon's packing buffer, which cannot save a window part-way through its packs. Without a packing
        buffer there would be nothing to pack: refused."""
        if packing_buffer_size is None:
            raise ValueError(
                "PackingTaskEncoder packs the documents of energon's packing buffer: pass"
                " packing_buffer_size=N (documents) to get_train_dataset / get_val_dataset"
            )
        if self.algorithm == "concat":
            dataset = ConcatPacksDataset(
                dataset, self.seq_length, packing_buffer_size, self.lay_out, worker_config=worker_config
            )
            packing_buffer_size = None
        return dataset, packing_buffer_size

    @stateless
    def select_samples_to_pack(self, samples: list[TokenizedDocument]) -> list[list[TokenizedDocument]]:
        """Group the whole buffer into bins; every sample goes into exactly one group."""
        plan = plan_packs(
            [len(s.input_ids) for s in samples],
            self.seq_length,
            self.algorithm,
            names=[s.__key__ for s in samples],
        )
        return [[samples[d] for d in docs] for docs in plan.bins()]

    @stateless
    def pack_selected_samples(self, samples: list[TokenizedDocument]) -> PackedSample:
        """Lay out one group as a pack."""
        return self.lay_out([(s, 0, len(s.input_ids)) for s in samples])

    def lay_out(self, pieces: Pieces) -> PackedSample:
        """The pack of these pieces of documents, keyed by its documents' keys."""
        pack = layout_pack(
            [d.input_ids[a:b] for d, a, b in pieces],
            [None if d.loss_mask is None else d.loss_mask[a:b] for d, a, b in pieces],
            labels=self.labels,
            pad_to_multiple_of=self.pad_to_multiple_of,
            pad_id=self.tokenizer.pad_id,
        )
        keys = [d.__key__ for d, _, _ in pieces]
        return PackedSample.derive_from(pieces[0][0], __key__="+".join(keys), pack=pack, document_keys=keys)

    @stateless
    def batch(self, samples: list[PackedSample]) -> PackedBatch:
        """Join packs into one row of torch tensors (padding-free batch)."""
        flat = flatten_packs([s.pack for s in samples])
        cu = torch.from_numpy(flat.cu_seqlens)
        return PackedBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            input_ids=torch.from_numpy(flat.input_ids)[None],
            labels=torch.from_numpy(flat.labels)[None],
            position_ids=torch.from_numpy(flat.position_ids)[None],
            seq_ids=torch.from_numpy(flat.seq_ids)[None],
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=flat.max_seqlen,
            max_length_k=flat.max_seqlen,
            num_tokens=flat.num_tokens,
            num_packs=len(samples),
            document_keys=[s.document_keys for s in samples],
            layout=flat,
        )
