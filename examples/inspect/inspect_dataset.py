"""Look inside a prepared dataset: info (with its plot), verify, preview, and a mount.

Builds a small image+caption dataset with webdataset's TarWriter in a temporary folder (or uses the
folder given as the first argument, which must already be prepared), prepares it with
`shardprep prepare`, then runs each inspection command the way a user would type it.

    python examples/inspect/inspect_dataset.py            # from the repository root
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def shardprep(*args: str) -> subprocess.CompletedProcess:
    print(f"\n$ shardprep {' '.join(args)}", flush=True)
    result = subprocess.run([sys.executable, "-m", "prep", *args], cwd=REPO, text=True, capture_output=True)
    print(result.stdout.rstrip())
    if result.stderr.strip():
        print(result.stderr.rstrip())
    return result


def build(folder: Path) -> None:
    import webdataset as wds
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for shard in range(10):
        with wds.TarWriter(str(folder / f"shard-{shard:03d}.tar")) as writer:
            for index in range(50):
                side = int(rng.integers(16, 96))
                image = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(
                    image, format="PNG"
                )
                words = " ".join(["word"] * int(rng.integers(3, 40)))
                writer.write(
                    {
                        "__key__": f"{shard:03d}_{index:04d}",
                        "png": image.getvalue(),
                        "txt": words.encode(),
                        "json": json.dumps({"shard": shard, "index": index, "side": side}).encode(),
                    }
                )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", nargs="?", type=Path, help="a prepared dataset (default: build one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        if args.dataset is not None:
            dataset = args.dataset.resolve()
        else:
            dataset = Path(temporary) / "captions"
            build(dataset)
            shardprep("prepare", str(dataset), "--non-interactive", "--split-ratio", "8,1,1", "--crude")
        plot = Path(temporary) / "sizes.png"
        shardprep("info", str(dataset), "--plot", str(plot))
        shardprep("verify", str(dataset))
        shardprep("preview", str(dataset), "-n", "2")
        mountpoint = Path(temporary) / "mnt"
        if shardprep("mount", str(dataset), str(mountpoint), "--view", "sample").returncode == 0:
            first = sorted(os.listdir(mountpoint))[0]
            print(f"$ ls {mountpoint}/{first}\n" + "  ".join(sorted(os.listdir(mountpoint / first))))
            shardprep("umount", str(mountpoint))
        if plot.exists():
            print(
                f"\n(the plot was written to {plot}, removed on exit; `shardprep info DATASET --plot FILE` keeps one)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
