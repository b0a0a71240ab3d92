"""Parallel-text batching benchmark: padding per bucket width, and batching speed against tokenization.

Three parts, each measured in this run:

1. padding: 1,000,000 synthetic pairs with a WMT-like length distribution (source tokens lognormal,
   median 22, sigma 0.55, 1..256; target = source x a lognormal ratio, median 1.1, sigma 0.15), batched
   in tokens mode (4,096 tokens, multiple 8 as for fp16) with bucket widths 1, 2, 8 and without buckets,
   by `cookers.translation.padding_report` (OpenNMT-tf's buckets over the longer side, and buckets over
   both sides). Prints the padding fraction (both sides, and each), and the most pairs waiting in
   unfilled buckets.
2. batching: the same pairs as token arrays through what energon runs for each pair and batch:
   `TranslationTaskEncoder.batch_group_criterion`, energon's bucket rule (a batch leaves when its
   bucket is full, the rest at the end), and `TranslationTaskEncoder.batch` (padding into torch
   tensors); batches/s and pairs/s per width, and the padding of the batches it made.
3. tokenization: `TranslationTaskEncoder.encode_sample` (both sides through a byte-level BPE
   `tokenizers` tokenizer, `<s>`/`</s>`, filter) on synthetic sentence pairs; pairs/s, and the ratio
   of batching to tokenization speed (the target: at least 10x, so batching is never the bottleneck).

    python -m tools.bench_translation                      # all three, 1,000,000 pairs
    python -m tools.bench_translation --pairs 100000 --parts padding batching

The synthetic corpus and the word-level tokenizer here are also what the translation tests and
`examples/translation/` use.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Iterable, Iterator

import numpy as np

from cookers.translation import BUCKET_SIDES, LengthBuckets, format_padding_report, padding_report
from tools.text_corpus import vocabulary
from tools.train_tokenizer import SPECIAL_TOKENS, train_tokenizer

WIDTHS: tuple[int | None, ...] = (1, 2, 8, None)


def translate(word: str) -> str:
    """The synthetic target language: every word spelled backwards."""
    return word[::-1]


def parallel_corpus(
    count: int, seed: int = 0, median_words: float = 20.0, sigma: float = 0.5
) -> Iterator[tuple[str, str, str]]:
    """Seeded (source, target, pharaoh alignment) sentence pairs of pseudo-words.

    The target spells each source word backwards; now and then two neighbouring words swap places or a
    word becomes two target words, so alignments are not the identity. Alignments are over whitespace
    tokens, as `shardprep write --format parallel` checks them.
    """
    rng = random.Random(seed)
    words = vocabulary(rng)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    for _ in range(count):
        size = max(1, round(math.exp(rng.gauss(math.log(median_words), sigma))))
        source = rng.choices(words, weights, k=size)
        target: list[str] = []
        pairs: list[tuple[int, int]] = []
        i = 0
        while i < size:
            if i + 1 < size and rng.random() < 0.1:  # two words swap places
                for k in (i + 1, i):
                    pairs.append((k, len(target)))
                    target.append(translate(source[k]))
                i += 2
                continue
            word = translate(source[i])
            if len(word) > 5 and rng.random() < 0.15:  # one word becomes two
                cut = len(word) // 2
                pairs += [(i, len(target)), (i, len(target) + 1)]
                target += [word[:cut], word[cut:]]
            else:
                pairs.append((i, len(target)))
                target.append(word)
            i += 1
        yield " ".join(source), " ".join(target), " ".join(f"{s}-{t}" for s, t in pairs)


def train_word_tokenizer(texts: Iterable[str]):  # noqa: ANN201 - tokenizers.Tokenizer
    """A word-level `tokenizers.Tokenizer` (one token per whitespace word, as OpenNMT-tf's vocabularies
    over pre-tokenized text), special tokens <pad> <s> </s> <unk> first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def synthetic_lengths(count: int, seed: int = 0, ratio_sigma: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """Source and target token counts of `count` pairs, WMT-like (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    source = np.clip(np.rint(rng.lognormal(math.log(22), 0.55, count)), 1, 256).astype(np.int64)
    ratio = rng.lognormal(math.log(1.1), ratio_sigma, count)
    target = np.clip(np.rint(source * ratio), 1, 256).astype(np.int64)
    return source, target


def run_padding(source: np.ndarray, target: np.ndarray, batch_size: int, multiple: int) -> None:
    print(f"\n## Padding, {len(source):,} pairs, tokens mode, batch_size {batch_size}, multiple {multiple}\n")
    for sides in BUCKET_SIDES:
        started = time.perf_counter()
        figures = padding_report(
            source, target, batch_size, WIDTHS, "tokens", batch_size_multiple=multiple, bucket_sides=sides
        )
        seconds = time.perf_counter() - started
        title = "OpenNMT-tf (bucket over the longer side)" if sides == "longer" else "buckets over both sides"
        print(f"{title}, simulated in {seconds:.2f} s:")
        print(format_padding_report([f for f in figures if sides == "longer" or f.width is not None]))
        print()


def tokenized_pairs(source: np.ndarray, target: np.ndarray, lo: int, hi: int, vocab: int, seed: int) -> list:
    """`TokenizedPair` samples of pairs [lo, hi) with random token ids (what `encode_sample` yields)."""
    from cookers.energon_translation import TokenizedPair
    from cookers.translation import target_sequences

    rng = np.random.default_rng(seed + lo)
    samples = []
    for i in range(lo, hi):
        ids = rng.integers(4, vocab, size=int(source[i] + target[i]), dtype=np.int32)
        ids_in, ids_out = target_sequences(ids[source[i] :], 1, 2)
        samples.append(
            TokenizedPair(
                __key__=f"{i:09d}",
                __restore_key__=(),
                source_ids=ids[: source[i]],
                target_ids=ids_in,
                target_ids_out=ids_out,
            )
        )
    return samples


def time_batching(
    encoder, source: np.ndarray, target: np.ndarray, chunk: int = 20_000
) -> tuple[float, int, int, int]:
    """Seconds, batches, padding tokens and all tokens of grouping and batching the pairs as energon's
    grouped batching calls the encoder (sample creation is outside the timing)."""
    buckets: dict[object, list] = {}
    seconds, batches, padding, tokens = 0.0, 0, 0, 0
    for lo in range(0, len(source), chunk):
        samples = tokenized_pairs(source, target, lo, min(lo + chunk, len(source)), 8000, seed=1)
        started = time.perf_counter()
        for sample in samples:
            key, size = encoder.batch_group_criterion(sample)
            bucket = buckets.setdefault(key, [])
            bucket.append(sample)
            if len(bucket) >= size:
                batch = encoder.batch(bucket)
                buckets[key] = []
                batches += 1
                padding += batch.num_padding
                tokens += batch.source_ids.numel() + batch.target_ids.numel()
        seconds += time.perf_counter() - started
    started = time.perf_counter()
    for bucket in buckets.values():
        if bucket:
            batch = encoder.batch(bucket)
            batches += 1
            padding += batch.num_padding
            tokens += batch.source_ids.numel() + batch.target_ids.numel()
    seconds += time.perf_counter() - started
    return seconds, batches, padding, tokens


def run_batching(source: np.ndarray, target: np.ndarray, batch_size: int, multiple: int, tokenizer) -> float:
    """Batching speed per configuration; returns the slowest in tokens/s (source + target ids)."""
    from cookers.energon_translation import TranslationTaskEncoder

    print(f"## Batching through the task encoder's hooks, {len(source):,} pairs\n")
    print(
        f"{'width':>6} {'buckets':>7} {'seconds':>8} {'batches/s':>10} {'pairs/s':>11} {'tokens/s':>12}"
        f" {'padding':>8}"
    )
    pair_tokens = float((source + target + 1).mean())
    slowest = math.inf
    for sides in BUCKET_SIDES:
        for width in WIDTHS:
            if width is None:
                if sides == "both":
                    continue
                mean = float(np.maximum(source, target + 1).mean())
                buckets = LengthBuckets(max(1, int(batch_size // mean)))
            else:
                buckets = LengthBuckets(batch_size, "tokens", width, multiple, bucket_sides=sides)
            encoder = TranslationTaskEncoder(tokenizer, buckets)
            seconds, batches, padding, tokens = time_batching(encoder, source, target)
            rate = len(source) / seconds
            slowest = min(slowest, rate * pair_tokens)
            label = "none" if width is None else str(width)
            print(
                f"{label:>6} {sides if width else '-':>7} {seconds:>8.2f} {batches / seconds:>10.0f} "
                f"{rate:>11,.0f} {rate * pair_tokens:>12,.0f} {100 * padding / tokens:>7.2f}%"
            )
    return slowest


def run_tokenization(count: int, tokenizer) -> float:
    """Tokens/s of `encode_sample` (tokenize both sides, marks, filter) on synthetic sentence pairs."""
    from cookers.energon_translation import TranslationPair, TranslationTaskEncoder

    pairs = [
        TranslationPair(__key__=f"{i:09d}", __restore_key__=(), source=source, target=target)
        for i, (source, target, _) in enumerate(parallel_corpus(count, seed=5, median_words=10))
    ]
    encoder = TranslationTaskEncoder(tokenizer, LengthBuckets(4096, "tokens", 1))
    started = time.perf_counter()
    tokens = 0
    for pair in pairs:
        encoded = encoder.encode_sample(pair)
        tokens += len(encoded.source_ids) + len(encoded.target_ids)
    seconds = time.perf_counter() - started
    print(f"\n## Tokenization (encode_sample, byte-level BPE), {count:,} pairs\n")
    print(
        f"{seconds:.2f} s, {count / seconds:,.0f} pairs/s, {tokens / seconds:,.0f} tokens/s "
        f"({tokens / count:.1f} tokens per pair)"
    )
    return tokens / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_translation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--pairs", type=int, default=1_000_000, help="synthetic pairs for padding and batching"
    )
    parser.add_argument("--tokenize-pairs", type=int, default=50_000, help="sentence pairs to tokenize")
    parser.add_argument("--batch-size", type=int, default=4096, help="tokens per batch")
    parser.add_argument("--multiple", type=int, default=8, help="batch_size_multiple (8 for fp16)")
    parser.add_argument(
        "--ratio-sigma", type=float, default=0.15, help="sigma of the target/source length ratio"
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["padding", "batching", "tokenization"],
        choices=["padding", "batching", "tokenization"],
    )
    args = parser.parse_args(argv)

    from cookers.tokenizer import TokenizerAdapter

    source, target = synthetic_lengths(args.pairs, ratio_sigma=args.ratio_sigma)
    print(
        f"{args.pairs:,} pairs: source tokens mean {source.mean():.1f}, median {np.median(source):.0f}, "
        f"max {source.max()}; target mean {target.mean():.1f}, max {target.max()}"
    )
    if "padding" in args.parts:
        run_padding(source, target, args.batch_size, args.multiple)
    texts = [text for pair in parallel_corpus(5000, seed=4) for text in pair[:2]]
    bpe = TokenizerAdapter(train_tokenizer(texts, vocab_size=8000), bos_id=1, eos_id=2, pad_id=0)
    batching = tokenizing = None
    if "batching" in args.parts:
        batching = run_batching(source, target, args.batch_size, args.multiple, bpe)
    if "tokenization" in args.parts:
        tokenizing = run_tokenization(args.tokenize_pairs, bpe)
    if batching and tokenizing:
        print(
            f"\nbatching (slowest configuration) {batching:,.0f} tokens/s against tokenization "
            f"{tokenizing:,.0f} tokens/s: {batching / tokenizing:.1f}x (target: at least 10x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
