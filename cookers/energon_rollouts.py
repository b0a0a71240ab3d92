"""energon glue for shared-prefix rollouts: a cooker for rollout groups, the `RolloutTaskEncoder`, and
the prefix-tree mask as torch flex-attention `mask_mod` / `BlockMask`.

A rollout group is one crude sample whose `json` (or msgpack: `mp`, `msg`, `msgpack`) part holds
`{"prompt": ..., "completions": [...]}`: the prompt as text or token ids, the completions as a list of
texts or of token-id lists. `shardprep write groups.jsonl OUT` writes such samples from a JSONL file as
it is. The steps map onto energon's hooks:

- cooker (`cook_rollout_group`): the part becomes a `RolloutGroup`.
- `encode_sample`: tokenize text (the prompt with BOS if the tokenizer adds one, each completion with
  EOS if it adds one) and fold the group (`cookers.rollouts.fold_shared_prefix_rollouts`).
- with `packing_buffer_size`: `select_samples_to_pack` plans sequences of at most `seq_length` tokens
  over the buffer's folded lengths by best-fit decreasing, a group never split;
  `pack_selected_samples` lays each sequence's groups end to end (`concatenate_folded`).
- `batch`: the batch's groups (or packs) joined into one row [1, T], with the prefix-tree structure on
  the batch; `RolloutBatch.block_mask()` is the flex-attention mask for it.

Without packing and with `batch_size=1`, a batch is what NeMo Automodel's `prefix_tree_collate_fn`
returns for one group (`prefix_tree_collate` here takes the same input).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import msgpack
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
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from cookers.energon_batching import BatchingHook
from cookers.packed_layout import IGNORE_INDEX
from cookers.rollout_mask import prefix_tree_mask, token_visibility
from cookers.rollouts import (
    FoldedRollouts,
    concatenate_folded,
    fold_shared_prefix_rollouts,
    plan_rollout_packs,
)
from cookers.tokenizer import TokenizerAdapter

#: Parts a rollout group is read from, in this order, and how their bytes decode.
JSON_PARTS = ("json", "jsn")
MSGPACK_PARTS = ("mp", "msg", "msgpack")
OVERLONG_GROUP_POLICIES = ("error", "drop")


@edataclass
class RolloutGroup(Sample):
    """A cooked rollout group: a prompt and its completions, as text or as token ids."""

    prompt: str | list[int]
    completions: list[str] | list[list[int]]


@edataclass
class FoldedGroup(Sample):
    """One folded group, or several packed into one sequence; `group_keys` names them in layout order."""

    folded: FoldedRollouts
    group_keys: list[str]


@edataclass
class RolloutBatch(Batch):
    """Folded groups in one row: tensors of shape [1, T] and the prefix-tree structure of the row.

    Tokens from `num_tokens` on are padding (labels `ignore_idx`, outside the structure).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    node_lengths: list[int]
    sample_paths: list[list[int]]
    group_offsets: list[int]
    group_keys: list[str]
    num_tokens: int
    num_padding: int
    layout: FoldedRollouts

    def prefix_tree(self) -> dict[str, object]:
        """The structure as the reference collate carries it (`batch["prefix_tree"]`)."""
        return {"node_lengths": self.node_lengths, "sample_paths": self.sample_paths}

    def dense_mask(self) -> torch.Tensor:
        """Boolean [T, T] attention mask (True = may attend): the reference, for short rows."""
        total = self.input_ids.shape[-1]
        return torch.from_numpy(prefix_tree_mask(self.node_lengths, self.sample_paths, total))

    def mask_mod(self, device: str | torch.device | None = None) -> Callable:
        """The flex-attention `mask_mod` of this row."""
        return prefix_tree_mask_mod(self.node_lengths, self.sample_paths, self.input_ids.shape[-1], device)

    def block_mask(self, block_size: int = 128, device: str | torch.device = "cpu") -> BlockMask:
        """The flex-attention `BlockMask` of this row (blocks of `block_size` tokens)."""
        return prefix_tree_block_mask(
            self.node_lengths, self.sample_paths, self.input_ids.shape[-1], block_size, device
        )

    def sample_of_tokens(self) -> torch.Tensor:
        """[1, T]: the sample (completion) each token belongs to, -1 for prompts and padding."""
        samples = self.layout.sample_of_tokens()
        padded = np.concatenate((samples, np.full(self.num_padding, -1, dtype=samples.dtype)))
        return torch.from_numpy(padded)[None]


def prefix_tree_mask_mod(
    node_lengths: Sequence[int],
    sample_paths: Sequence[Sequence[int]],
    total: int | None = None,
    device: str | torch.device | None = None,
) -> Callable:
    """A flex-attention `mask_mod(b, h, q_idx, kv_idx)` equal to `cookers.rollout_mask.prefix_tree_mask`."""
    nodes_array, visible_array = token_visibility(node_lengths, sample_paths, total)
    nodes = torch.from_numpy(nodes_array).to(device)
    visible = torch.from_numpy(visible_array).to(device)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        query_node, key_node = nodes[q_idx], nodes[kv_idx]
        return visible[query_node, key_node] & ((query_node != key_node) | (kv_idx <= q_idx))

    return mask_mod


