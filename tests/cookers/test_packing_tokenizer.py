"""The tokenizer adapter: BOS/EOS as configured, prompt masking, same tokens from tokenizers and transformers."""

from __future__ import annotations

import numpy as np
import pytest

from cookers.tokenizer import TokenizerAdapter, load_tokenizer
from tools.text_corpus import documents
from tools.train_tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_tokenizer(documents(300, seed=5), vocab_size=500).save(str(path))
    return path


def test_bos_and_eos_are_added_as_configured(tokenizer_file):
    plain = load_tokenizer(tokenizer_file, add_bos=False, add_eos=False)
    both = load_tokenizer(
        tokenizer_file.parent, add_bos=True, add_eos=True
    )  # a folder holding tokenizer.json
    texts = ["Gocaza paza gufumuha.", "Ra cujado!"]
    for bare, framed in zip(plain.encode_batch(texts), both.encode_batch(texts), strict=True):
        assert framed.dtype == np.int32
        assert framed.tolist() == [both.bos_id, *bare.tolist(), both.eos_id]
    assert plain.decode(plain.encode(texts[0])) == texts[0]


def test_prompt_tokens_are_masked_and_completion_and_eos_supervised(tokenizer_file):
    tokenizer = load_tokenizer(tokenizer_file, add_bos=True, add_eos=True)
    ids, mask = tokenizer.encode_prompt_completion("Why ra?", " Because gocaza.")
    prompt_length = len(tokenizer.encode_batch(["Why ra?"])[0]) - 1  # without EOS, with BOS
    assert len(ids) == len(mask)
    assert not mask[:prompt_length].any() and mask[prompt_length:].all()
    assert ids[-1] == tokenizer.eos_id


def test_missing_special_tokens_are_reported(tokenizer_file):
    with pytest.raises(ValueError, match="not in the vocabulary"):
        load_tokenizer(tokenizer_file, eos_token="<|nope|>")


def test_transformers_backend_gives_the_same_tokens(tokenizer_file):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(tokenizer_file)))
    ours = load_tokenizer(tokenizer_file, add_bos=True)
    theirs = TokenizerAdapter(fast, bos_id=ours.bos_id, eos_id=ours.eos_id, add_bos=True)
    texts = list(documents(5, seed=9))
    for a, b in zip(ours.encode_batch(texts), theirs.encode_batch(texts), strict=True):
        assert a.tolist() == b.tolist()
