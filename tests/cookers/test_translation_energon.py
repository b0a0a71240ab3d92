"""The translation task encoder inside energon's real loader, on parallel text (source, target and
alignment files) written by `shardprep write --format parallel`."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from megatron.energon import get_loader, get_savable_loader

from cookers.energon_translation import (
    IRREGULAR,
    TranslationPair,
    TranslationTaskEncoder,
    cook_translation_pair,
)
from cookers.tokenizer import TokenizerAdapter, load_tokenizer
from cookers.translation import LengthBuckets, LengthLimits, alignment_matrix_from_pharaoh
from tests.support.loader import batches_around_a_restore, train_dataset
from tests.support.prepare import run_shardprep
from tools.bench_translation import parallel_corpus, train_word_tokenizer

pytestmark = pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true:UserWarning")
LIMITS = LengthLimits(maximum_features_length=30, maximum_labels_length=26)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three line-aligned files written to shards by `shardprep write`: 120 pairs, two with an empty side
    and some over the length limits."""
    folder = tmp_path_factory.mktemp("parallel")
    pairs = list(parallel_corpus(120, seed=2, median_words=12, sigma=0.6))
    pairs[7] = ("", "ekil", "")
    pairs[50] = ("like", "", "")
    for name, column in (("src.txt", 0), ("tgt.txt", 1), ("align.txt", 2)):
        (folder / name).write_text("".join(pair[column] + "\n" for pair in pairs))
    shards = folder / "shards"
    run_shardprep(
        "write",
        "--format",
        "parallel",
        *(str(folder / n) for n in ("src.txt", "tgt.txt", "align.txt")),
        str(shards),
        "--maxcount",
        "40",
        "--no-progress",
        check=True,
    )
    tokenizer_path = folder / "tokenizer.json"
    train_word_tokenizer(text for pair in pairs for text in pair[:2]).save(str(tokenizer_path))
    return shards, pairs, load_tokenizer(tokenizer_path)


def load(folder, encoder, workers=0, shuffle=None):
    # batch_size None: every bucket says its own batch size
    return train_dataset(folder, encoder, batch_size=None, workers=workers, shuffle=shuffle)


def expected_drops(pairs):
    counts = collections.Counter()
    for source, target, _ in pairs:
        reason = LIMITS.drop_reason(len(source.split()), len(target.split()))
        if reason:
            counts[reason] += 1
    return counts


def test_every_kept_pair_is_batched_once_in_its_bucket_with_marks_padding_and_alignments(corpus):
    folder, pairs, tokenizer = corpus
    buckets = LengthBuckets(96, "tokens", length_bucket_width=2, batch_size_multiple=2)
    encoder = TranslationTaskEncoder(tokenizer, buckets, limits=LIMITS)
    keys, dropped, partial = [], collections.Counter(), collections.Counter()
    for batch in get_loader(load(folder, encoder)):
        size = len(batch.__key__)
        assert batch.source_ids.shape[0] == batch.target_ids.shape[0] == size
        assert batch.alignment.shape == (size, batch.target_ids.shape[1], batch.source_ids.shape[1])
        assert batch.alignment.dtype == torch.float32
        for row, key in enumerate(batch.__key__):
            source, target, alignment = pairs[int(key)]
            source_length, target_length = len(source.split()), len(target.split())
            assert buckets.key_of(source_length, target_length + 1)[0] == batch.bucket
            assert batch.source_length[row] == source_length and batch.target_length[row] == target_length + 1
            assert (
                batch.source_ids[row, :source_length].tolist()
                == tokenizer.encode_batch([source])[0][:-1].tolist()
            )
            assert (batch.source_ids[row, source_length:] == tokenizer.pad_id).all()
            ids, ids_out = batch.target_ids[row], batch.target_ids_out[row]
            assert ids[0] == tokenizer.bos_id and ids_out[target_length] == tokenizer.eos_id
            assert ids[1 : target_length + 1].equal(ids_out[:target_length])
            assert (ids[target_length + 1 :] == tokenizer.pad_id).all()
            assert (ids_out[target_length + 1 :] == tokenizer.pad_id).all()
            matrix = alignment_matrix_from_pharaoh(alignment, source_length, target_length)
            assert batch.alignment[row, :target_length, :source_length].numpy().tolist() == matrix.tolist()
            assert (
                not batch.alignment[row, target_length:].any()
                and not batch.alignment[row, :, source_length:].any()
            )
        if size < buckets.key_of(*batch.source_ids.shape[1:], batch.target_ids.shape[1])[1]:
            partial[batch.bucket] += 1
        keys.extend(batch.__key__)
        dropped.update(batch.dropped)
    assert all(count == 1 for count in partial.values()), "only a bucket's last batch may be partial"
    expected = expected_drops(pairs)
    assert dropped == expected == encoder.drop_counts
    assert expected["empty source"] == 1 and len(expected) == 3
    assert len(keys) == len(set(keys)) == len(pairs) - sum(expected.values())
    assert "000000050" in keys, "a pair with an empty target is batched: ids <s>, ids_out </s>"


@pytest.mark.parametrize(("sides", "workers"), [("longer", 1), ("both", 0)])
def test_restored_loader_state_gives_the_same_next_batches(corpus, sides, workers):
    folder, _, tokenizer = corpus
    encoder = TranslationTaskEncoder(
        tokenizer, LengthBuckets(64, "tokens", 4, bucket_sides=sides), limits=LIMITS
    )

    def fresh():
        return get_savable_loader(load(folder, encoder, workers=workers, shuffle=20))

    expected, got = batches_around_a_restore(fresh)
    assert len(expected) >= 4 and [b.__key__ for b in got] == [b.__key__ for b in expected]
    for a, b in zip(got, expected, strict=True):
        assert a.source_ids.equal(b.source_ids) and a.target_ids.equal(b.target_ids)
        assert a.target_ids_out.equal(b.target_ids_out) and a.alignment.equal(b.alignment)


