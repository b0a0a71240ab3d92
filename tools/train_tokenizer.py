"""Train a small byte-level BPE tokenizer with `tokenizers` on text the project makes itself.

The default corpus is `tools.text_corpus` pseudo-text (no download); `--input` takes text files or JSONL
files instead (the `text`, `prompt` and `completion` fields of each line are used).

    python -m tools.train_tokenizer --output .cache/tokenizer/tokenizer.json
    python -m tools.train_tokenizer --input data.jsonl --vocab-size 4000 --output tok.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def texts_of(paths: Iterable[Path]) -> Iterator[str]:
    """Lines of text files; `text`/`prompt`/`completion` fields of JSONL files."""
    for path in paths:
        with path.open() as lines:
            for line in lines:
                if path.suffix == ".jsonl":
                    record = json.loads(line)
                    yield from (record[k] for k in ("text", "prompt", "completion") if k in record)
                else:
                    yield line


def train_tokenizer(texts: Iterable[str], vocab_size: int = 2000):  # noqa: ANN201 - tokenizers.Tokenizer
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts`, special tokens <pad> <s> </s> <unk> first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--input", type=Path, nargs="*", default=[], help="text or JSONL files (default: pseudo-text)"
    )
    parser.add_argument("--documents", type=int, default=5000, help="pseudo-text documents when no --input")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--output", type=Path, required=True, help="where to write tokenizer.json")
    args = parser.parse_args(argv)
    if args.input:
        texts = texts_of(args.input)
    else:
        from tools.text_corpus import documents

        texts = documents(args.documents)
    tokenizer = train_tokenizer(texts, args.vocab_size)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.output))
    print(f"wrote {args.output} ({tokenizer.get_vocab_size()} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
