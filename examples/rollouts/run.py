"""RL rollout groups (a prompt and its sampled completions) from a JSONL file -> `shardprep write` ->
energon's loader with the `RolloutTaskEncoder`: prompts stored once, groups packed into sequences.

Trains nothing: it runs the whole data path once and prints what a training step would receive.

    python examples/rollouts/run.py                  # work folder in a temporary directory
    python examples/rollouts/run.py --keep out/      # keep the JSONL, tokenizer and shards in out/
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cookers.energon_rollouts import RolloutTaskEncoder  # noqa: E402
from cookers.tokenizer import load_tokenizer  # noqa: E402
from tools.text_corpus import documents  # noqa: E402
from tools.train_tokenizer import texts_of, train_tokenizer  # noqa: E402


def write_groups(path: Path, count: int, seed: int = 7) -> None:
    """A JSONL of rollout groups: one prompt and 2 to 8 sampled completions each, as text."""
    rng = random.Random(seed)
    texts = documents(10 * count, seed=seed, median_words=60, sigma=0.7)
    with path.open("w") as out:
        for _ in range(count):
            prompt = next(texts)
            completions = [next(texts) for _ in range(rng.randint(2, 8))]
            out.write(json.dumps({"prompt": prompt, "completions": completions}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--seq-length", type=int, default=4096, help="L: tokens per packed sequence")
    parser.add_argument("--buffer", type=int, default=64, help="energon packing buffer (groups)")
    args = parser.parse_args(argv)

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        jsonl = work / "groups.jsonl"
        write_groups(jsonl, args.groups)
        tokenizer_file = work / "tokenizer.json"
        train_tokenizer(texts_of([jsonl]), vocab_size=2000).save(str(tokenizer_file))
        tokenizer = load_tokenizer(tokenizer_file, add_bos=True, add_eos=True)

        shards = work / "shards"
        command = ["write", str(jsonl), str(shards), "--maxcount", "100", "--overwrite", "--no-progress"]
        print("$ shardprep " + shlex.join(command))
        done = subprocess.run(
            [sys.executable, "-m", "prep", *command], cwd=REPO, check=True, capture_output=True, text=True
        )
        print("  " + done.stdout.strip().replace("\n", "\n  "))

        encoder = RolloutTaskEncoder(tokenizer, seq_length=args.seq_length, pad_to_multiple_of=128)
        dataset = get_train_dataset(
            shards,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1),
            batch_size=1,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            packing_buffer_size=args.buffer,
            task_encoder=encoder,
            repeat=False,
        )
        tokens = sequences = groups = completions = unfolded = 0
        for batch in get_loader(dataset):
            if sequences == 0:
                print(
                    f"\nfirst batch: input_ids {tuple(batch.input_ids.shape)}, {len(batch.group_keys)} groups "
                    f"({', '.join(batch.group_keys[:4])}{' ...' if len(batch.group_keys) > 4 else ''}), "
                    f"{batch.num_padding} padding tokens"
                )
                print(f"  node_lengths[:9]  = {batch.node_lengths[:9]}")
                print(f"  sample_paths[:8]  = {batch.sample_paths[:8]}")
                prompt, first = batch.node_lengths[0], batch.node_lengths[1]
                cut = slice(
                    prompt + first - 2, prompt + first + 2
                )  # the last two tokens of completion 0, two of 1
                print(
                    f"  position_ids[0, {cut.start}:{cut.stop}] = {batch.position_ids[0, cut].tolist()}"
                    f"  (completion 1 starts again at the prompt's length, {prompt})"
                )
                print(
                    f"  labels[0, {prompt - 2}:{prompt + 2}]   = {batch.labels[0, prompt - 2 : prompt + 2].tolist()}"
                    "  (the prompt predicts nothing; completions predict their next token)"
                )
                block_mask = batch.block_mask(block_size=128)
                print(
                    f"  flex-attention BlockMask {tuple(block_mask.shape)}: {block_mask.sparsity():.1f}% of "
                    "128x128 blocks skipped (prompt seen by its completions, groups apart)"
                )
            tokens += batch.num_tokens
            sequences += 1
            groups += len(batch.group_keys)
            completions += len(batch.sample_paths)
            # Unfolded, every completion would carry its whole path: the prompt, then itself.
            unfolded += sum(batch.node_lengths[node] for path in batch.sample_paths for node in path)
        print(
            f"\n{groups} groups ({completions} completions) in {sequences} sequences of at most {args.seq_length} "
            f"tokens: fill {100 * tokens / (sequences * args.seq_length):.1f}%, against "
            f"{100 * tokens / (groups * args.seq_length):.1f}% with one group per sequence"
        )
        print(
            f"{tokens:,} folded tokens instead of {unfolded:,} with the prompt before every completion "
            f"({100 * (unfolded - tokens) / unfolded:.1f}% saved)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
