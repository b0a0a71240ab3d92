"""Benchmark `shardprep prepare` against `energon prepare` and GNU `tar -tf`, side by side, on the same shards.

For each dataset (see tools.bench_datasets) every tool runs ``--repeat`` times, round-robin, each run as a
child of this process (measured by tools.measure) right after the shards were read into the page cache:

- ``energon prepare DIR --non-interactive --split-ratio 8,1,1 --force-overwrite --no-progress
  --sample-type CrudeWebdataset`` with energon's default ``--num-workers``;
- ``python -m prep prepare DIR`` with the same flags and shardprep's default ``--num-workers``;
- GNU ``tar -tf`` over every shard, one after another, output to /dev/null: the floor of reading the headers.

Printed per tool: the median wall time, samples/s at that median, the largest peak memory over the runs
(tree RSS sum, tree PSS sum, largest single process), and the ratios with the targets beside them, marked
PASS or MISS from the measured numbers. After every shardprep run its index is compared with the one energon
wrote just before (sqlite row counts and row contents, .tar.idx bytes, .info.json, split.yaml): a fast wrong
answer is worthless. The machine may be shared: each run also records how many cores other programs kept
busy meanwhile ('other load'), a warning marks contended figures, and ``--quiet-wait`` waits for calm.

``--scale`` prepares the 10-million-sample dataset and a tenth of it with shardprep (energon only with
``--scale-energon``), to show the time and that memory stays flat as the dataset grows.
``--profile`` runs shardprep under cProfile with one worker on the text dataset and prints the top entries.
``--media`` runs ``tools.bench_media``: ``prepare --media-metadata-by-extension`` against energon with the
same flag on the image dataset (``--image-samples``) and on WAV/FLAC clips (``--audio-samples``).

    python -m tools.bench_prepare                 # text + image, 3 runs each
    python -m tools.bench_prepare --scale --datasets none
    python -m tools.bench_prepare --media --datasets none --image-samples 20000
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tools import bench_datasets
from tools.bench_datasets import Dataset
from tools.measure import Measurement, gnu_time, machine_busy_seconds, measure

REPO = Path(__file__).resolve().parents[1]
PREPARE_FLAGS = [
    "--non-interactive",
    "--split-ratio",
    "8,1,1",
    "--force-overwrite",
    "--no-progress",
    "--sample-type",
    "CrudeWebdataset",
]
META = ".nv-meta"

# Targets from issue 2, on a 2-core machine.
TARGET_SPEEDUP = 10.0  # energon wall / shardprep wall, at least
TARGET_TAR_RATIO = 2.5  # shardprep wall / tar -tf wall, at most
TARGET_PEAK_RSS_MB = 200.0  # shardprep peak tree RSS, below
TARGET_SCALE_SECONDS = 180.0  # scale run wall, below
TARGET_FLAT_RATIO = 1.25  # peak RSS at the big scale size / at the small one, at most
CONTENTION_CORES = 0.25  # other load above this many cores makes a run not a quiet-machine figure


def other_load(seconds: float = 1.0) -> float:
    """Cores the machine keeps busy right now (over ``seconds``), this process being idle meanwhile."""
    before = machine_busy_seconds()
    time.sleep(seconds)
    return (machine_busy_seconds() - before) / seconds


def wait_until_quiet(limit: float) -> float:
    """Wait up to ``limit`` seconds for other programs to leave the CPUs alone; return the last load seen."""
    if limit <= 0:
        return 0.0
    deadline = time.monotonic() + limit
    load = other_load(0.5)
    while load > CONTENTION_CORES and time.monotonic() < deadline:
        time.sleep(2)
        load = other_load(0.5)
    return load


def energon_executable() -> str:
    """The `energon` console script next to this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "energon"
    found = str(beside) if beside.exists() else shutil.which("energon")
    if found is None:
        raise SystemExit("energon is not installed (pip install megatron-energon==7.4.1)")
    return found


def energon_command(path: Path, extra: list[str] | None = None) -> list[str]:
    return [energon_executable(), "prepare", str(path), *PREPARE_FLAGS, *(extra or [])]


