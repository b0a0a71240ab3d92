"""Benchmark `shardprep prepare` on many shards: one process, worker processes, Ray; energon beside; a projection.

The dataset is ``--shards`` shards of tiny one-part samples (tools.bench_datasets' scale dataset, made once
and cached; the issue's run is 2,000 shards x 5,000 samples, 10M samples). Each way of preparing runs
``--repeat`` times, round-robin, as a child process measured by tools.measure (wall time, peak memory of
its whole process tree):

- ``single``: ``--engine local --num-workers 1``, one process;
- ``local``: ``--engine local``, worker processes on every core (the default; "multiprocessing");
- ``ray``: ``--engine ray``, which starts its own local Ray instance for the run (its start-up included);
- ``ray-running``: ``--engine ray --ray-address ADDR`` against a local Ray instance this benchmark starts
  afterwards, as on a cluster that is already up (no start-up in the figure). It runs last, in a phase of
  its own, and its memory is not measured: the instance is this benchmark's child and would count in
  every other figure.
- ``energon``: ``energon prepare`` with its default workers. It is slow, so by default it runs on the
  first ``--energon-shards`` shards only and its time is extrapolated to the whole dataset (marked
  "subset" in the table) through a second run, ``energon-small``, on a tenth of those shards: the line
  through the two counts energon's fixed cost (start-up) once, as the whole dataset's run would;
  ``--energon full`` runs it on everything, ``--energon skip`` leaves it out.

With ``--write-lines N`` the same ways (but energon) also run ``shardprep write`` of a plain JSONL file of
N lines into one folder, and every file written (but ``index.uuid``) must be the same bytes each time.

Printed: the median wall time, samples/s at that median, peak tree RSS, and the time per sample against
``local``'s (a way run on a subset, energon by default, is set against ``local`` by its rate); the
Ray target of issue 14 (Ray local within 15% of multiprocessing); and a projection of the issue's
244M-sample / 4,000-shard case on 1, 8 and 64 workers from the measured costs (`project`, whose docstring
states the model). After each shardprep run its output (every ``.tar.idx``, the sqlite rows,
``.info.json``, ``split.yaml``) is hashed and must equal the first run's, and energon's index (of the
shards it prepared) must equal shardprep's of the same shards: a fast wrong answer is worthless.
On one machine Ray can only show its overhead over worker processes, not the scale-out it is for.
The machine may be shared: the table says how many cores other programs kept busy during each way.

``--s3`` runs the object-storage part, which lives in ``tools.bench_s3`` (another module, written
separately): this tool only hands it the dataset (see `run_s3`).

    python -m tools.bench_scale                                  # 2,000 shards x 5,000 samples (10M)
    python -m tools.bench_scale --repeat 1 --energon-shards 100
    python -m tools.bench_scale --shards 400 --samples-per-shard 500 --write-lines 1000000
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools import bench_datasets, bench_prepare
from tools.bench_prepare import PREPARE_FLAGS, energon_executable
from tools.measure import Measurement, measure

REPO = Path(__file__).resolve().parents[1]
FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--force-overwrite", "--no-progress", "--crude"]
WRITE_FLAGS = ["--maxcount", "5000", "--overwrite", "--no-progress"]
#: The issue's target: Ray local within this fraction of the local engine's wall time on one machine.
TARGET_RAY_OVERHEAD = 0.15
#: The issue's reported case, projected from the measured costs.
PROJECTED_SAMPLES, PROJECTED_SHARDS, PROJECTED_WORKERS = 244_000_000, 4_000, (1, 8, 64)


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


@dataclass
class Way:
    """One way of doing the work: its command, the samples it covers, and its runs."""

    command: list[str]
    samples: int
    #: Shown beside the figures, e.g. "subset: 100 of 2000 shards, extrapolated".
    note: str = ""
    measured: bool = True
    runs: list[Measurement] = field(default_factory=list)
    walls: list[float] = field(default_factory=list)
    #: For a way run on a subset: the same command on fewer shards, and the samples of the whole dataset.
    #: Its rate is then the whole dataset's over the time the two runs give it (`extrapolated_wall`).
    extrapolation: tuple[Way, int] | None = None

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    @property
    def line(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per sample) of the line through this run and the smaller one: the
        fixed cost of a run (start-up, the index's files) and the cost of each further sample; None
        without a smaller run, or where noise made this run no slower than it."""
        if self.extrapolation is None:
            return None
        smaller = self.extrapolation[0]
        if self.wall <= smaller.wall:
            return None
        per_sample = (self.wall - smaller.wall) / (self.samples - smaller.samples)
        return smaller.wall - smaller.samples * per_sample, per_sample

    @property
    def extrapolated_wall(self) -> float | None:
        """The whole dataset's time on `line`, or None."""
        line = self.line
        if line is None or self.extrapolation is None:
            return None
        fixed, per_sample = line
        return fixed + self.extrapolation[1] * per_sample

    @property
    def rate(self) -> float:
        extrapolated = self.extrapolated_wall
        if extrapolated is not None and self.extrapolation is not None:
            return self.extrapolation[1] / extrapolated
        return self.samples / self.wall

    @property
    def peak_rss_mb(self) -> float | None:
        return max(run.peak_tree_rss_mb for run in self.runs) if self.runs else None

    @property
    def cpu_seconds(self) -> float | None:
        return (
            statistics.median(run.user_seconds + run.system_seconds for run in self.runs)
            if self.runs
            else None
        )

    @property
    def other_cores(self) -> float | None:
        return max(run.other_cores for run in self.runs) if self.runs else None


