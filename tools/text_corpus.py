"""Seeded pseudo-text documents, so tokenizer training, examples and tests need no downloaded corpus.

Documents are sentences of pronounceable pseudo-words whose word counts follow a lognormal distribution
(long-tailed, like real documents). The same seed gives the same documents.

    python -m tools.text_corpus --count 1000 --output docs.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Iterator
from pathlib import Path


def vocabulary(rng: random.Random, size: int = 2000) -> list[str]:
    """Pronounceable pseudo-words of one to four syllables."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    return [
        "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(1, 4)))
        for _ in range(size)
    ]


def documents(count: int, seed: int = 0, median_words: float = 60.0, sigma: float = 0.8) -> Iterator[str]:
    """`count` documents of sentences; word counts lognormal around `median_words`."""
    rng = random.Random(seed)
    words = vocabulary(rng)
    # Zipf-like weights make frequent words frequent, as in text, so BPE learns useful merges.
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    for _ in range(count):
        remaining = max(1, round(math.exp(rng.gauss(math.log(median_words), sigma))))
        sentences = []
        while remaining > 0:
            size = min(remaining, rng.randint(4, 14))
            sentence = " ".join(rng.choices(words, weights, k=size))
            sentences.append(sentence.capitalize() + rng.choice(".?!"))
            remaining -= size
        yield " ".join(sentences)


def prompt_completion_records(count: int, seed: int = 0) -> Iterator[dict[str, str]]:
    """SFT-style records: a short question-like prompt and a longer completion."""
    texts = documents(2 * count, seed=seed)
    for _ in range(count):
        prompt, completion = next(texts), next(texts)
        yield {"prompt": prompt.split(".")[0] + "?", "completion": completion}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1000, help="number of documents")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output", type=Path, required=True, help="JSONL file to write ({'text': ...} per line)"
    )
    args = parser.parse_args(argv)
    with args.output.open("w") as out:
        for text in documents(args.count, args.seed):
            out.write(json.dumps({"text": text}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
