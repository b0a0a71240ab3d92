"""Benchmark `shardprep mount` against `energon mount` on the same prepared data, in the same run.

For each dataset (text: 200,000 JSON samples; image: 100,000 JPEG+txt+json samples, from
tools.bench_datasets) the shards are hard-linked into a private folder and prepared once (energon's
format; both mounts read the same index). Then, per tool:

- time until mounted (launch to the mount point answering) and `ls -R` over the whole tree, flat view
  and per-sample view (energon's `-s`; ours also per-shard): the median of `--repeat` runs,
- reading every file (or `--read-files N` of them, the same ones for every tool) with 1 and with 4
  reader processes: files/s and MB/s, the median of `--repeat` runs taken in turns by the tools,
- each step on a fresh mount, so nothing the kernel cached in one step (names from `ls -R`, pages
  read by the 1-reader run) helps the next,
- peak resident memory (VmHWM) of the mount process,

and, as the reference a user knows, the same files extracted into a normal folder. The page cache is
warmed by reading the shards first, so every tool reads from memory.

    python -m tools.bench_mount                                   # full size
    python -m tools.bench_mount --text-samples 50000 --image-samples 20000 --read-files 20000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from multiprocessing import Pool
from pathlib import Path

from tools.bench_datasets import DEFAULT_ROOT, ensure_image_dataset, ensure_text_dataset, prepare_crude

REPO = Path(__file__).resolve().parents[1]
FULL_SIZE = {"text": 200_000, "image": 100_000}
ENERGON = str(Path(sys.executable).with_name("energon"))


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def linked_copy(shards: list[Path], folder: Path) -> Path:
    """A folder of hard links to the shards, so our .nv-meta never touches the shared cache."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        link = folder / shard.name
        if not link.exists():
            os.link(shard, link)
    return folder


def prepare(folder: Path) -> None:
    if not (folder / ".nv-meta" / "index.sqlite").exists():
        prepare_crude(folder)


def warm(folder: Path) -> None:
    for shard in sorted(folder.glob("*.tar")):
        with open(shard, "rb") as file:
            while file.read(1 << 24):
                pass


def wait_mounted(mountpoint: Path, process: subprocess.Popen | None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mountpoint):
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"mount process exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError("mount did not appear")
        time.sleep(0.01)
    with os.scandir(mountpoint) as entries:  # answering (its first page of names), not only registered
        next(entries, None)


