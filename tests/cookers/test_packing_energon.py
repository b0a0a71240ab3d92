"""The packing task encoder inside energon's real loader, on a real prepared dataset of text shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import webdataset as wds
from megatron.energon import get_loader, get_savable_loader

from cookers.energon_packing import PackingTaskEncoder
from cookers.packed_layout import IGNORE_INDEX
from cookers.tokenizer import load_tokenizer
from tests.support.loader import batches_around_a_restore, train_dataset
from tests.support.prepare import run_shardprep
from tools.text_corpus import documents, prompt_completion_records
from tools.train_tokenizer import train_tokenizer

SEQ_LENGTH = 128
# energon's loaders always ask for pinned memory; on a CPU-only machine torch warns that it cannot pin.
pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")


def write_shards(folder: Path, records: list[dict], per_shard: int) -> list[str]:
    folder.mkdir(parents=True)
    keys = []
    for shard, lo in enumerate(range(0, len(records), per_shard)):
        with wds.TarWriter(str(folder / f"part-{shard:03d}.tar")) as writer:
            for index in range(lo, min(lo + per_shard, len(records))):
                key = f"doc{index:05d}"
                writer.write({"__key__": key, "json": json.dumps(records[index]).encode()})
                keys.append(key)
    return keys


def prepare(folder: Path) -> None:
    run_shardprep(
        "prepare",
        str(folder),
        "--non-interactive",
        "--split-ratio",
        "1,0,0",
        "--crude",
        "--no-progress",
        check=True,
    )


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    train_tokenizer(documents(400, seed=1), vocab_size=600).save(str(path))
    return load_tokenizer(path, add_bos=True, add_eos=True)


@pytest.fixture(scope="module")
def text_dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text") / "shards"
    # Some documents are longer than SEQ_LENGTH tokens, so `chunk` has work to do.
    records = [{"text": text} for text in documents(120, seed=2, median_words=25, sigma=1.0)]
    keys = write_shards(folder, records, per_shard=40)
    prepare(folder)
    return folder, keys, records


def load(folder, encoder, buffer, batch_size=2, workers=0):
    return train_dataset(folder, encoder, batch_size=batch_size, buffer=buffer, workers=workers)


@pytest.mark.parametrize("algorithm", ["bfd", "ffd", "next_fit", "concat"])
def test_every_document_of_the_dataset_is_packed_exactly_once(tokenizer, text_dataset, algorithm):
    folder, keys, records = text_dataset
    encoder = PackingTaskEncoder(tokenizer, SEQ_LENGTH, algorithm=algorithm, overlong="chunk")
    packed_keys, packed_tokens = [], 0
    for batch in get_loader(load(folder, encoder, buffer=32)):
        assert batch.input_ids.shape == batch.labels.shape == batch.position_ids.shape
        assert (
            batch.cu_seq_lens_q.dtype == torch_int32()
            and int(batch.cu_seq_lens_q[-1]) == batch.input_ids.shape[1]
        )
        lengths = batch.cu_seq_lens_q.diff()
        assert int(lengths.max()) == batch.max_length_q <= SEQ_LENGTH
        assert (batch.position_ids[0, batch.cu_seq_lens_q[:-1].long()] == 0).all()
        for pack in batch.document_keys:
            packed_keys.extend(pack)
        packed_tokens += batch.num_tokens
        assert batch.num_tokens <= batch.num_packs * SEQ_LENGTH
    expected_tokens = sum(len(t) for t in tokenizer.encode_batch([r["text"] for r in records]))
    assert packed_tokens == expected_tokens
    documents_seen = sorted({key.split("#")[0] for key in packed_keys})
    assert documents_seen == sorted(keys)
    if algorithm != "concat":
        assert len(packed_keys) == len(set(packed_keys)), "a document or piece was packed twice"
        assert any("#" in key for key in packed_keys), "the data set should have over-long documents"


def torch_int32():
    import torch

    return torch.int32


def test_prompt_tokens_are_masked_in_packed_sft_batches(tokenizer, tmp_path):
    folder = tmp_path / "sft"
    records = list(prompt_completion_records(30, seed=4))
    write_shards(folder, records, per_shard=30)
    prepare(folder)
    encoder = PackingTaskEncoder(tokenizer, 512, algorithm="bfd", labels="shifted", overlong="truncate")
    supervised = 0
    for batch in get_loader(load(folder, encoder, buffer=30, batch_size=1)):
        supervised += int((batch.labels != IGNORE_INDEX).sum())
    expected = 0
    for record in records:
        ids, mask = tokenizer.encode_prompt_completion(record["prompt"], record["completion"])
        expected += int(mask[:512][1:].sum())  # shifted: every supervised token but the first is a target
    assert supervised == expected


@pytest.mark.parametrize("algorithm", ["bfd", "concat"])
def test_restored_loader_state_gives_the_same_next_batches(tokenizer, text_dataset, algorithm):
    """`concat` makes many packs of one window of documents: the state is saved part-way through them."""
    folder, _, _ = text_dataset
    encoder = PackingTaskEncoder(
        tokenizer, SEQ_LENGTH, algorithm=algorithm, overlong="chunk", pad_to_multiple_of=16
    )

    def fresh():
        return get_savable_loader(load(folder, encoder, buffer=20, batch_size=2, workers=1))

    expected, got = batches_around_a_restore(fresh)
    assert len(expected) >= 4 and [b.document_keys for b in got] == [b.document_keys for b in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.input_ids.equal(b.input_ids) and a.labels.equal(b.labels)
        assert a.cu_seq_lens_q.equal(b.cu_seq_lens_q)


def test_a_concat_batch_is_restored_from_its_restore_key(tokenizer, text_dataset):
    folder, _, _ = text_dataset
    encoder = PackingTaskEncoder(tokenizer, SEQ_LENGTH, algorithm="concat")
    loader = get_savable_loader(load(folder, encoder, buffer=20, batch_size=2, workers=1))
    batches = list(loader)
    for batch in batches[3:5] + batches[-1:]:
        restored = loader.restore_sample(batch.__restore_key__)
        assert restored.document_keys == batch.document_keys
        assert restored.input_ids.equal(batch.input_ids) and restored.labels.equal(batch.labels)


def test_an_overlong_document_with_the_error_policy_is_named(tokenizer, text_dataset):
    from cookers.energon_packing import TextDocument
    from cookers.packing import OverlongDocumentError

    encoder = PackingTaskEncoder(tokenizer, 8, overlong="error")
    sample = TextDocument(__key__="shard-3/doc00042", __restore_key__=(), text="word " * 40)
    with pytest.raises(
        OverlongDocumentError, match=r"shard-3/doc00042 has \d+ tokens, more than the sequence length 8"
    ):
        list(encoder.encode_sample(sample))


@pytest.mark.parametrize("algorithm", ["bfd", "concat"])
def test_a_loader_without_a_packing_buffer_is_refused(tokenizer, text_dataset, algorithm):
    """Without `packing_buffer_size` energon hands single documents to `batch`: every batch failed, was
    skipped by energon's error handler, and the loader gave nothing."""
    folder, _, _ = text_dataset
    encoder = PackingTaskEncoder(tokenizer, SEQ_LENGTH, algorithm=algorithm)
    with pytest.raises(ValueError, match="pass packing_buffer_size=N"):
        load(folder, encoder, buffer=None)