def test_a_fixed_batch_size_is_refused_when_the_dataset_is_built(corpus):
    # energon asserted on every pair in the loader, logged a hundred tracebacks and then stopped.
    folder, _, tokenizer = corpus
    encoder = TranslationTaskEncoder(tokenizer, LengthBuckets(64, "tokens", 4))
    with pytest.raises(ValueError, match=r"pass batch_size=None \(got 8\)"):
        train_dataset(folder, encoder, batch_size=8)


def test_irregular_batches_are_dropped_for_a_batch_multiplier(corpus):
    folder, pairs, tokenizer = corpus
    buckets = LengthBuckets(3, "examples", length_bucket_width=5, batch_multiplier=2)
    encoder = TranslationTaskEncoder(tokenizer, buckets, limits=LIMITS)
    batches = list(get_loader(load(folder, encoder)))
    assert all(len(b.__key__) % 2 == 0 for b in batches)
    assert {len(b.__key__) for b in batches} >= {6}
    kept = sum(len(b.__key__) for b in batches)
    lost = encoder.drop_counts[IRREGULAR]
    assert lost > 0 and kept + lost + sum(expected_drops(pairs).values()) == len(pairs)


def test_a_sentencepiece_model_tokenizes_both_sides(corpus, tmp_path):
    sentencepiece = pytest.importorskip("sentencepiece", reason="the sentencepiece extra is not installed")
    _, pairs, _ = corpus
    texts = [text for pair in pairs for text in pair[:2] if text]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=200,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        minloglevel=2,
    )
    tokenizer = load_tokenizer(tmp_path / "sp.model")
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (1, 2, 0)
    assert load_tokenizer(tmp_path / "sp.model", eos_token="<unk>").eos_id == 3
    with pytest.raises(ValueError, match=r"token '<nope>' is not in the vocabulary of .*sp.model"):
        load_tokenizer(tmp_path / "sp.model", bos_token="<nope>")
    assert tokenizer.decode(tokenizer.encode(pairs[3][0])) == pairs[3][0]
    processor = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    encoder = TranslationTaskEncoder(tokenizer, LengthBuckets(8, length_bucket_width=4))
    source, target, _ = pairs[3]
    encoded = encoder.encode_sample(
        TranslationPair(__key__="p3", __restore_key__=(), source=source, target=target)
    )
    assert encoded.source_ids.tolist() == processor.encode(source)
    assert encoded.target_ids.tolist() == [1, *processor.encode(target)]
    assert encoded.target_ids_out.tolist() == [*processor.encode(target), 2]


def test_a_sentencepiece_model_without_the_package_names_the_extra(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sentencepiece(name, *args, **kwargs):
        if name == "sentencepiece":
            raise ImportError("No module named 'sentencepiece'")
        return real_import(name, *args, **kwargs)

    model = tmp_path / "tok.model"
    model.write_bytes(b"not read")
    monkeypatch.setattr(builtins, "__import__", no_sentencepiece)
    with pytest.raises(ImportError, match=r"pip install 'shardprep\[sentencepiece\]'"):
        load_tokenizer(model)


def test_bad_pairs_are_named_by_their_sample(corpus):
    _, _, tokenizer = corpus
    encoder = TranslationTaskEncoder(tokenizer, LengthBuckets(8))
    pair = TranslationPair(__key__="s4", __restore_key__=(), source="a b", target="c", alignment="0-0 1-3")
    with pytest.raises(
        ValueError, match=r"sample s4: alignment pair '1-3' is out of range: target position 3"
    ):
        encoder.encode_sample(pair)
    with pytest.raises(ValueError, match=r"sample s5: no src.txt and tgt.txt parts .*\(parts: txt\)"):
        cook_translation_pair({"__key__": "s5", "__restore_key__": (), "txt": "hello"})
    cooked = cook_translation_pair(
        {"__key__": "s6", "__restore_key__": (), "json": {"src": "a", "tgt": b"b"}}
    )
    assert (cooked.source, cooked.target, cooked.alignment) == ("a", "b", None)
    no_marks = TokenizerAdapter(tokenizer.backend, bos_id=None, eos_id=2, add_eos=False)
    with pytest.raises(ValueError, match=r"the target tokenizer has no <s> \(bos_id\)"):
        TranslationTaskEncoder(no_marks, LengthBuckets(8))


@pytest.mark.parametrize("source", [None, 5, ["a", "b"]])
def test_a_json_side_that_is_not_text_is_named_not_trained_on_as_its_printed_form(source):
    sample = {"__key__": "s7", "__restore_key__": (), "json": {"src": source, "tgt": "b"}}
    with pytest.raises(ValueError, match="sample s7: the source is a .*, not text"):
        cook_translation_pair(sample)


def test_pairs_without_alignments_batch_without_a_matrix(corpus):
    _, pairs, tokenizer = corpus
    encoder = TranslationTaskEncoder(tokenizer, LengthBuckets(8))
    samples = [
        encoder.encode_sample(TranslationPair(__key__=f"p{i}", __restore_key__=(), source=s, target=t))
        for i, (s, t, _) in enumerate(pairs[:3])
    ]
    batch = encoder.batch(samples)
    assert batch.alignment is None
    lengths = np.array([len(s.source_ids) for s in samples])
    assert batch.num_padding == int(
        batch.source_ids.numel() - lengths.sum() + batch.target_ids.numel() - batch.target_length.sum()
    )
