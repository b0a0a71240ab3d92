"""JSONL -> WebDataset shards -> energon loader with the packing task encoder -> packed batches and fill.

Trains nothing: it runs the whole data path once and prints what a training step would receive.

    python examples/packing/run.py                 # work folder in a temporary directory
    python examples/packing/run.py --keep out/     # keep the JSONL, tokenizer and shards in out/
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from cookers.energon_packing import PackingTaskEncoder  # noqa: E402
from cookers.tokenizer import load_tokenizer  # noqa: E402
from tools.text_corpus import documents  # noqa: E402
from tools.train_tokenizer import texts_of, train_tokenizer  # noqa: E402


def write_jsonl(path: Path, count: int) -> None:
    with path.open("w") as out:
        for text in documents(count, seed=7, median_words=80, sigma=1.0):
            out.write(json.dumps({"text": text}) + "\n")


def jsonl_to_shards(jsonl: Path, folder: Path, per_shard: int) -> int:
    """Write each JSONL line as one sample's `json` part, then index the shards for energon."""
    import webdataset as wds

    folder.mkdir(parents=True)
    count = 0
    writer = None
    with jsonl.open() as lines:
        for count, line in enumerate(lines):
            if count % per_shard == 0:
                if writer is not None:
                    writer.close()
                writer = wds.TarWriter(str(folder / f"shard-{count // per_shard:05d}.tar"))
            writer.write({"__key__": f"doc{count:07d}", "json": line.strip().encode()})
    if writer is not None:
        writer.close()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "prep",
            "prepare",
            str(folder),
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--crude",
            "--no-progress",
        ],
        cwd=REPO,
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return count + 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--buffer", type=int, default=256, help="energon packing buffer (documents)")
    parser.add_argument("--algorithm", default="bfd", choices=("bfd", "ffd", "next_fit", "concat"))
    parser.add_argument("--batch-size", type=int, default=2, help="packs per batch")
    args = parser.parse_args(argv)

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
    with tempfile.TemporaryDirectory() as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        jsonl = work / "docs.jsonl"
        write_jsonl(jsonl, args.documents)
        tokenizer_file = work / "tokenizer.json"
        train_tokenizer(texts_of([jsonl]), vocab_size=2000).save(str(tokenizer_file))
        tokenizer = load_tokenizer(tokenizer_file, add_bos=True, add_eos=True)
        shards = work / "shards"
        if shards.exists():
            import shutil

            shutil.rmtree(shards)
        samples = jsonl_to_shards(jsonl, shards, per_shard=500)
        print(f"{samples} documents -> {len(list(shards.glob('*.tar')))} shards in {shards}")

        encoder = PackingTaskEncoder(
            tokenizer, args.seq_length, algorithm=args.algorithm, overlong="chunk", pad_to_multiple_of=16
        )
        dataset = get_train_dataset(
            shards,
            worker_config=WorkerConfig(rank=0, world_size=1, num_workers=1),
            batch_size=args.batch_size,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            packing_buffer_size=args.buffer,
            task_encoder=encoder,
            repeat=False,
        )
        tokens = packs = batches = 0
        for batch in get_loader(dataset):
            if batches < 3:
                print(
                    f"\nbatch {batches}: input_ids {tuple(batch.input_ids.shape)}, {batch.num_packs} packs, "
                    f"{batch.cu_seq_lens_q.numel() - 1} segments, max_length_q {batch.max_length_q}"
                )
                print(f"  cu_seq_lens_q[:8] = {batch.cu_seq_lens_q[:8].tolist()}")
                print(f"  position_ids[0, :8] = {batch.position_ids[0, :8].tolist()}")
                print(f"  labels[0, :8] = {batch.labels[0, :8].tolist()}")
                print(
                    f"  documents of pack 0: {batch.document_keys[0][:6]}{' ...' if len(batch.document_keys[0]) > 6 else ''}"
                )
                print(f"  text of its first document: {tokenizer.decode(batch.input_ids[0, :24])!r} ...")
            tokens += batch.num_tokens
            packs += batch.num_packs
            batches += 1
        print(
            f"\n{batches} batches, {packs} packs of {args.seq_length} tokens, {tokens} real tokens: "
            f"fill {100 * tokens / (packs * args.seq_length):.2f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