def run_way(way: Way) -> None:
    """Run one command to completion, measured (or only timed); a failure stops the benchmark."""
    if way.measured:
        measurement, stderr = measure(way.command, cwd=REPO, stdout=subprocess.DEVNULL)
        if measurement.returncode != 0:
            sys.exit(f"{' '.join(way.command)} failed:\n{stderr.decode(errors='replace')}")
        way.runs.append(measurement)
        way.walls.append(measurement.wall_seconds)
        return
    started = time.perf_counter()
    result = subprocess.run(way.command, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(way.command)} failed:\n{result.stdout}\n{result.stderr}")
    way.walls.append(time.perf_counter() - started)


def timed(ways: dict[str, Way], repeat: int, output: Callable[[], str], checked: set[str]) -> None:
    """Run each way `repeat` times, round-robin; the output of every way in `checked` must be the first's."""
    expected = None
    for _ in range(repeat):
        for name, way in ways.items():
            run_way(way)
            print(f"  {name}: {way.walls[-1]:.2f} s", file=sys.stderr, flush=True)
            if name in checked:
                found = output()
                expected = expected or found
                if found != expected:
                    sys.exit(f"{name} wrote different bytes than the first run: the figures are void")


def print_table(title: str, ways: dict[str, Way]) -> None:
    print(title)
    local = ways["local"].rate
    for name, way in ways.items():
        memory = f"{way.peak_rss_mb:8,.0f} MB" if way.peak_rss_mb is not None else "      n/a  "
        other = f"  other load {way.other_cores:.2f} cores" if way.other_cores is not None else ""
        note = f"  [{way.note}]" if way.note else ""
        print(
            f"  {name:12s} {way.wall:9.2f} s  {way.rate:12,.0f} samples/s  peak {memory}"
            f"  {local / way.rate:6.2f} x local{other}{note}"
        )


def driver_cost(dataset: bench_datasets.Dataset, shards: int = 100) -> float:
    """Seconds per sample of what the driver does for each shard whose rows come back (insert them into
    `index.sqlite`, write its `.tar.idx`), measured here on the rows of the first `shards` shards, scanned
    beforehand (not timed)."""
    import tempfile

    from prep.index.group import shard_rows
    from prep.index.rows import write_tar_index
    from prep.index.sqlite import SqliteIndexWriter

    paths = sorted(dataset.path.glob("*.tar"))[:shards]
    rows = [shard_rows(str(path), path.name, number) for number, path in enumerate(paths)]
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        with SqliteIndexWriter(Path(folder) / "index.sqlite", [path.name for path in paths]) as writer:
            for one in rows:
                writer.add_rows(one)
                write_tar_index(Path(folder) / f"{one.tar_file_id}.tar.idx", one)
            writer.finish()
        seconds = time.perf_counter() - started
    return seconds / sum(one.count for one in rows)