def unmount(mountpoint: Path) -> None:
    subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False, stderr=subprocess.DEVNULL)
    for _ in range(500):
        if not os.path.ismount(mountpoint):
            return
        time.sleep(0.02)
    subprocess.run(["fusermount3", "-uz", str(mountpoint)], check=False)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Mount:
    """One mount of one tool in one view; `pid` is the process serving it."""

    def __init__(self, tool: str, dataset: Path, mountpoint: Path, view: str) -> None:
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        if tool == "shardprep":
            result = subprocess.run(
                [sys.executable, "-m", "prep", "mount", str(dataset), str(mountpoint), "--view", view],
                cwd=REPO,
                capture_output=True,
                text=True,
                check=True,
            )
            self.pid = int(result.stdout.split("(pid ")[1].split(")")[0])
            self.process = None
        else:
            command = [ENERGON, "mount", str(dataset), str(mountpoint)] + (["-s"] if view == "sample" else [])
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.pid = self.process.pid
        wait_mounted(mountpoint, self.process)
        self.seconds_to_mount = time.perf_counter() - start

    def close(self) -> None:
        unmount(self.mountpoint)
        if self.process is not None:
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def time_ls(folder: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["ls", "-R", str(folder)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def _read_files(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as file:
            while True:
                chunk = file.read(1 << 20)
                if not chunk:
                    break
                total += len(chunk)
    return total


def time_reads(
    folder: Path, names: list[str], readers: int, members: dict[str, tuple[Path, int, int]]
) -> tuple[float, float]:
    """(files/s, MB/s) reading `names` under `folder` with `readers` processes; the benchmark stops if
    the bytes read are not the files' sizes in the shards (`members`), or if some of the files, checked
    afterwards, do not hold the shards' bytes: a fast wrong answer is worthless."""
    paths = [str(folder / name) for name in names]
    chunks = [paths[i::readers] for i in range(readers)]
    start = time.perf_counter()
    if readers == 1:
        total = _read_files(paths)
    else:
        with Pool(readers) as pool:
            total = sum(pool.map(_read_files, chunks))
    seconds = time.perf_counter() - start
    expected = sum(members[name][2] for name in names)
    if total != expected:
        sys.exit(f"reading {len(names):,} files under {folder} gave {total:,} bytes, not their {expected:,}")
    for name in random.Random(1).sample(names, min(len(names), 200)):
        shard, offset, size = members[name]
        with open(shard, "rb") as file:
            file.seek(offset)
            if (folder / name).read_bytes() != file.read(size):
                sys.exit(f"{folder / name} does not hold the bytes of {name} in {shard.name}")
    return len(paths) / seconds, total / seconds / 1e6


def flat_members(dataset: Path) -> dict[str, tuple[Path, int, int]]:
    """Each file of the flat view: (its shard, the offset of its bytes there, its size)."""
    members = {}
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.isfile():
                    members[member.name] = (shard, member.offset_data, member.size)
    return members


def extract(dataset: Path, folder: Path, per_sample: bool = False) -> None:
    """The shards' files in a normal folder, once (a `.partial` folder is renamed when complete).

    `per_sample` lays them out as a folder per sample (`KEY/PART`), the tree the per-sample view shows.
    """
    if folder.exists():
        return
    tmp = folder.with_suffix(".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for shard in sorted(dataset.glob("*.tar")):
        with tarfile.open(shard) as tar:
            if not per_sample:
                tar.extractall(tmp, filter="data")
                continue
            for member in tar:
                if member.isfile():
                    key, _, part = member.name.partition(".")
                    (tmp / key).mkdir(parents=True, exist_ok=True)
                    (tmp / key / part).write_bytes(tar.extractfile(member).read())
    tmp.rename(folder)


def bench_dataset(
    name: str, dataset: Path, work: Path, read_files: int | None, tools: list[str], repeats: int = 1
) -> dict:
    log(f"[{name}] preparing {dataset}")
    prepare(dataset)
    warm(dataset)
    members = flat_members(dataset)
    names = list(members)
    chosen = (
        names
        if read_files is None or read_files >= len(names)
        else random.Random(0).sample(names, read_files)
    )
    results: dict[str, dict] = {"files_in_tree": len(names), "files_read": len(chosen)}
    for tool in tools:
        row: dict[str, float] = {}
        peaks = []
        # Every measurement gets a fresh mount, so no tool is helped by what the kernel cached from an
        # earlier step (names listed by ls -R, pages read by the 1-reader run).
        views = (
            ("flat", "sample", "shard") if tool == "shardprep" else ("flat", "sample")
        )  # energon: no shard view
        for view in views:
            mountpoint = work / f"mnt-{tool}-{view}"
            mounted, listed = [], []
            for repeat in range(repeats):  # the median of `repeats` runs, each on a fresh mount
                log(f"[{name}] {tool} {view}: mounting")
                mount = Mount(tool, dataset, mountpoint, view)
                try:
                    mounted.append(mount.seconds_to_mount)
                    log(f"[{name}] {tool} {view}: mounted in {mount.seconds_to_mount:.2f} s; ls -R")
                    listed.append(time_ls(mountpoint))
                    log(f"[{name}] {tool} {view}: ls -R {listed[-1]:.2f} s (run {repeat + 1})")
                    peaks.append(peak_rss_mb(mount.pid))
                finally:
                    mount.close()
            row[f"mount_s_{view}"], row[f"ls_R_s_{view}"] = (
                statistics.median(mounted),
                statistics.median(listed),
            )
        row["peak_rss_MB"] = max(peaks)
        results[tool] = row
    # Reads are the noisiest figure on a shared machine: each is repeated on a fresh mount, the tools
    # taking turns so that a change in load falls on both, and the median is reported.
    samples: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for repeat in range(repeats):
        for tool in tools:
            for readers in (1, 4):
                mountpoint = work / f"mnt-{tool}-read"
                mount = Mount(tool, dataset, mountpoint, "flat")
                try:
                    files_s, mb_s = time_reads(mountpoint, chosen, readers, members)
                    samples.setdefault((tool, readers), []).append((files_s, mb_s))
                    log(
                        f"[{name}] {tool} {readers} reader(s), run {repeat + 1}: {files_s:,.0f} files/s {mb_s:.1f} MB/s"
                    )
                    results[tool]["peak_rss_MB"] = max(results[tool]["peak_rss_MB"], peak_rss_mb(mount.pid))
                finally:
                    mount.close()
    for (tool, readers), runs in samples.items():
        files_s, mb_s = sorted(runs)[len(runs) // 2]
        results[tool][f"files_s_{readers}"], results[tool][f"MB_s_{readers}"] = files_s, mb_s
    folder = work / f"extracted-{name}"
    log(f"[{name}] {'reusing' if folder.exists() else 'extracting to'} {folder}")
    extract(dataset, folder)
    per_sample = work / f"extracted-per-sample-{name}"
    log(f"[{name}] {'reusing' if per_sample.exists() else 'extracting a folder per sample to'} {per_sample}")
    extract(dataset, per_sample, per_sample=True)
    # The reference is a normal folder as a user meets it after a first look: names and pages cached,
    # as the shards are for the mounts.
    time_ls(folder), time_ls(per_sample), time_reads(folder, chosen, 1, members)
    row = {"ls_R_s_flat": time_ls(folder), "ls_R_s_sample": time_ls(per_sample)}
    for readers in (1, 4):
        row[f"files_s_{readers}"], row[f"MB_s_{readers}"] = time_reads(folder, chosen, readers, members)
    results["extracted"] = row
    return results


def report(name: str, results: dict) -> str:
    ours, theirs = results.get("shardprep", {}), results.get("energon", {})
    lines = [
        f"\n## {name}: {results['files_in_tree']:,} files in the tree, {results['files_read']:,} read per run"
    ]
    keys = [
        ("mount_s_flat", "time until mounted, flat (s)", False),
        ("ls_R_s_flat", "ls -R flat view (s)", False),
        ("ls_R_s_sample", "ls -R per-sample view (s)", False),
        ("ls_R_s_shard", "ls -R per-shard view (s)", False),
        ("files_s_1", "files/s, 1 reader", True),
        ("files_s_4", "files/s, 4 readers", True),
        ("MB_s_1", "MB/s, 1 reader", True),
        ("MB_s_4", "MB/s, 4 readers", True),
        ("peak_rss_MB", "mount process peak RSS, any step (MB)", False),
    ]
    lines.append(f"{'':42} {'shardprep':>11} {'energon':>11} {'ratio':>8} {'extracted dir':>14}")
    for key, label, higher_better in keys:
        a, b = ours.get(key), theirs.get(key)
        ratio = ""
        if a and b:
            ratio = f"{(a / b if higher_better else b / a):.1f}x"
        extracted = results.get("extracted", {}).get(key)
        fmt = lambda v: "" if v is None else f"{v:,.2f}"  # noqa: E731
        lines.append(f"{label:42} {fmt(a):>11} {fmt(b):>11} {ratio:>8} {fmt(extracted):>14}")
    lines.append("(ratio: how many times better shardprep is; >1 means shardprep wins)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "datasets", nargs="*", default=["text", "image"], help="text and/or image (default both)"
    )
    parser.add_argument("--text-samples", type=int, default=200_000)
    parser.add_argument("--image-samples", type=int, default=100_000)
    parser.add_argument(
        "--read-files",
        type=int,
        default=None,
        help="read this many files (same random set for every tool); default all",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each mount, ls -R and read measurement (median shown)"
    )
    parser.add_argument("--tools", default="shardprep,energon", help="comma-separated: shardprep,energon")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="dataset cache (default: tools.bench_datasets' shared cache at full size, a private one otherwise,"
        " so a reduced run never replaces the shared full-size datasets)",
    )
    parser.add_argument(
        "--work", type=Path, default=DEFAULT_ROOT.parent / "bench-mount", help="scratch folder"
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args(argv)
    unknown = set(args.datasets) - set(FULL_SIZE)
    if unknown:
        parser.error(f"unknown dataset {', '.join(sorted(unknown))}; choose from text, image")
    tools = args.tools.split(",")
    everything = {}
    for name in args.datasets:
        samples = args.text_samples if name == "text" else args.image_samples
        cache = args.cache or (DEFAULT_ROOT if samples == FULL_SIZE[name] else args.work / "datasets")
        ensure = ensure_text_dataset if name == "text" else ensure_image_dataset
        generated = ensure(cache, samples=samples)
        work = args.work / f"{name}-{generated.samples}"
        dataset = linked_copy(generated.shard_paths(), work / "dataset")
        everything[name] = bench_dataset(name, dataset, work, args.read_files, tools, args.repeat)
        print(report(f"{name} ({generated.samples:,} samples)", everything[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