def prefix_tree_block_mask(
    node_lengths: Sequence[int],
    sample_paths: Sequence[Sequence[int]],
    total: int | None = None,
    block_size: int = 128,
    device: str | torch.device = "cpu",
) -> BlockMask:
    """The prefix-tree mask as a flex-attention `BlockMask` over one row of `total` tokens."""
    length = int(sum(node_lengths)) if total is None else total
    mask_mod = prefix_tree_mask_mod(node_lengths, sample_paths, length, device)
    return create_block_mask(mask_mod, None, None, length, length, device=device, BLOCK_SIZE=block_size)


def prefix_tree_collate(batch: list[dict]) -> dict[str, object]:
    """Collate one rollout group (`{"prompt_ids": [...], "completions": [[...], ...]}`) as the reference
    does: `input_ids`, `labels`, `position_ids` of shape [1, T] and the structure under `prefix_tree`.

    >>> out = prefix_tree_collate([{"prompt_ids": [11, 12, 13], "completions": [[21, 22], [31, 32, 33]]}])
    >>> out["labels"].tolist(), out["prefix_tree"]
    ([[-100, -100, -100, 22, -100, 32, 33, -100]], {'node_lengths': [3, 2, 3], 'sample_paths': [[0, 1], [0, 2]]})
    """
    if len(batch) != 1:
        raise ValueError(
            f"prefix_tree_collate takes exactly one rollout group, got {len(batch)}; to put several groups"
            " in one sequence, pack them (RolloutTaskEncoder with packing_buffer_size)"
        )
    folded = fold_shared_prefix_rollouts(batch[0]["prompt_ids"], batch[0]["completions"])
    return {
        "input_ids": torch.from_numpy(folded.input_ids)[None],
        "labels": torch.from_numpy(folded.labels)[None],
        "position_ids": torch.from_numpy(folded.position_ids)[None],
        "prefix_tree": {"node_lengths": folded.node_lengths, "sample_paths": folded.sample_paths},
    }


def _record(sample: dict) -> dict:
    """The rollout record of a crude sample: its JSON or msgpack part, decoded by energon or as bytes."""
    key = sample["__key__"]
    for part in (*JSON_PARTS, *MSGPACK_PARTS):
        if part not in sample:
            continue
        value = sample[part]
        if isinstance(value, bytes | bytearray):
            value = json.loads(value) if part in JSON_PARTS else msgpack.unpackb(value, raw=False)
        elif isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, dict):
            raise ValueError(f"sample {key}: the {part} part holds a {type(value).__name__}, not an object")
        return value
    parts = sorted(k for k in sample if not k.startswith("__"))
    raise ValueError(
        f"sample {key}: no json or msgpack part holding a rollout group (parts: {', '.join(parts) or 'none'})"
    )


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list | tuple) and all(
        isinstance(token, int) and not isinstance(token, bool) for token in value
    )


@stateless
def cook_rollout_group(sample: dict) -> RolloutGroup:
    """Cook a crude sample into a `RolloutGroup`: `prompt` (or `prompt_ids`) and `completions`, each as
    text or token ids."""
    key = sample["__key__"]
    record = _record(sample)
    prompt = record.get("prompt", record.get("prompt_ids"))
    completions = record.get("completions")
    if prompt is None or completions is None:
        raise ValueError(
            f"sample {key}: a rollout group needs 'prompt' and 'completions' (has {sorted(record)})"
        )
    if not (isinstance(prompt, str) or _is_token_ids(prompt)):
        raise ValueError(f"sample {key}: 'prompt' must be text or a list of token ids")
    if not isinstance(completions, list):
        raise ValueError(f"sample {key}: 'completions' must be a list, not a {type(completions).__name__}")
    for number, completion in enumerate(completions):
        if not (isinstance(completion, str) or _is_token_ids(completion)):
            raise ValueError(f"sample {key}: completion {number} must be text or a list of token ids")
    return RolloutGroup(**basic_sample_keys(sample), prompt=prompt, completions=completions)


