"""Benchmark `shardprep prepare` of a dataset in object storage beside `energon prepare` on the same msc:// path.

Both tools run, as child processes, against moto's S3 server on loopback (`tests.support.s3.S3Server`,
started here and ended at exit), run by `tests.support.moto_counted`, which counts the bytes of the
response bodies it sends: the bytes read from the bucket (HTTP headers left out). Each
dataset is uploaded once; each tool prepares it as it was uploaded (`--split-ratio 1,0,0`; the other
tool's index is downloaded and deleted in between), and the two indexes (every `.tar.idx`, the sqlite
rows) must be equal: a fast wrong answer is worthless. moto keeps objects over 1 MiB in temporary files
(`MOTO_S3_DEFAULT_KEY_BUFFER_SIZE`), so a dataset of many GB costs the server disk, not memory.

Datasets (made here, or the text one given by `--dataset`, as `tools.bench_scale --s3` does):

- ``text``: tiny one-part samples (`tools.bench_datasets`' scale shards: a 512-byte header and a padded
  512-byte block each), so headers are half the bytes and reading the shard whole is the cheapest way;
- ``docs``: one text part of ``--doc-bytes`` per sample;
- ``big``: a ``--big-bytes`` binary part and a small JSON part per sample.

Printed per dataset: wall time and samples/s of each tool, the ratio, bytes read as a % of the shards'
size, and the CPU time the server spent meanwhile. moto is a Python server, far slower than a real object
store, and it runs on the same machine as the tool it serves: on a machine of few cores its CPU time is
taken from the tool's (a real store's is not), which weighs on the faster tool most. The figures compare
the two tools under the same server; they do not predict S3's absolute speed.

    python -m tools.bench_s3
    python -m tools.bench_s3 --text-shards 20 --text-samples-per-shard 5000 --datasets text,big
    python -m tools.bench_s3 --energon skip --num-workers 1   # shardprep alone, scanning in threads

moto reads an object's whole value for every ranged GET (then slices it), so a small read of a big object
costs it about 0.1 ms per MB of the object on top of its ~4 ms per request; a real S3 answers a ranged GET
in time independent of the object's size, but after 10-30 ms, so walking big members' headers costs more
there, and reading shards whole relatively less.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.prepare import sqlite_contents, tar_indexes
from tests.support.s3 import S3Server
from tools import bench_datasets
from tools.bench_prepare import energon_executable

REPO = Path(__file__).resolve().parents[1]

FLAGS = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress"]
PROFILE = "bench"
BUCKET = "bench-s3"


@dataclass
class Run:
    tool: str
    dataset: str
    samples: int
    size: int
    seconds: float
    server_bytes: int

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def read_percent(self) -> float:
        return 100 * self.server_bytes / self.size


def make_member_dataset(folder: Path, shards: int, samples: int, parts: dict[str, int]) -> int:
    """`shards` shards of `samples` samples, each with parts of the given sizes (GNU format, by tarfile)."""
    import io

    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        with tarfile.open(folder / f"shard-{shard:06d}.tar", "w", format=tarfile.GNU_FORMAT) as tar:
            for sample in range(samples):
                for part, size in parts.items():
                    info = tarfile.TarInfo(f"{shard:04d}-{sample:06d}.{part}")
                    info.size, info.mtime = size, 1_700_000_000
                    head = b'{"i": %d}' % sample if part == "json" else b"%d " % sample
                    filler = b" " if part == "json" else b"x"  # trailing spaces keep the JSON valid
                    tar.addfile(info, io.BytesIO(head + filler * (size - len(head))))
    return shards * samples


def shards_size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*.tar"))


def prepare(tool: str, address: str, env: dict[str, str], workers: int | None = None) -> float:
    command = (
        [sys.executable, "-m", "prep", "prepare", address, *FLAGS]
        + (["--num-workers", str(workers)] if workers else [])
        if tool == "shardprep"
        else [energon_executable(), "prepare", address, *FLAGS]
    )
    started = time.perf_counter()
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, cwd=REPO, stdin=subprocess.DEVNULL
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(
            f"{tool} prepare {address} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        )
    return seconds


def index_of(server: S3Server, prefix: str, scratch: Path) -> tuple[dict, dict]:
    """(.tar.idx bytes, sqlite contents) of a prepared prefix, downloaded below `scratch`."""
    folder = scratch / prefix
    client = server.client()
    for key in server.keys(BUCKET, prefix + "/"):
        if key.endswith(".tar.idx") or key.endswith("/index.sqlite"):
            target = folder / key[len(prefix) + 1 :]
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, key, str(target))
    return tar_indexes(folder), sqlite_contents(folder / ".nv-meta" / "index.sqlite")


def bench_dataset(
    name: str,
    folder: Path,
    samples: int,
    server: S3Server,
    env: dict,
    scratch: Path,
    tools: list[str],
    workers: int | None = None,
) -> list[Run]:
    size = shards_size(folder)
    runs, indexes = [], []
    started = time.perf_counter()
    # The shards alone: tools.bench_scale prepares the scale dataset's folder in place, and its index
    # must not come along.
    server.upload_folder(folder, BUCKET, name, "*.tar")
    print(f"  uploaded to the server in {time.perf_counter() - started:.1f} s", flush=True)
    for tool in tools:
        sent, busy = server.bytes_sent(), server.cpu_seconds()
        seconds = prepare(tool, f"msc://{PROFILE}/{name}", env, workers)
        read, busy = server.bytes_sent() - sent, server.cpu_seconds() - busy
        runs.append(Run(tool, name, samples, size, seconds, read))
        print(
            f"  {name:5s} {tool:9s} {seconds:8.2f} s  {samples / seconds:12,.0f} samples/s"
            f"  read {read:,} B = {100 * read / size:6.2f}% of {size:,} B; the server's CPU {busy:.1f} s",
            flush=True,
        )
        if len(tools) == 2:
            indexes.append(index_of(server, name, scratch / tool))
        remove_index(server, name)  # the next tool finds the shards as this one did: not prepared
    if len(tools) == 2:
        ours, theirs = indexes
        assert ours == theirs, f"{name}: shardprep's index differs from energon's"
        print(f"  {name}: the two indexes are equal ({len(ours[0])} .tar.idx files, sqlite rows)", flush=True)
    server.delete_prefix(BUCKET, name)
    return runs


def remove_index(server: S3Server, prefix: str) -> None:
    """Everything a prepare added under `prefix` (all but the shards)."""
    server.delete_keys(BUCKET, [key for key in server.keys(BUCKET, prefix + "/") if not key.endswith(".tar")])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_s3", description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, help="a folder of text shards to use as the 'text' dataset")
    parser.add_argument("--datasets", default="text,docs,big", help="comma list of text,docs,big")
    parser.add_argument("--text-shards", type=int, default=10)
    parser.add_argument("--text-samples-per-shard", type=int, default=5000)
    parser.add_argument("--docs-shards", type=int, default=8)
    parser.add_argument("--docs-samples-per-shard", type=int, default=100)
    parser.add_argument("--doc-bytes", type=int, default=64 * 1024)
    parser.add_argument("--big-shards", type=int, default=8)
    parser.add_argument("--big-samples-per-shard", type=int, default=40)
    parser.add_argument("--big-bytes", type=int, default=512 * 1024)
    parser.add_argument("--energon", choices=["run", "skip"], default="run")
    parser.add_argument("--num-workers", type=int, help="shardprep's --num-workers (default: its own)")
    parser.add_argument("--cache", type=Path, default=bench_datasets.DEFAULT_ROOT)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, load {load[0]:.2f};"
        " moto server on loopback (a Python server: compare the tools, not absolute speeds)",
        flush=True,
    )
    tools = ["shardprep", "energon"] if args.energon == "run" else ["shardprep"]
    scratch = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(1 << 20))  # (the server inherits it)
    server = S3Server(scratch / "moto.log", counted=True)
    server.start()
    try:
        server.make_bucket(BUCKET)
        config = server.msc_config(scratch / "msc.yaml", PROFILE, BUCKET)
        env = {**os.environ, "MSC_CONFIG": str(config), "PYTHONPATH": str(REPO)}
        runs: list[Run] = []
        for name in args.datasets.split(","):
            if name == "text":
                if args.dataset is not None:
                    folder = args.dataset
                    samples = sum(
                        1
                        for path in folder.rglob("*.tar")
                        for member in tarfile.open(path)
                        if member.isfile()
                    )
                else:
                    made = bench_datasets.ensure_scale_dataset(
                        args.cache, args.text_shards * args.text_samples_per_shard, args.text_shards
                    )
                    folder, samples = made.path, made.samples
                parts = "1 part of a few bytes"
            elif name == "docs":
                folder = scratch / "docs"
                samples = make_member_dataset(
                    folder, args.docs_shards, args.docs_samples_per_shard, {"txt": args.doc_bytes}
                )
                parts = f"1 txt part of {args.doc_bytes:,} B"
            elif name == "big":
                folder = scratch / "big"
                samples = make_member_dataset(
                    folder, args.big_shards, args.big_samples_per_shard, {"bin": args.big_bytes, "json": 64}
                )
                parts = f"a {args.big_bytes:,} B bin part and a 64 B json part"
            else:
                raise SystemExit(f"unknown dataset {name!r}; choose from text, docs, big")
            shards = len(list(folder.rglob("*.tar")))
            print(f"{name}: {samples:,} samples in {shards} shards, {parts} per sample", flush=True)
            runs += bench_dataset(name, folder, samples, server, env, scratch, tools, args.num_workers)
        print("\ndataset   shardprep samples/s   energon samples/s   ratio   bytes read: shardprep / energon")
        for name in args.datasets.split(","):
            ours = next(run for run in runs if run.dataset == name and run.tool == "shardprep")
            theirs = next((run for run in runs if run.dataset == name and run.tool == "energon"), None)
            if theirs is None:
                print(
                    f"{name:8s}  {ours.rate:19,.0f}   {'-':>17s}   {'-':>5s}   {ours.read_percent:6.2f}% / -"
                )
                continue
            print(
                f"{name:8s}  {ours.rate:19,.0f}   {theirs.rate:17,.0f}   {ours.rate / theirs.rate:5.1f}x"
                f"   {ours.read_percent:6.2f}% / {theirs.read_percent:6.2f}%"
            )
        print("issue 14's target: at least 10x energon, and under 2% of the dataset read for text shards.")
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
