"""Benchmark `shardprep prepare --engine ray` against the local engine, on one machine, on the same shards.

The dataset is ``--shards`` shards of tiny one-part samples (tools.bench_datasets' scale dataset, made once
and cached). Each way of preparing runs ``--repeat`` times, round-robin, as a child process:

- ``single``: ``--engine local --num-workers 1``, one process;
- ``local``: ``--engine local``, worker processes on every core (the default);
- ``ray``: ``--engine ray``, which starts its own local Ray instance for the run (its start-up included);
- ``ray-running``: ``--engine ray --ray-address ADDR`` against a local Ray instance this benchmark started
  beforehand, as on a cluster that is already up (no start-up in the figure);
- ``energon`` (with ``--energon``): ``energon prepare`` with its default workers.

With ``--write-lines N`` the same four ways also run ``shardprep write`` of a plain JSONL file of N lines
(the one input ``write --engine ray`` takes so far) into one folder, and every file written (but
``index.uuid``) must be the same bytes each time.

Printed: the median wall time, samples/s at that median, and the ratio to ``local``. After each shardprep
run its output (every ``.tar.idx``, the sqlite rows, ``.info.json``, ``split.yaml``) is hashed and must equal
the first run's: a fast wrong answer is worthless. On one machine Ray can only show its overhead over
worker processes, not the scale-out it is for; the figure that matters there is how close it stays.

    python -m tools.bench_scale                                  # 2,000 shards x 5,000 samples (10M)
    python -m tools.bench_scale --shards 400 --samples-per-shard 500 --repeat 3
    python -m tools.bench_scale --shards 400 --samples-per-shard 500 --write-lines 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tools import bench_datasets
from tools.bench_prepare import PREPARE_FLAGS

REPO = Path(__file__).resolve().parents[1]
FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--force-overwrite", "--no-progress", "--crude"]
WRITE_FLAGS = ["--maxcount", "5000", "--overwrite", "--no-progress"]
#: The issue's target: Ray local within this fraction of the local engine's wall time on one machine.
TARGET_RAY_OVERHEAD = 0.15


def output_hash(root: Path) -> str:
    """One hash over what a prepare wrote that energon reads (index.uuid, fresh each run, left out)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.tar.idx")):
        digest.update(path.name.encode() + path.read_bytes())
    meta = root / ".nv-meta"
    for name in (".info.json", "split.yaml"):
        digest.update((meta / name).read_bytes())
    db = sqlite3.connect(meta / "index.sqlite")
    try:
        for table in ("samples", "sample_parts"):
            for row in db.execute(f"SELECT * FROM {table} ORDER BY 1, 2, 3"):
                digest.update(repr(row).encode())
    finally:
        db.close()
    return digest.hexdigest()


def files_hash(root: Path) -> str:
    """One hash over every file a write made (index.uuid, fresh each run, left out)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != "index.uuid":
            digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return digest.hexdigest()


def jsonl_file(folder: Path, lines: int) -> Path:
    """A plain JSONL file of short text records, made once."""
    path = folder / f"rows-{lines}.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        with open(partial, "w") as file:
            for number in range(lines):
                file.write(f'{{"n": {number}, "text": "sample {number} of the benchmark"}}\n')
        partial.rename(path)
    return path


def run(argv: list[str]) -> float:
    """Run one command to completion; its wall seconds (a failure stops the benchmark)."""
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{result.stdout}\n{result.stderr}")
    return elapsed


def timed(ways: dict[str, list[str]], repeat: int, output: Callable[[], str]) -> dict[str, list[float]]:
    """Each way's wall times over `repeat` round-robin runs; every run's `output()` must be the first's."""
    times: dict[str, list[float]] = {way: [] for way in ways}
    expected = None
    for _ in range(repeat):
        for way, command in ways.items():
            times[way].append(run(command))
            if way != "energon":
                found = output()
                expected = expected or found
                if found != expected:
                    sys.exit(f"{way} wrote different bytes than the first run: the figures are void")
    return times


def print_table(title: str, samples: int, times: dict[str, list[float]]) -> None:
    print(title)
    local = statistics.median(times["local"])
    for way, walls in times.items():
        wall = statistics.median(walls)
        rate = samples / wall
        print(f"  {way:12s} {wall:8.2f} s  {rate:12,.0f} samples/s  {wall / local:5.2f} x local")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--samples-per-shard", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--energon", action="store_true", help="also time energon prepare (slow)")
    parser.add_argument(
        "--write-lines", type=int, default=0, help="also time write of a JSONL file of N lines"
    )
    parser.add_argument("--cache", type=Path, default=bench_datasets.DEFAULT_ROOT)
    args = parser.parse_args(argv)

    dataset = bench_datasets.ensure_scale_dataset(
        args.cache, args.samples_per_shard * args.shards, args.shards
    )
    root = str(dataset.path)
    import ray  # only to hold a running local instance for "ray-running"

    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        engines = {
            "single": ["--num-workers", "1"],
            "local": [],
            "ray": ["--engine", "ray"],
            "ray-running": ["--engine", "ray", "--ray-address", address],
        }
        prepare = [sys.executable, "-m", "prep", "prepare", root, *FLAGS]
        ways = {way: [*prepare, *flags] for way, flags in engines.items()}
        energon = shutil.which("energon", path=os.path.dirname(sys.executable))
        if args.energon and energon:
            ways["energon"] = [energon, "prepare", root, *PREPARE_FLAGS]
        times = timed(ways, args.repeat, lambda: output_hash(dataset.path))
        write_times = {}
        if args.write_lines:
            rows, out = jsonl_file(args.cache, args.write_lines), args.cache / "bench-scale-write"
            write = [sys.executable, "-m", "prep", "write", str(rows), str(out), *WRITE_FLAGS]
            write_ways = {way: [*write, *flags] for way, flags in engines.items()}
            write_times = timed(write_ways, args.repeat, lambda: files_hash(out))
    finally:
        ray.shutdown()

    print(bench_datasets.describe(dataset))
    print_table(f"prepare, {os.cpu_count()} CPUs, median of {args.repeat} runs:", dataset.samples, times)
    if write_times:
        print_table(
            f"write of {args.write_lines} JSONL lines, median of {args.repeat} runs:",
            args.write_lines,
            write_times,
        )
    ray_ratio = statistics.median(times["ray"]) / statistics.median(times["local"])
    mark = "PASS" if ray_ratio <= 1 + TARGET_RAY_OVERHEAD else "MISS"
    print(f"prepare ray / local wall: {ray_ratio:.2f} (target <= {1 + TARGET_RAY_OVERHEAD:.2f}) {mark}")
    print("Every run of a command wrote the same bytes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