def project(ways: dict[str, Way], samples: int, shards: int, driver: float) -> list[str]:
    """The issue's 244M-sample / 4,000-shard prepare on 1, 8 and 64 workers, from the measured costs.

    Model, stated so it can be checked against a real cluster:
    - the driver's cost per sample `driver` (inserting rows into sqlite, whose indexes grow as rows go in,
      and writing `.tar.idx`) is measured on its own (`driver_cost`); it runs while the workers scan, so
      it bounds the run from below rather than adding to it;
    - the scan's cost per sample `scan` is the rest of `single`'s time (one process does both, one after
      the other: wall = samples x (scan + driver));
    - W workers: wall = samples x max(scan / W, driver), plus for Ray a per-shard cost `task`, from
      (ray-running - local) / shards, spread over the workers, and Ray's start-up once (ray - ray-running);
    - workers scale perfectly (other machines read their shards at local-disk speed, no shared-storage
      limit), and samples cost the same at 61k per shard as at the measured size.
    """
    scan = max(0.0, ways["single"].wall / samples - driver)
    task = startup = 0.0
    if "ray-running" in ways:
        task = max(0.0, (ways["ray-running"].wall - ways["local"].wall) / shards)
    if "ray" in ways and "ray-running" in ways:
        startup = max(0.0, ways["ray"].wall - ways["ray-running"].wall)
    lines = [
        f"Projection of prepare for {PROJECTED_SAMPLES:,} samples in {PROJECTED_SHARDS:,} shards"
        f" ({PROJECTED_SAMPLES // PROJECTED_SHARDS:,} per shard), from this run's costs:",
        f"  scan {scan * 1e6:.2f} us/sample (on the workers), driver {driver * 1e6:.2f} us/sample (beside"
        f" them), Ray {task * 1e3:.1f} ms/shard, Ray start-up {startup:.1f} s",
    ]
    for workers in PROJECTED_WORKERS:
        parallel = PROJECTED_SAMPLES * scan / workers
        floor = PROJECTED_SAMPLES * driver
        wall = max(parallel, floor)
        ray_wall = max(parallel + PROJECTED_SHARDS * task / workers, floor) + startup
        lines.append(
            f"  {workers:3d} workers: {wall / 60:7.1f} min (scan {parallel / 60:.1f}, driver {floor / 60:.1f}),"
            f" with Ray {ray_wall / 60:7.1f} min"
        )
    if "energon" in ways:
        line = ways["energon"].line
        hours = (
            (line[0] + PROJECTED_SAMPLES * line[1]) / 3600
            if line is not None
            else PROJECTED_SAMPLES / ways["energon"].rate / 3600
        )
        lines.append(f"  energon prepare at its measured rate: {hours:.1f} h")
    return lines


def energon_check(subset: bench_datasets.Dataset) -> str:
    """energon's index of `subset` (its last run's, still in place) against shardprep's of the same shards
    (a run here, not timed), as `tools.bench_prepare` compares them; a mismatch stops the benchmark."""
    theirs = bench_prepare.summarise_index(subset)
    done = subprocess.run(
        [sys.executable, "-m", "prep", "prepare", str(subset.path), *FLAGS],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"shardprep prepare {subset.path} failed:\n{done.stdout}\n{done.stderr}")
    equal, text = bench_prepare.compare(bench_prepare.summarise_index(subset), theirs, subset)
    if not equal:
        sys.exit(f"energon's index of {subset.path} is not shardprep's: its figures are void. {text}")
    return f"energon's index of {subset.name}: {text}"


def run_s3(args: argparse.Namespace, dataset: bench_datasets.Dataset) -> None:
    """--s3: the object-storage benchmark, written separately in `tools.bench_s3`. ---- S3 HOOK ----
    It is imported only here, and given the scale dataset and the flags after `--s3-args`; if it is not
    there yet, the benchmark says so and goes on."""
    if importlib.util.find_spec("tools.bench_s3") is None:
        print("--s3: tools.bench_s3 is not there yet; the S3 part was not run.")
        return
    bench_s3 = importlib.import_module("tools.bench_s3")
    bench_s3.main(["--dataset", str(dataset.path), *args.s3_args])