class RolloutTaskEncoder(BatchingHook, TaskEncoder[RolloutGroup, FoldedGroup, RolloutBatch, RolloutBatch]):
    """Fold rollout groups, optionally pack several into sequences of at most `seq_length` tokens, and
    batch them into one row with the prefix-tree structure.

    `tokenizer` is needed only for groups given as text. `seq_length` is needed for packing
    (`get_train_dataset(..., packing_buffer_size=N)`; `batch_size` then counts packs); without packing it
    bounds a group's folded length, and `overlong` says what happens to a longer group: `error` (a
    `ValueError` naming it) or `drop`. `pad_to_multiple_of` pads each batch row (flex attention on a
    GPU likes multiples of 128).
    """

    cookers = (Cooker(cook_rollout_group),)

    def __init__(
        self,
        tokenizer: TokenizerAdapter | None = None,
        seq_length: int | None = None,
        overlong: str = "error",
        pad_to_multiple_of: int | None = None,
        ignore_idx: int = IGNORE_INDEX,
    ) -> None:
        if overlong not in OVERLONG_GROUP_POLICIES:
            raise ValueError(
                f"unknown over-long group policy {overlong!r}; choose one of {', '.join(OVERLONG_GROUP_POLICIES)}"
            )
        if seq_length is not None and seq_length < 1:
            raise ValueError(f"seq_length must be at least 1, got {seq_length}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}")
        self.tokenizer = tokenizer
        self.seq_length = seq_length
        self.overlong = overlong
        self.pad_to_multiple_of = pad_to_multiple_of
        self.ignore_idx = ignore_idx
        self.pad_id = tokenizer.pad_id if tokenizer is not None else 0
        if tokenizer is not None:
            # The prompt opens the sequence (BOS), each completion closes one (EOS).
            self._prompt_tokenizer = dataclasses.replace(tokenizer, add_eos=False)
            self._completion_tokenizer = dataclasses.replace(tokenizer, add_bos=False)

    def _token_ids(self, sample: RolloutGroup) -> tuple[object, list]:
        texts = [sample.prompt, *sample.completions]
        if not any(isinstance(text, str) for text in texts):
            return sample.prompt, list(sample.completions)
        if self.tokenizer is None:
            raise ValueError(f"sample {sample.__key__} holds text; give the RolloutTaskEncoder a tokenizer")
        prompt = sample.prompt
        if isinstance(prompt, str):
            prompt = self._prompt_tokenizer.encode(prompt)
        is_text = [isinstance(c, str) for c in sample.completions]
        encoded = iter(
            self._completion_tokenizer.encode_batch([c for c in sample.completions if isinstance(c, str)])
        )
        completions = [
            next(encoded) if text else c for c, text in zip(sample.completions, is_text, strict=True)
        ]
        return prompt, completions

    @stateless
    def encode_sample(self, sample: RolloutGroup) -> FoldedGroup:
        """Tokenize (if text) and fold one group."""
        prompt, completions = self._token_ids(sample)
        try:
            folded = fold_shared_prefix_rollouts(prompt, completions, self.ignore_idx)
        except ValueError as error:
            raise ValueError(f"sample {sample.__key__}: {error}") from None
        if self.seq_length is not None and folded.num_tokens > self.seq_length:
            if self.overlong == "drop":
                raise SkipSample()
            raise ValueError(
                f"sample {sample.__key__} folds to {folded.num_tokens} tokens, more than the sequence length"
                f" {self.seq_length}; a group is never split: raise seq_length, or pass overlong='drop'"
            )
        return FoldedGroup.derive_from(sample, folded=folded, group_keys=[sample.__key__])

    def _packing_seq_length(self) -> int:
        if self.seq_length is None:
            raise ValueError("packing rollout groups needs seq_length; give it to the RolloutTaskEncoder")
        return self.seq_length

    def before_batching(
        self,
        dataset: SavableDataset,
        *,
        batch_size: int | None,
        packing_buffer_size: int | None,
        worker_config: WorkerConfig,
    ) -> tuple[SavableDataset, int | None]:
        """Refuse a packing buffer without `seq_length` when the dataset is built: in the loader, the
        refusal would be logged per buffer and every group of the buffer skipped."""
        if packing_buffer_size is not None:
            self._packing_seq_length()
        return dataset, packing_buffer_size

    @stateless
    def select_samples_to_pack(self, samples: list[FoldedGroup]) -> list[list[FoldedGroup]]:
        """Plan the buffer into sequences of at most `seq_length` tokens; every group lands in one."""
        bins = plan_rollout_packs(
            [s.folded.num_tokens for s in samples],
            self._packing_seq_length(),
            [f"sample {s.__key__}" for s in samples],
        )
        return [[samples[i] for i in members] for members in bins]

    @stateless
    def pack_selected_samples(self, samples: list[FoldedGroup]) -> FoldedGroup:
        """Lay one sequence's groups end to end."""
        keys = [key for s in samples for key in s.group_keys]
        folded = concatenate_folded([s.folded for s in samples])
        return FoldedGroup.derive_from(samples[0], __key__="+".join(keys), folded=folded, group_keys=keys)

    @stateless
    def batch(self, samples: list[FoldedGroup]) -> RolloutBatch:
        """Join the batch's groups (or packs) into one row of torch tensors, padded as configured."""
        folded = concatenate_folded([s.folded for s in samples])
        total = folded.num_tokens
        padding = -total % self.pad_to_multiple_of if self.pad_to_multiple_of else 0

        def row(values: np.ndarray, tail: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.concatenate((values, tail.astype(values.dtype))))[None]

        return RolloutBatch(
            __key__=[s.__key__ for s in samples],
            __restore_key__=(),
            input_ids=row(folded.input_ids, np.full(padding, self.pad_id)),
            labels=row(folded.labels, np.full(padding, self.ignore_idx)),
            position_ids=row(folded.position_ids, np.arange(padding)),
            node_lengths=folded.node_lengths,
            sample_paths=folded.sample_paths,
            group_offsets=folded.group_offsets,
            group_keys=[key for s in samples for key in s.group_keys],
            num_tokens=total,
            num_padding=padding,
            layout=folded,
        )
