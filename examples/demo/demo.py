"""shardprep in one minute: write shards with webdataset, prepare them with shardprep, load them with energon.

python examples/demo/demo.py [--out DIR]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

CAPTIONS = ["a red bicycle", "two cats on a sofa", "a lighthouse at dusk", "fresh bread", "a snowy road"]


def write_shards(root: Path, samples: int) -> None:
    """A small caption dataset in 4 shards, written the way most users write them: webdataset's ShardWriter."""
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=samples // 4, verbose=0) as writer:
        for i in range(samples):
            caption = CAPTIONS[i % len(CAPTIONS)]
            writer.write(
                {
                    "__key__": f"{i:06d}",
                    "txt": f"{caption} #{i}",
                    "json": {"id": i, "words": len(caption.split())},
                }
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="dataset folder to keep (default: a temporary one, removed)")
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    if args.out is not None:
        if args.out.exists() and any(args.out.iterdir()):
            parser.error(f"--out {args.out} is not empty; give a new or empty folder for the demo's dataset")
        run(args.out, args.samples)
        return
    with tempfile.TemporaryDirectory(prefix="shardprep-demo-") as scratch:
        run(Path(scratch) / "captions", args.samples)


def run(root: Path, samples: int) -> None:
    print(f"1. Writing {samples} samples with webdataset's ShardWriter into {root}")
    write_shards(root, samples)

    print("2. Preparing them with shardprep (the same flags as energon prepare)")
    command = [
        sys.executable,
        "-m",
        "prep",
        "prepare",
        str(root),
        "--non-interactive",
        "--split-ratio",
        "8,1,1",
        "--sample-type",
        "TextSample",
        "--field-map",
        '{"text": "txt"}',
        "--no-progress",
    ]
    print("   $ shardprep " + shlex.join(command[3:]))
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    for name in sorted(p.name for p in (root / ".nv-meta").iterdir()):
        print(f"   .nv-meta/{name}")

    print("3. Loading through energon's get_train_dataset + get_loader")
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # torch's notice on CPU-only machines
    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    dataset = get_train_dataset(
        root,
        split_part="train",
        worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0),
        batch_size=4,
        shuffle_buffer_size=16,
        max_samples_per_sequence=8,
    )
    loader = iter(get_loader(dataset))
    for step in range(3):
        batch = next(loader)
        print(f"   batch {step}: keys={batch.__key__}")
        print(f"            text={batch.text}")
    print("Done.")


if __name__ == "__main__":
    main()
