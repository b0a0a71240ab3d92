"""The rollout task encoder inside energon's real loader, on datasets `shardprep write` made from raw
rollout groups: a JSONL of texts (the command line) and msgpack token ids (the Python API)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from megatron.energon import get_loader, get_savable_loader

from cookers.energon_rollouts import RolloutTaskEncoder, cook_rollout_group, prefix_tree_collate
from cookers.rollouts import fold_shared_prefix_rollouts
from cookers.tokenizer import load_tokenizer
from prep.write import write_dataset
from tests.support.loader import batches_around_a_restore, train_dataset
from tests.support.prepare import run_shardprep
from tools.text_corpus import documents
from tools.train_tokenizer import train_tokenizer

SEQ_LENGTH = 512
pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")


def rollout_records(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    texts = documents(6 * count, seed=seed, median_words=12, sigma=0.6)
    records = []
    for _ in range(count):
        prompt = next(texts)
        completions = [next(texts) for _ in range(rng.randint(1, 4))]
        records.append({"prompt": prompt, "completions": completions})
    return records


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer(documents(300, seed=1), vocab_size=500).save(str(path))
    return load_tokenizer(path, add_bos=True, add_eos=True)


@pytest.fixture(scope="module")
def text_groups(tmp_path_factory):
    """A JSONL of text rollout groups, written to shards by `shardprep write` as it is."""
    folder = tmp_path_factory.mktemp("rollouts")
    records = rollout_records(60, seed=3)
    jsonl = folder / "groups.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    run_shardprep(
        "write", str(jsonl), str(folder / "shards"), "--maxcount", "20", "--no-progress", check=True
    )
    return folder / "shards", records


def load(folder, encoder, batch_size, buffer=None, workers=0):
    return train_dataset(folder, encoder, batch_size=batch_size, buffer=buffer, workers=workers)


def tokenized(tokenizer, record):
    prompt = tokenizer.encode(record["prompt"]).tolist()[:-1]  # BOS + prompt, no EOS
    completions = [c.tolist()[1:] for c in tokenizer.encode_batch(record["completions"])]  # EOS, no BOS
    return prompt, completions


def test_one_group_per_batch_is_the_reference_collate(tokenizer, text_groups):
    folder, records = text_groups
    keys = []
    for batch in get_loader(load(folder, RolloutTaskEncoder(tokenizer), batch_size=1)):
        (key,) = batch.group_keys
        prompt, completions = tokenized(tokenizer, records[int(key)])
        assert prompt[0] == tokenizer.bos_id and all(c[-1] == tokenizer.eos_id for c in completions)
        expected = prefix_tree_collate([{"prompt_ids": prompt, "completions": completions}])
        assert batch.input_ids.equal(expected["input_ids"])
        assert batch.labels.equal(expected["labels"])
        assert batch.position_ids.equal(expected["position_ids"])
        assert batch.prefix_tree() == expected["prefix_tree"]
        keys.append(key)
    assert sorted(keys) == [f"{i:09d}" for i in range(len(records))]


def test_packed_batches_hold_every_group_once_in_sequences_of_at_most_l(tokenizer, text_groups):
    folder, records = text_groups
    encoder = RolloutTaskEncoder(tokenizer, seq_length=SEQ_LENGTH, pad_to_multiple_of=64)
    keys, tokens, packs = [], 0, 0
    expected = {}
    for index, record in enumerate(records):
        expected[f"{index:09d}"] = fold_shared_prefix_rollouts(*tokenized(tokenizer, record))
    for batch in get_loader(load(folder, encoder, batch_size=2, buffer=16)):
        assert batch.input_ids.shape[1] % 64 == 0
        assert batch.input_ids.shape[1] == batch.num_tokens + batch.num_padding
        assert sum(batch.node_lengths) == batch.num_tokens == batch.group_offsets[-1]
        for key, start, stop in zip(
            batch.group_keys, batch.group_offsets[:-1], batch.group_offsets[1:], strict=True
        ):
            assert batch.input_ids[0, start:stop].tolist() == expected[key].input_ids.tolist()
            assert batch.labels[0, start:stop].tolist() == expected[key].labels.tolist()
        for pack_keys in batch.__key__:
            pack_tokens = sum(expected[key].num_tokens for key in pack_keys.split("+"))
            assert pack_tokens <= SEQ_LENGTH
        keys.extend(batch.group_keys)
        tokens += batch.num_tokens
        packs += len(batch.__key__)
    assert sorted(keys) == sorted(expected)
    assert tokens == sum(f.num_tokens for f in expected.values())
    assert packs < len(records) / 2, "packing should put several groups in most sequences"


def test_restored_loader_state_gives_the_same_next_batches(tokenizer, text_groups):
    folder, _ = text_groups
    encoder = RolloutTaskEncoder(tokenizer, seq_length=SEQ_LENGTH)

    def fresh():
        return get_savable_loader(load(folder, encoder, batch_size=1, buffer=8, workers=1))

    expected, got = batches_around_a_restore(fresh)
    assert len(expected) >= 4 and [b.group_keys for b in got] == [b.group_keys for b in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.input_ids.equal(b.input_ids) and a.labels.equal(b.labels)
        assert a.position_ids.equal(b.position_ids)
        assert (a.node_lengths, a.sample_paths) == (b.node_lengths, b.sample_paths)


def test_token_id_groups_in_msgpack_parts_need_no_tokenizer(tmp_path):
    rng = random.Random(9)
    groups = [
        {
            "prompt": [rng.randrange(1, 99) for _ in range(rng.randint(0, 6))],
            "completions": [
                [rng.randrange(1, 99) for _ in range(rng.randint(1, 5))] for _ in range(rng.randint(1, 3))
            ],
        }
        for _ in range(12)
    ]
    write_dataset([{"__key__": f"g{i:02d}", "msgpack": g} for i, g in enumerate(groups)], tmp_path / "ids")
    batches = list(get_loader(load(tmp_path / "ids", RolloutTaskEncoder(), batch_size=3)))
    assert [key for b in batches for key in b.group_keys] == [f"g{i:02d}" for i in range(12)]
    first = fold_shared_prefix_rollouts(groups[0]["prompt"], groups[0]["completions"])
    assert batches[0].input_ids[0, : first.num_tokens].tolist() == first.input_ids.tolist()
    mask = batches[0].dense_mask()
    assert mask.shape == (batches[0].num_tokens,) * 2 and mask.dtype == torch.bool


def test_packing_without_a_sequence_length_is_refused_when_the_dataset_is_built(tmp_path):
    # In the loader the refusal was logged per buffer, each buffer's groups skipped: no batch at all.
    write_dataset([{"__key__": "g0", "json": {"prompt": [1], "completions": [[2]]}}], tmp_path / "ids")
    with pytest.raises(ValueError, match="packing rollout groups needs seq_length"):
        load(tmp_path / "ids", RolloutTaskEncoder(), batch_size=1, buffer=4)


def test_bad_groups_are_named_by_their_sample(tokenizer):
    with pytest.raises(ValueError, match="sample s7: a rollout group needs 'prompt' and 'completions'"):
        cook_rollout_group({"__key__": "s7", "__restore_key__": (), "json": {"prompt": "hi"}})
    with pytest.raises(ValueError, match="sample s8: completion 1 must be text or a list of token ids"):
        cook_rollout_group(
            {"__key__": "s8", "__restore_key__": (), "json": b'{"prompt": "hi", "completions": ["a", 3]}'}
        )
    with pytest.raises(ValueError, match=r"sample s9: no json or msgpack part .*\(parts: txt\)"):
        cook_rollout_group({"__key__": "s9", "__restore_key__": (), "txt": "hello"})
    empty = cook_rollout_group(
        {"__key__": "s10", "__restore_key__": (), "json": {"prompt": [1], "completions": [[2], []]}}
    )
    with pytest.raises(ValueError, match="sample s10: completion 1 of the 2 in the rollout group is empty"):
        RolloutTaskEncoder().encode_sample(empty)
    group = cook_rollout_group(
        {"__key__": "s10", "__restore_key__": (), "json": {"prompt": "a b", "completions": ["c", "d"]}}
    )
    with pytest.raises(ValueError, match="sample s10 holds text; give the RolloutTaskEncoder a tokenizer"):
        RolloutTaskEncoder().encode_sample(group)
    long = cook_rollout_group(
        {"__key__": "s11", "__restore_key__": (), "json": {"prompt": [1] * 10, "completions": [[2] * 10]}}
    )
    with pytest.raises(ValueError, match="sample s11 folds to 20 tokens, more than the sequence length 16"):
        RolloutTaskEncoder(seq_length=16).encode_sample(long)


def test_prefix_tree_collate_takes_one_group_only():
    with pytest.raises(ValueError, match="takes exactly one rollout group, got 2"):
        prefix_tree_collate([{"prompt_ids": [1], "completions": [[2]]}] * 2)
