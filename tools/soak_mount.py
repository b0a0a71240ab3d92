"""Soak `shardprep mount`: many threads reading random files at once for a while, then `ls -R` in a loop,
every byte checked against the tar, and the server's memory watched.

    python -m tools.soak_mount                       # 64 threads for 180 s, then 20 ls -R; 20,000 samples
    python -m tools.soak_mount --seconds 10 --threads 16 --listings 3 --samples 2000

The dataset is written by `shardprep write` (JSONL -> shards with the `json` and `txt` parts) into a
temporary folder, prepared in energon's format, and mounted (flat view) in a process of its own. While
the readers run, the server's resident memory (VmRSS) is sampled every second. Prints: reads done,
reads/s, wrong bytes and errors (both must be 0), listings done and their time, and the server's RSS at
the start of the soak, its peak, and at the end (flat means the end is within a few MB of the start).
Exit code 1 if any read failed or returned wrong bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class SoakResult:
    reads: int = 0
    wrong: int = 0
    errors: list[str] = field(default_factory=list)
    read_seconds: float = 0.0
    listings: int = 0
    listing_seconds: list[float] = field(default_factory=list)
    rss_kb: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.wrong == 0 and not self.errors


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def make_dataset(folder: Path, samples: int) -> dict[str, bytes]:
    """A prepared dataset of `samples` samples; returns every flat-view file name and its bytes, as the
    tars hold them."""
    source = folder / "rows.jsonl"
    rng = random.Random(0)
    rows = [{"text": " ".join(str(rng.random()) for _ in range(rng.randint(1, 60)))} for _ in range(samples)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    subprocess.run(
        [sys.executable, "-m", "prep", "write", str(source), str(folder / "dataset"), "--part", "text=txt",
         "--maxcount", "1000", "--no-progress"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    expected = {}
    for shard in sorted((folder / "dataset").glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                expected[member.name] = tar.extractfile(member).read()
    return expected


def soak(
    dataset: Path,
    mountpoint: Path,
    expected: dict[str, bytes],
    *,
    threads: int,
    seconds: float,
    listings: int,
) -> SoakResult:
    """Mount `dataset`, read random files from `threads` threads for `seconds`, then `ls -R` `listings`
    times; unmounts whatever happens."""
    mounted = subprocess.run(
        [sys.executable, "-m", "prep", "mount", str(dataset), str(mountpoint)],
        cwd=REPO, check=True, capture_output=True, text=True,
    )  # fmt: skip
    pid = int(mounted.stdout.split("(pid ")[1].split(")")[0])
    result = SoakResult()
    lock = threading.Lock()
    names = sorted(expected)
    stop = time.monotonic() + seconds
    try:
        result.rss_kb.append(rss_kb(pid))

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            reads = wrong = 0
            errors: list[str] = []
            while time.monotonic() < stop:
                name = rng.choice(names)
                try:
                    with open(mountpoint / name, "rb") as file:
                        data = file.read()
                except OSError as error:
                    errors.append(f"{name}: {error}")
                    continue
                reads += 1
                wrong += data != expected[name]
            with lock:
                result.reads += reads
                result.wrong += wrong
                result.errors += errors

        started = time.monotonic()
        workers = [threading.Thread(target=reader, args=(seed,)) for seed in range(threads)]
        for worker in workers:
            worker.start()
        while any(worker.is_alive() for worker in workers):
            time.sleep(min(1.0, max(0.05, stop - time.monotonic())))
            result.rss_kb.append(rss_kb(pid))
        for worker in workers:
            worker.join()
        result.read_seconds = time.monotonic() - started
        for _ in range(listings):
            began = time.monotonic()
            found = sum(len(files) for _, _, files in os.walk(mountpoint))
            result.listing_seconds.append(time.monotonic() - began)
            if found != len(expected):
                result.errors.append(f"ls -R found {found} files, not {len(expected)}")
            result.listings += 1
            result.rss_kb.append(rss_kb(pid))
    finally:
        subprocess.run([sys.executable, "-m", "prep", "umount", "--lazy", str(mountpoint)], cwd=REPO)
    return result


def report(result: SoakResult, threads: int) -> str:
    rss = [kb / 1024 for kb in result.rss_kb]
    listing = sorted(result.listing_seconds)
    return "\n".join(
        [
            f"reads: {result.reads:,} by {threads} threads in {result.read_seconds:.1f} s"
            f" ({result.reads / max(result.read_seconds, 1e-9):,.0f}/s); wrong bytes: {result.wrong}; errors:"
            f" {len(result.errors)}" + (f" (first: {result.errors[0]})" if result.errors else ""),
            f"ls -R: {result.listings} times, median {listing[len(listing) // 2]:.2f} s"
            if listing
            else "ls -R: -",
            f"server RSS: {rss[0]:.1f} MB at the start, peak {max(rss):.1f} MB, {rss[-1]:.1f} MB at the end;"
            " by tenths of the run: " + " ".join(f"{rss[len(rss) * tenth // 10]:.1f}" for tenth in range(10)),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--listings", type=int, default=20)
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-mount-") as folder:
        expected = make_dataset(Path(folder), args.samples)
        result = soak(
            Path(folder, "dataset"),
            Path(folder, "mnt"),
            expected,
            threads=args.threads,
            seconds=args.seconds,
            listings=args.listings,
        )
    print(report(result, args.threads))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