def shardprep_command(path: Path, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "prep", "prepare", str(path), *PREPARE_FLAGS, *(extra or [])]


def tar_command(dataset: Dataset) -> list[str]:
    """GNU tar -tf over every shard in turn, as one measured process tree (sh plus one tar at a time)."""
    return ["sh", "-c", 'for shard in "$@"; do tar -tf "$shard"; done >/dev/null', "sh"] + [
        str(path) for path in dataset.shard_paths()
    ]


def default_num_workers(module: str, command: str) -> str:
    """The --num-workers default a click command declares, read from the command itself in a child process."""
    code = (
        f"import os; from {module} import {command} as c; "
        "p = [p for p in c.params if p.name == 'num_workers'][0]; "
        "d = p.default() if callable(p.default) else p.default; "
        "print(d if d is not None else f'None (CPU count, {os.cpu_count()})')"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    return result.stdout.strip() or f"unknown ({result.stderr.strip().splitlines()[-1:]})"


def warm_cache(dataset: Dataset) -> None:
    """Read every shard once so all tools start from the same warm page cache."""
    read_into_cache(dataset.shard_paths())


def read_into_cache(paths: Iterable[Path]) -> None:
    """Read the files `paths` once (cat > /dev/null), so what reads them next finds them in memory."""
    subprocess.run(["cat", *map(str, paths)], stdout=subprocess.DEVNULL, check=True)


@dataclass
class IndexSummary:
    """What a prepare run wrote, reduced to comparable values."""

    samples_rows: int
    parts_rows: int
    rows_digest: str  # "" when not computed
    tar_idx_digest: str
    info: dict
    split: dict


def _digest_rows(connection: sqlite3.Connection, query: str) -> str:
    digest = hashlib.sha256()
    for row in connection.execute(query):
        digest.update(repr(row).encode())
    return digest.hexdigest()


def summarise_index(dataset: Dataset, with_rows: bool = True) -> IndexSummary:
    """Read the .nv-meta and .tar.idx files a prepare run left in the dataset folder."""
    connection = sqlite3.connect(f"file:{dataset.path / META / 'index.sqlite'}?mode=ro", uri=True)
    try:
        samples_rows = connection.execute("SELECT count(*) FROM samples").fetchone()[0]
        parts_rows = connection.execute("SELECT count(*) FROM sample_parts").fetchone()[0]
        rows_digest = ""
        if with_rows:
            rows_digest = _digest_rows(
                connection,
                "SELECT tar_file_id, sample_key, sample_index, byte_offset, byte_size FROM samples "
                "ORDER BY tar_file_id, sample_index",
            ) + _digest_rows(
                connection,
                "SELECT tar_file_id, sample_index, part_name, content_byte_offset, content_byte_size "
                "FROM sample_parts ORDER BY tar_file_id, sample_index, content_byte_offset, part_name",
            )
    finally:
        connection.close()
    tar_idx = hashlib.sha256()
    for shard in dataset.shard_paths():
        tar_idx.update(Path(f"{shard}.idx").read_bytes())
    info = json.loads((dataset.path / META / ".info.json").read_text())
    split = yaml.safe_load((dataset.path / META / "split.yaml").read_text())
    return IndexSummary(samples_rows, parts_rows, rows_digest, tar_idx.hexdigest(), info, split)


def compare(ours: IndexSummary, energons: IndexSummary | None, dataset: Dataset) -> tuple[bool, str]:
    """Whether shardprep's index agrees with energon's (or, without energon, with the generator's counts)."""
    checks: list[tuple[str, bool]] = []
    expected_samples = dataset.samples
    expected_parts = dataset.samples * dataset.parts_per_sample
    checks.append(
        (
            f"samples rows {ours.samples_rows} (generated {expected_samples})",
            ours.samples_rows == expected_samples,
        )
    )
    checks.append(
        (
            f"sample_parts rows {ours.parts_rows} (generated {expected_parts})",
            ours.parts_rows == expected_parts,
        )
    )
    info_total = sum(ours.info.get("shard_counts", {}).values())
    checks.append((f".info.json total {info_total}", info_total == expected_samples))
    if energons is not None:
        checks.append(
            (f"energon samples rows {energons.samples_rows}", ours.samples_rows == energons.samples_rows)
        )
        checks.append(
            (f"energon sample_parts rows {energons.parts_rows}", ours.parts_rows == energons.parts_rows)
        )
        if ours.rows_digest and energons.rows_digest:
            checks.append(("sqlite row contents", ours.rows_digest == energons.rows_digest))
        checks.append((".tar.idx bytes", ours.tar_idx_digest == energons.tar_idx_digest))
        checks.append((".info.json", ours.info == energons.info))
        checks.append(("split.yaml", ours.split == energons.split))
    text = ", ".join(f"{label} {'==' if ok else '!='}" for label, ok in checks)
    failures = [label for label, ok in checks if not ok]
    verdict = "OK" if not failures else "MISMATCH: " + "; ".join(failures)
    return not failures, f"{verdict}  [{text}]"


@dataclass
class ToolRuns:
    """Repeated measurements of one tool on one dataset."""

    name: str
    runs: list[Measurement] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.failures

    @property
    def wall(self) -> float:
        return statistics.median(run.wall_seconds for run in self.runs)

    @property
    def cpu(self) -> float:
        return statistics.median(run.user_seconds + run.system_seconds for run in self.runs)

    @property
    def peak_rss_mb(self) -> float:
        return max(run.peak_tree_rss_mb for run in self.runs)

    @property
    def peak_pss_mb(self) -> float:
        return max(run.peak_tree_pss_mb for run in self.runs)

    @property
    def peak_anon_mb(self) -> float:
        return max(run.peak_tree_anon_mb for run in self.runs)

    @property
    def max_process_mb(self) -> float:
        return max(run.max_process_rss_mb for run in self.runs)

    @property
    def other_cores(self) -> float:
        return statistics.median(run.other_cores for run in self.runs)

    @property
    def processes(self) -> int:
        return max(run.peak_process_count for run in self.runs)


def run_tool(runs: ToolRuns, argv: list[str], interval: float, quiet_wait: float = 0.0) -> bool:
    """Measure one run (after waiting up to ``quiet_wait`` s for a quiet machine) and record it; a failing
    run is recorded with the tail of its stderr."""
    wait_until_quiet(quiet_wait)
    measurement, error_output = measure(argv, cwd=REPO, interval=interval)
    if measurement.returncode != 0:
        tail = error_output.decode(errors="replace").strip().splitlines()[-5:]
        runs.failures.append(f"exit {measurement.returncode}: " + " | ".join(tail))
        return False
    runs.runs.append(measurement)
    return True


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def print_table(dataset: Dataset, tools: list[ToolRuns]) -> None:
    header = (
        f"{'tool':<10} {'wall s':>8} {'cpu s':>7} {'samples/s':>11} {'peak RSS MB':>12} {'PSS MB':>8} {'anon MB':>8} "
        f"{'1 proc MB':>10} {'procs':>6} {'runs':>5} {'other load':>10}"
    )
    print(header)
    print("-" * len(header))
    for tool in tools:
        if not tool.runs:
            print(f"{tool.name:<10} FAILED: {tool.failures[0] if tool.failures else 'not run'}")
            continue
        print(
            f"{tool.name:<10} {tool.wall:8.3f} {tool.cpu:7.2f} {dataset.samples / tool.wall:11,.0f} "
            f"{tool.peak_rss_mb:12.1f} {tool.peak_pss_mb:8.1f} {tool.peak_anon_mb:8.1f} {tool.max_process_mb:10.1f} {tool.processes:6d} "
            f"{len(tool.runs):5d} {tool.other_cores:10.2f}"
        )
        for failure in tool.failures:
            print(f"{'':<10} a run failed: {failure}")
    busiest = max((tool.other_cores for tool in tools if tool.runs), default=0.0)
    if busiest > CONTENTION_CORES:
        print(
            f"WARNING: other programs kept {busiest:.2f} cores busy during some of these runs (median per tool); "
            "these are not quiet-machine figures."
        )


def bench_dataset(
    dataset: Dataset, tool_names: list[str], repeat: int, interval: float, quiet_wait: float = 0.0
) -> dict:
    """Run the chosen tools ``repeat`` times on a warm dataset; print the table, ratios, targets and checks."""
    print()
    print(f"== {bench_datasets.describe(dataset)}")
    warm_cache(dataset)
    tools = {name: ToolRuns(name) for name in tool_names}
    commands = {
        "energon": energon_command(dataset.path),
        "shardprep": shardprep_command(dataset.path),
        "tar -tf": tar_command(dataset),
    }
    checks: list[str] = []
    all_equal = True
    energon_index: IndexSummary | None = None
    for _ in range(repeat):
        for name in tool_names:
            warm_cache(dataset)  # again before every run: other programs may have pushed it out meanwhile
            succeeded = run_tool(tools[name], commands[name], interval, quiet_wait)
            if not succeeded:
                continue
            if name == "energon":
                energon_index = summarise_index(dataset)
            elif name == "shardprep":
                equal, text = compare(summarise_index(dataset), energon_index, dataset)
                all_equal = all_equal and equal
                checks.append(text)
    print_table(dataset, list(tools.values()))
    result: dict = {"dataset": dataset.name, "samples": dataset.samples}
    for tool in tools.values():
        if tool.runs:
            result[tool.name] = {
                "wall": tool.wall,
                "peak_rss_mb": tool.peak_rss_mb,
                "pss_mb": tool.peak_pss_mb,
            }
    ours = tools.get("shardprep")
    if ours is not None and ours.ok:
        energon = tools.get("energon")
        tar = tools.get("tar -tf")
        if energon is not None and energon.ok:
            speedup = energon.wall / ours.wall
            result["speedup"] = speedup
            print(
                f"energon / shardprep wall   = {speedup:7.2f}x   target >= {TARGET_SPEEDUP:g}x   "
                f"{verdict(speedup >= TARGET_SPEEDUP)}"
            )
        if tar is not None and tar.ok:
            tar_ratio = ours.wall / tar.wall
            result["tar_ratio"] = tar_ratio
            print(
                f"shardprep / tar -tf wall   = {tar_ratio:7.2f}x   target <= {TARGET_TAR_RATIO:g}x  "
                f"{verdict(tar_ratio <= TARGET_TAR_RATIO)}"
            )
        print(
            f"shardprep peak tree RSS    = {ours.peak_rss_mb:7.1f} MB target < {TARGET_PEAK_RSS_MB:g} MB "
            f"{verdict(ours.peak_rss_mb < TARGET_PEAK_RSS_MB)}"
        )
    for number, text in enumerate(checks, 1):
        print(f"check run {number}: shardprep index vs {'energon' if energon_index else 'generator'}: {text}")
    result["index_equal"] = all_equal
    return result


def bench_scale(
    big: Dataset, small: Dataset, with_energon: bool, repeat: int, interval: float, quiet_wait: float = 0.0
) -> dict:
    """shardprep on a small and a big scale dataset: wall time, and peak memory at both sizes."""
    print()
    print(f"== scale: {bench_datasets.describe(small)}")
    print(f"          {bench_datasets.describe(big)}")
    warm_cache(big)  # the small dataset's shards are hard links to the big one's first shards
    rows = []
    result: dict = {}
    for dataset in (small, big):
        tools = [ToolRuns("shardprep")] + ([ToolRuns("energon")] if with_energon else [])
        checks = []
        for _ in range(repeat):
            energon_index = None
            for tool in reversed(tools):  # energon first, so shardprep's index is compared with it
                command = shardprep_command if tool.name == "shardprep" else energon_command
                warm_cache(dataset)
                if not run_tool(tool, command(dataset.path), interval, quiet_wait):
                    continue
                if tool.name == "energon":
                    energon_index = summarise_index(dataset, with_rows=False)
                else:
                    equal, text = compare(summarise_index(dataset, with_rows=False), energon_index, dataset)
                    checks.append((equal, text))
        rows.append((dataset, tools, checks))
    for dataset, tools, checks in rows:
        print(f"-- {dataset.name}: {dataset.samples:,} samples in {dataset.shards} shards")
        print_table(dataset, tools)
        for number, (_, text) in enumerate(checks, 1):
            print(f"check run {number}: {text}")
        result[dataset.name] = {
            tool.name: {"wall": tool.wall, "peak_rss_mb": tool.peak_rss_mb} for tool in tools if tool.runs
        }
    (_, small_tools, _), (_, big_tools, big_checks) = rows
    small_ours, big_ours = small_tools[0], big_tools[0]
    if small_ours.ok and big_ours.ok:
        growth = big.samples / small.samples
        flat = big_ours.peak_rss_mb / small_ours.peak_rss_mb
        print(
            f"scale wall ({big.samples:,} samples)   = {big_ours.wall:7.1f} s   target < {TARGET_SCALE_SECONDS:g} s   "
            f"{verdict(big_ours.wall < TARGET_SCALE_SECONDS)}"
        )
        print(
            f"peak RSS {big.samples:,} / {small.samples:,} = {big_ours.peak_rss_mb:.1f} / {small_ours.peak_rss_mb:.1f} MB "
            f"= {flat:.2f}x for {growth:g}x the samples   target <= {TARGET_FLAT_RATIO:g}x   "
            f"{verdict(flat <= TARGET_FLAT_RATIO)}"
        )
        print(
            f"scale peak tree RSS        = {big_ours.peak_rss_mb:7.1f} MB target < {TARGET_PEAK_RSS_MB:g} MB "
            f"{verdict(big_ours.peak_rss_mb < TARGET_PEAK_RSS_MB)}"
        )
        if with_energon and len(big_tools) > 1 and big_tools[1].ok:
            print(f"energon / shardprep wall   = {big_tools[1].wall / big_ours.wall:7.2f}x")
        result["flat_ratio"] = flat
        result["index_equal"] = all(equal for equal, _ in big_checks)
    return result


def profile(dataset: Dataset, top: int) -> None:
    """shardprep under cProfile with one worker; prints the top entries by cumulative time."""
    print()
    print(f"== profile: shardprep prepare --num-workers 1 on {dataset.name}, top {top} by cumulative time")
    warm_cache(dataset)
    argv = [sys.executable, "-m", "cProfile", "-s", "cumtime", "-m", "prep", "prepare", str(dataset.path)]
    result = subprocess.run(
        [*argv, *PREPARE_FLAGS, "--num-workers", "1"], cwd=REPO, capture_output=True, text=True
    )
    lines = result.stdout.splitlines()
    start = next((number for number, line in enumerate(lines) if "ncalls" in line), None)
    if result.returncode != 0 or start is None:
        print(f"profile run failed (exit {result.returncode}): {result.stderr.strip()[-500:]}")
        return
    for line in lines[max(0, start - 3) : start + 1 + top]:
        print(line)


def print_environment(tool_names: list[str], interval: float) -> None:
    tar_version = subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    print("shardprep prepare benchmark")
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}")
    if "energon" in tool_names:
        print(
            f"energon prepare: megatron-energon {importlib.metadata.version('megatron-energon')}, "
            f"--num-workers default {default_num_workers('megatron.energon.tools.prepare', 'command')}"
        )
    print(
        f"shardprep prepare: --num-workers default {default_num_workers('prep.prepare.cli', 'prepare_command')}"
    )
    if "tar -tf" in tool_names:
        print(f"floor: {' '.join(tar_version)} -tf, shards one after another, output to /dev/null")
    print(f"flags for both: {' '.join(PREPARE_FLAGS)}")
    launcher = gnu_time()
    print(
        f"memory: /proc sampled every {interval * 1000:g} ms over the whole process tree (sums of RSS, PSS, and "
        "anon = RSS without file-backed pages such as an mmap-ed shard); "
        f"'1 proc' = largest single process ru_maxrss{' via GNU time' if launcher else ' (includes fork from this process)'}; "
        "wall and cpu = median of runs, memory = largest of runs; "
        "'other load' = cores busy outside the measured tree during a run (contention)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_prepare",
        description="Time shardprep prepare against energon prepare and tar -tf on cached benchmark datasets.",
    )
    parser.add_argument("--out", type=Path, default=bench_datasets.DEFAULT_ROOT, help="dataset cache folder")
    parser.add_argument("--datasets", default="text,image", help="comma list of text,image, or 'none'")
    parser.add_argument(
        "--tools", default="energon,shardprep,tar", help="comma list of energon,shardprep,tar"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per tool; the median wall is reported")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="memory sampling period")
    parser.add_argument("--text-samples", type=int, default=200_000)
    parser.add_argument("--text-shards", type=int, default=10)
    parser.add_argument("--image-samples", type=int, default=100_000)
    parser.add_argument("--image-shards", type=int, default=20)
    parser.add_argument("--scale", action="store_true", help="also run the scale benchmark")
    parser.add_argument("--scale-samples", type=int, default=10_000_000)
    parser.add_argument("--scale-shards", type=int, default=100)
    parser.add_argument(
        "--scale-small-shards", type=int, default=None, help="default: a tenth of --scale-shards"
    )
    parser.add_argument("--scale-repeat", type=int, default=1)
    parser.add_argument(
        "--scale-energon", action="store_true", help="run energon on the scale datasets too (slow)"
    )
    parser.add_argument(
        "--media", action="store_true", help="also run the media benchmark (tools.bench_media)"
    )
    parser.add_argument("--audio-samples", type=int, default=4000, help="clips of the --media audio dataset")
    parser.add_argument(
        "--profile", action="store_true", help="profile shardprep (1 worker) on the text dataset"
    )
    parser.add_argument("--profile-top", type=int, default=30)
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each run, wait up to this many seconds for other programs to leave the CPUs idle",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # progress shows as it happens, also into a file

    tool_names = [
        {"tar": "tar -tf"}.get(name.strip(), name.strip()) for name in args.tools.split(",") if name.strip()
    ]
    unknown = set(tool_names) - {"energon", "shardprep", "tar -tf"}
    if unknown:
        parser.error(f"unknown tools: {', '.join(sorted(unknown))}")
    dataset_names = [] if args.datasets == "none" else [name.strip() for name in args.datasets.split(",")]
    interval = args.interval_ms / 1000
    print_environment(tool_names, interval)

    results = []
    for name in dataset_names:
        if name == "text":
            dataset = bench_datasets.ensure_text_dataset(args.out, args.text_samples, args.text_shards)
        elif name == "image":
            dataset = bench_datasets.ensure_image_dataset(args.out, args.image_samples, args.image_shards)
        else:
            parser.error(f"unknown dataset {name!r}")
        results.append(bench_dataset(dataset, tool_names, args.repeat, interval, args.quiet_wait))
    if args.scale:
        big = bench_datasets.ensure_scale_dataset(args.out, args.scale_samples, args.scale_shards)
        small = bench_datasets.ensure_scale_subset(
            big, args.scale_small_shards or max(1, big.shards // 10), args.out
        )
        results.append(
            bench_scale(big, small, args.scale_energon, args.scale_repeat, interval, args.quiet_wait)
        )
    if args.media:
        from tools import bench_media  # it imports this module

        results += bench_media.run(
            args.out,
            ["image", "audio"],
            image_samples=args.image_samples,
            image_shards=args.image_shards,
            audio_samples=args.audio_samples,
            audio_shards=8,
            repeat=1,
        )
    if args.profile:
        profile(
            bench_datasets.ensure_text_dataset(args.out, args.text_samples, args.text_shards),
            args.profile_top,
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if all(result.get("index_equal", True) for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
