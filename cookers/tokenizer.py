"""Tokenizer adapter: one small interface over a Hugging Face `tokenizers.Tokenizer`, a `transformers`
tokenizer or a sentencepiece model, returning numpy token arrays with BOS/EOS added the way the caller
configured.

The adapter adds BOS/EOS itself (special tokens of the underlying tokenizer's post-processor are turned
off), so the same configuration gives the same tokens whatever tokenizer sits underneath.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TOKEN_DTYPE = np.int32


@dataclass
class TokenizerAdapter:
    """Encodes text to int32 token arrays, in batches.

    `backend` is a `tokenizers.Tokenizer` or a `transformers.PreTrainedTokenizerBase`. `bos_id` /
    `eos_id` are added when `add_bos` / `add_eos` are set; `pad_id` is what padding uses.
    """

    backend: object
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0
    add_bos: bool = False
    add_eos: bool = True
    _is_fast_tokenizers: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._is_fast_tokenizers = type(self.backend).__module__.startswith("tokenizers")
        if self.add_bos and self.bos_id is None:
            raise ValueError("add_bos is set but the tokenizer has no BOS token; pass bos_token or bos_id")
        if self.add_eos and self.eos_id is None:
            raise ValueError("add_eos is set but the tokenizer has no EOS token; pass eos_token or eos_id")

    @property
    def vocab_size(self) -> int:
        """Number of token ids (special tokens included)."""
        if self._is_fast_tokenizers:
            return int(self.backend.get_vocab_size(with_added_tokens=True))
        return len(self.backend)

    def _raw_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if self._is_fast_tokenizers:
            return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]
        return self.backend(list(texts), add_special_tokens=False)["input_ids"]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token arrays of the texts, each with BOS/EOS as configured: one int32 array per text."""
        head = [self.bos_id] if self.add_bos else []
        tail = [self.eos_id] if self.add_eos else []
        return [np.asarray(head + ids + tail, dtype=TOKEN_DTYPE) for ids in self._raw_batch(texts)]

    def encode(self, text: str) -> np.ndarray:
        """Token array of one text, with BOS/EOS as configured."""
        return self.encode_batch([text])[0]

    def encode_prompt_completion(self, prompt: str, completion: str) -> tuple[np.ndarray, np.ndarray]:
        """Tokens of prompt + completion and the loss mask: False on BOS and prompt, True on completion and EOS."""
        prompt_ids, completion_ids = self._raw_batch([prompt, completion])
        head = [self.bos_id] if self.add_bos else []
        tail = [self.eos_id] if self.add_eos else []
        ids = np.asarray(head + prompt_ids + completion_ids + tail, dtype=TOKEN_DTYPE)
        mask = np.zeros(len(ids), dtype=bool)
        mask[len(head) + len(prompt_ids) :] = True
        return ids, mask

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of token ids (special tokens skipped)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=True)


class SentencePieceBackend:
    """A sentencepiece model behind the calls `TokenizerAdapter` makes of a `transformers` tokenizer."""

    def __init__(self, processor: object) -> None:
        self.processor = processor

    def __call__(self, texts: Sequence[str], add_special_tokens: bool = False) -> dict[str, list[list[int]]]:
        return {"input_ids": self.processor.encode(list(texts))}

    def __len__(self) -> int:
        return int(self.processor.get_piece_size())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.processor.decode(ids)


def _load_sentencepiece(
    path: Path, add_bos: bool, add_eos: bool, bos: str | None, eos: str | None, pad: str | None
) -> TokenizerAdapter:
    """A sentencepiece `.model` file; special tokens default to the model's own BOS, EOS and PAD."""
    try:
        import sentencepiece
    except ImportError as error:
        raise ImportError(
            f"{path} is a sentencepiece model, and reading it needs the sentencepiece package:"
            " pip install 'shardprep[sentencepiece]'"
        ) from error
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))

    def token_id(explicit: str | None, default: int) -> int | None:
        if explicit is None:
            return default if default >= 0 else None
        found = processor.piece_to_id(explicit)
        if processor.id_to_piece(found) != explicit:
            raise ValueError(f"token {explicit!r} is not in the vocabulary of {path}")
        return found

    pad_id = token_id(pad, processor.pad_id())
    return TokenizerAdapter(
        SentencePieceBackend(processor),
        token_id(bos, processor.bos_id()),
        token_id(eos, processor.eos_id()),
        pad_id if pad_id is not None else 0,
        add_bos,
        add_eos,
    )


def load_tokenizer(
    name_or_path: str | Path,
    add_bos: bool = False,
    add_eos: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    pad_token: str | None = None,
) -> TokenizerAdapter:
    """Load a tokenizer: a `tokenizer.json` file (or a folder holding one) through `tokenizers`, a
    sentencepiece `.model` file through `sentencepiece`, anything else through
    `transformers.AutoTokenizer` when that package is installed.

    Special tokens default to the tokenizer's own (transformers) or to the first of `<s>`/`<bos>`,
    `</s>`/`<eos>`, `<pad>` found in the vocabulary (tokenizers).
    """
    path = Path(name_or_path)
    if path.is_file() and path.suffix == ".model":
        return _load_sentencepiece(path, add_bos, add_eos, bos_token, eos_token, pad_token)
    json_file = path / "tokenizer.json" if path.is_dir() else path
    if json_file.is_file() and json_file.suffix == ".json":
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(json_file))
        vocab = backend.get_vocab(with_added_tokens=True)

        def find(explicit: str | None, candidates: tuple[str, ...]) -> int | None:
            if explicit is not None:
                if explicit not in vocab:
                    raise ValueError(f"token {explicit!r} is not in the vocabulary of {json_file}")
                return vocab[explicit]
            return next((vocab[c] for c in candidates if c in vocab), None)

        bos = find(bos_token, ("<s>", "<bos>", "<|begin_of_text|>"))
        eos = find(eos_token, ("</s>", "<eos>", "<|endoftext|>", "<|end_of_text|>"))
        pad = find(pad_token, ("<pad>",))
        return TokenizerAdapter(backend, bos, eos, pad if pad is not None else 0, add_bos, add_eos)

    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise ValueError(
            f"{name_or_path} is not a tokenizer.json file or a folder holding one, and `transformers` is "
            "not installed to load it by name"
        ) from error
    backend = AutoTokenizer.from_pretrained(str(name_or_path))

    def token_id(explicit: str | None, default: int | None) -> int | None:
        return backend.convert_tokens_to_ids(explicit) if explicit is not None else default

    bos = token_id(bos_token, backend.bos_token_id)
    eos = token_id(eos_token, backend.eos_token_id)
    pad = token_id(pad_token, backend.pad_token_id)
    return TokenizerAdapter(backend, bos, eos, pad if pad is not None else 0, add_bos, add_eos)
