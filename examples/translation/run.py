"""Parallel text with word alignments -> `shardprep write --format parallel` -> energon's loader with the
`TranslationTaskEncoder`: length buckets, token-budget batches, padded alignment matrices.

Trains nothing: it runs the whole data path once and prints what a training step would receive.

    python examples/translation/run.py                  # work folder in a temporary directory
    python examples/translation/run.py --keep out/      # keep the text files, tokenizer and shards in out/
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cookers.energon_translation import TranslationTaskEncoder  # noqa: E402
from cookers.tokenizer import load_tokenizer  # noqa: E402
from cookers.translation import LengthBuckets, LengthLimits, format_padding_report, padding_report  # noqa: E402
from tools.bench_translation import parallel_corpus, train_word_tokenizer  # noqa: E402


def write_files(folder: Path, count: int) -> list[Path]:
    """source.txt, target.txt and alignment.txt, line-aligned; a few lines with an empty side."""
    paths = [folder / name for name in ("source.txt", "target.txt", "alignment.txt")]
    pairs = list(parallel_corpus(count, seed=11, median_words=14, sigma=0.6))
    pairs[10] = ("", pairs[10][1], "")  # dropped at load time: an empty side
    for column, path in enumerate(paths):
        path.write_text("".join(pair[column] + "\n" for pair in pairs))
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    parser.add_argument("--pairs", type=int, default=3000)
    parser.add_argument(
        "--batch-size", type=int, default=1024, help="tokens per batch (longest pair x pairs)"
    )
    parser.add_argument("--width", type=int, default=1, help="length bucket width")
    parser.add_argument("--bucket-sides", default="longer", choices=("longer", "both"))
    args = parser.parse_args(argv)

    import torch
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        files = write_files(work, args.pairs)
        # The alignments index whitespace tokens, so the vocabulary is one token per word (as OpenNMT-tf's
        # vocabularies over pre-tokenized text); a subword tokenizer would need alignments over its tokens.
        tokenizer_file = work / "tokenizer.json"
        texts = (line for path in files[:2] for line in path.read_text().splitlines())
        train_word_tokenizer(texts).save(str(tokenizer_file))
        tokenizer = load_tokenizer(tokenizer_file)

        shards = work / "shards"
        command = [
            "write",
            "--format",
            "parallel",
            *map(str, files),
            str(shards),
            "--maxcount",
            "1000",
            "--overwrite",
            "--no-progress",
        ]
        print("$ shardprep " + shlex.join(command))
        done = subprocess.run(
            [sys.executable, "-m", "prep", *command], cwd=REPO, check=True, capture_output=True, text=True
        )
        print("  " + done.stdout.strip().replace("\n", "\n  "))

        sources, targets = (path.read_text().splitlines() for path in files[:2])
        lengths = [(len(s.split()), len(t.split())) for s, t in zip(sources, targets, strict=True) if s and t]
        print(f"\npadding by bucket width, {args.batch_size}-token batches, multiple 8 (choose a width):")
        figures = padding_report(
            [s for s, _ in lengths],
            [t for _, t in lengths],
            args.batch_size,
            widths=(1, 2, 4, 8, None),
            batch_size_multiple=8,
            bucket_sides=args.bucket_sides,
        )
        print("  " + format_padding_report(figures).replace("\n", "\n  "))

        buckets = LengthBuckets(
            args.batch_size, "tokens", args.width, batch_size_multiple=8, bucket_sides=args.bucket_sides
        )
        limits = LengthLimits(maximum_features_length=40, maximum_labels_length=40)
        encoder = TranslationTaskEncoder(tokenizer, buckets, limits=limits)
        dataset = get_train_dataset(
            shards,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1),
            batch_size=None,
            shuffle_buffer_size=200,
            max_samples_per_sequence=None,
            task_encoder=encoder,
            repeat=False,
        )
        batches = pairs = padding = tokens = 0
        dropped: Counter[str] = Counter()
        for batch in get_loader(dataset):
            if batches < 2:
                print(
                    f"\nbatch {batches}: bucket {batch.bucket}, {len(batch.__key__)} pairs, source_ids "
                    f"{tuple(batch.source_ids.shape)}, target_ids {tuple(batch.target_ids.shape)}, alignment "
                    f"{tuple(batch.alignment.shape)}"
                )
                # Show the pair whose alignment is the furthest from a diagonal.
                diagonal = torch.eye(*batch.alignment.shape[1:])
                row = int((batch.alignment * (1 - diagonal)).sum(dim=(1, 2)).argmax())
                length, words = int(batch.target_length[row]), int(batch.source_length[row])
                print(
                    f"  target_ids[{row}]     = {batch.target_ids[row, :length].tolist()}  (<s> = {tokenizer.bos_id} first)"
                )
                print(
                    f"  target_ids_out[{row}] = {batch.target_ids_out[row, :length].tolist()}  (</s> = {tokenizer.eos_id} last)"
                )
                matrix = batch.alignment[row, : length - 1, :words].int().tolist()
                print(f"  alignment[{row}] (a row per target token, a column per source token):")
                print("    " + "\n    ".join(" ".join(map(str, line)) for line in matrix))
            batches += 1
            pairs += len(batch.__key__)
            padding += batch.num_padding
            tokens += batch.source_ids.numel() + batch.target_ids.numel()
            dropped.update(batch.dropped)
        print(
            f"\n{pairs} pairs in {batches} batches, {100 * padding / tokens:.2f}% padding; dropped: "
            f"{dict(dropped) or 'none'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