@pytest.mark.parametrize("seq_length", [0, -8])
def test_a_sequence_length_below_one_is_refused_when_the_encoder_is_made(tokenizer, seq_length):
    """It was refused only by the planner, in every packing buffer, each failure skipped: an empty loader."""
    with pytest.raises(ValueError, match=f"seq_length must be at least 1, got {seq_length}"):
        PackingTaskEncoder(tokenizer, seq_length)


@pytest.mark.parametrize("multiple", [0, -1])
def test_a_padding_multiple_below_one_is_refused_when_the_encoder_is_made(tokenizer, multiple):
    """0 stopped with ZeroDivisionError; -1 passed, and every pack then failed in the loader and was skipped."""
    with pytest.raises(ValueError, match=f"pad_to_multiple_of must be at least 1, got {multiple}"):
        PackingTaskEncoder(tokenizer, SEQ_LENGTH, pad_to_multiple_of=multiple)


@pytest.mark.parametrize(
    ("part", "message"),
    [
        (b'{"text": null}', "json field 'text' is null, not a string"),
        (b'{"text": 5}', "json field 'text' is 5, not a string"),
        (b'{"prompt": ["a"], "completion": "b"}', r"json field 'prompt' is \["),
        (b"[1, 2]", r"json part holds \[1, 2\], not an object"),
        (b"7", "json part holds 7, not an object"),
        (b'{"text": "a"', "json part is not JSON"),
    ],
)
def test_a_json_part_without_text_to_tokenize_is_named(part, message):
    """A text that is not a string reached the tokenizer and a bare number `in`: TypeErrors that named no
    sample; nor did the JSONDecodeError of a part that is not JSON."""
    from cookers.energon_packing import cook_text_document

    with pytest.raises(ValueError, match=f"sample shard-0/doc00007: {message}"):
        cook_text_document({"__key__": "shard-0/doc00007", "__restore_key__": (), "json": part})


def test_the_aux_media_cooker_keeps_its_earlier_module_name():
    import cookers.aux_media
    import cookers.energon_aux_media

    assert cookers.aux_media.AuxMediaTaskEncoder is cookers.energon_aux_media.AuxMediaTaskEncoder


@pytest.mark.parametrize("algorithm", ["bfd", "concat"])
def test_documents_of_no_tokens_are_left_out_not_packed_as_empty_sequences(tmp_path, algorithm):
    """With a tokenizer that adds no marks, empty text has no tokens: packed, it was a sequence of length
    0 in cu_seq_lens (and a buffer of only such documents a batch of no tokens)."""
    path = tmp_path / "tokenizer.json"
    train_tokenizer(documents(100, seed=1), vocab_size=300).save(str(path))
    bare = load_tokenizer(path, add_bos=False, add_eos=False)
    texts = ["" if index % 3 == 0 or 12 <= index < 20 else f"word {index} " * 3 for index in range(30)]
    folder = tmp_path / "shards"
    keys = write_shards(folder, [{"text": text} for text in texts], per_shard=10)
    prepare(folder)
    encoder = PackingTaskEncoder(bare, 32, algorithm=algorithm)
    seen, tokens = set(), 0
    for batch in get_loader(load(folder, encoder, buffer=4, batch_size=1)):
        assert batch.num_tokens > 0 and (batch.cu_seq_lens_q.diff() > 0).all(), batch.cu_seq_lens_q
        seen.update(key.split("#")[0] for pack in batch.document_keys for key in pack)
        tokens += batch.num_tokens
    assert seen == {key for key, text in zip(keys, texts, strict=True) if text}
    assert tokens == sum(len(ids) for ids in bare.encode_batch(texts))