def machine() -> str:
    load = os.getloadavg()
    return (
        f"{platform.node()}: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()};"
        f" load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start (a shared machine shows"
        " other programs' work here and in 'other load')"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--samples-per-shard", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--energon",
        choices=["subset", "full", "skip"],
        default="subset",
        help="energon prepare on the first --energon-shards shards (extrapolated), on all of them, or not",
    )
    parser.add_argument("--energon-shards", type=int, default=100)
    parser.add_argument(
        "--write-lines", type=int, default=0, help="also time write of a JSONL file of N lines"
    )
    parser.add_argument("--cache", type=Path, default=bench_datasets.DEFAULT_ROOT)
    parser.add_argument("--s3", action="store_true", help="also run tools.bench_s3 (see run_s3)")
    parser.add_argument("--s3-args", nargs=argparse.REMAINDER, default=[], help="flags for tools.bench_s3")
    args = parser.parse_args(argv)

    print(machine(), flush=True)
    samples = args.samples_per_shard * args.shards
    dataset = bench_datasets.ensure_scale_dataset(args.cache, samples, args.shards)
    root = str(dataset.path)
    prepare = [sys.executable, "-m", "prep", "prepare", root, *FLAGS]
    engines = {"single": ["--num-workers", "1"], "local": [], "ray": ["--engine", "ray"]}
    ways = {name: Way([*prepare, *flags], dataset.samples) for name, flags in engines.items()}
    if args.energon != "skip":
        energon, subset = energon_executable(), dataset
        if args.energon == "subset" and args.energon_shards < dataset.shards:
            subset = bench_datasets.ensure_scale_subset(dataset, args.energon_shards, args.cache)
        command = [energon, "prepare", str(subset.path), *PREPARE_FLAGS]
        ways["energon"] = Way(command, subset.samples)
        smaller_shards = max(1, subset.shards // 10)
        if subset is not dataset and smaller_shards < subset.shards:
            # A second, smaller run gives energon's fixed cost (start-up, ~3 s), which a rate taken from
            # the subset alone would count again for every further subset's worth of samples.
            smaller = bench_datasets.ensure_scale_subset(dataset, smaller_shards, args.cache)
            command = [energon, "prepare", str(smaller.path), *PREPARE_FLAGS]
            ways["energon-small"] = Way(command, smaller.samples, "for energon's fixed cost")
            ways["energon"].extrapolation = (ways["energon-small"], dataset.samples)
        if subset is not dataset:
            ways["energon"].note = (
                f"subset: {subset.shards} of {dataset.shards} shards, rate extrapolated"
                + (" with energon-small's run" if ways["energon"].extrapolation else "")
            )
    write_ways: dict[str, Way] = {}
    if args.write_lines:
        rows, out = jsonl_file(args.cache, args.write_lines), args.cache / "bench-scale-write"
        write = [sys.executable, "-m", "prep", "write", str(rows), str(out), *WRITE_FLAGS]
        write_ways = {name: Way([*write, *flags], args.write_lines) for name, flags in engines.items()}
    checked = set(engines) | {"ray-running"}
    timed(ways, args.repeat, lambda: output_hash(dataset.path), checked)
    if "energon" in ways:
        print(energon_check(subset), flush=True)
    if write_ways:
        timed(write_ways, args.repeat, lambda: files_hash(out), checked)

    import ray  # only to hold a running local instance for "ray-running", after every measured run

    ray.init(include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        running = ["--engine", "ray", "--ray-address", address]
        later = {"ray-running": Way([*prepare, *running], dataset.samples, "driver only", measured=False)}
        timed(later, args.repeat, lambda: output_hash(dataset.path), checked)
        ways.update(later)
        if write_ways:
            later_write = {
                "ray-running": Way([*write, *running], args.write_lines, "driver only", measured=False)
            }
            timed(later_write, args.repeat, lambda: files_hash(out), checked)
            write_ways.update(later_write)
    finally:
        ray.shutdown()

    print(bench_datasets.describe(dataset))
    print_table(f"prepare, median of {args.repeat} runs:", ways)
    if write_ways:
        print_table(f"write of {args.write_lines} JSONL lines, median of {args.repeat} runs:", write_ways)
    for name in ("ray", "ray-running"):
        ratio = ways[name].wall / ways["local"].wall
        mark = "PASS" if ratio <= 1 + TARGET_RAY_OVERHEAD else "MISS"
        print(f"prepare {name} / local wall: {ratio:.2f} (target <= {1 + TARGET_RAY_OVERHEAD:.2f}) {mark}")
    if "energon" in ways:
        extrapolated, line = ways["energon"].extrapolated_wall, ways["energon"].line
        if extrapolated is not None and line is not None:
            print(
                f"energon extrapolated to the whole dataset: {extrapolated:.1f} s (a fixed {line[0]:.1f} s,"
                f" then {1 / line[1]:,.0f} samples/s)"
            )
        elif ways["energon"].extrapolation is not None:
            print("energon's two runs were too close to extrapolate by: its rate is the subset's own")
        print(f"prepare local / energon samples/s: {ways['local'].rate / ways['energon'].rate:.1f} x")
    print("\n".join(project(ways, dataset.samples, dataset.shards, driver_cost(dataset))))
    print("Every run of a command wrote the same bytes.")
    if args.s3:
        run_s3(args, dataset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
