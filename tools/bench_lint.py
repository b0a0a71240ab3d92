"""`shardprep verify --load` against `energon lint` on the text dataset (`tools.bench_datasets`), in one
run: wall time, CPU, peak memory and the ratio. Both load every sample as a `TextSample` whose text is the
JSON part's `text` field, on the same number of worker processes.

    python -m tools.bench_lint --text-samples 20000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

from tools import bench_datasets
from tools.bench_prepare import energon_executable
from tools.measure import measure

REPO = Path(__file__).resolve().parents[1]
FIELD_MAP = '{"text": "json[text]"}'


def linted_copy(dataset: bench_datasets.Dataset, root: Path) -> Path:
    """Hard links to the dataset's shards in a folder of their own, prepared as TextSample (the cached
    dataset itself is left to the other benchmarks, which prepare it their own way)."""
    folder = root / f"{dataset.name}-lint"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for shard in dataset.shard_paths():
        try:
            os.link(shard, folder / shard.name)
        except OSError:
            shutil.copyfile(shard, folder / shard.name)
    flags = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress", "--sample-type", "TextSample"]
    prepared, _ = measure(
        [sys.executable, "-m", "prep", "prepare", str(folder), *flags, "--field-map", FIELD_MAP], cwd=REPO
    )
    if prepared.returncode != 0:
        raise SystemExit(f"shardprep prepare {folder} failed")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=bench_datasets.DEFAULT_ROOT, help="dataset cache folder")
    parser.add_argument("--text-samples", type=int, default=200_000)
    parser.add_argument("--text-shards", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool; the median wall is reported")
    parser.add_argument("--num-workers", type=int, default=os.cpu_count() or 1, help="for both tools")
    args = parser.parse_args(argv)

    dataset = bench_datasets.ensure_text_dataset(args.out, args.text_samples, args.text_shards)
    folder = linted_copy(dataset, args.out)
    workers = str(args.num_workers)
    commands = {
        "energon lint": [energon_executable(), "lint", str(folder), "--parallel", workers],
        "verify --load": [
            *(sys.executable, "-m", "prep", "verify", str(folder)),
            *("--load", "--no-progress", "--num-workers", workers),
        ],
    }
    print(f"{dataset.samples} JSON samples in {dataset.shards} shards, {args.num_workers} workers each")
    results = {}
    for tool, command in commands.items():
        runs = []
        for _ in range(args.repeat):
            measurement, stderr = measure(command, cwd=REPO)
            if measurement.returncode != 0:
                print(f"{tool} failed:\n{stderr.decode(errors='replace')[-2000:]}")
                return 1
            runs.append(measurement)
        # Times are the median of the runs, memory the largest of them (as in tools.bench_prepare).
        results[tool] = statistics.median(run.wall_seconds for run in runs)
        print(
            f"{tool:>13}: {results[tool]:8.2f} s wall,"
            f" {statistics.median(run.user_seconds for run in runs):8.2f} s user,"
            f" peak tree PSS {max(run.peak_tree_pss_mb for run in runs):7.1f} MB"
        )
    ratio = results["energon lint"] / results["verify --load"]
    print(f"verify --load is {ratio:.1f}x faster than energon lint (wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
