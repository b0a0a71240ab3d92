"""Benchmark `shardprep prepare` of a dataset in object storage beside `energon prepare` on the same msc:// path.

Both tools run, as child processes, against an S3 server on loopback, started here and ended at exit
(`--server`): Ceph's object gateway (`tests.support.ceph`, C++, the default where Ceph's daemons are
installed), or moto (`tests.support.s3`, Python), run by `tests.support.moto_counted`, which counts the
bytes of the response bodies it sends (the gateway counts them itself). Each dataset is uploaded once;
each tool prepares it as it was uploaded (`--split-ratio 1,0,0`; the other tool's index is downloaded and
deleted in between; each starts once the server is idle again), and the two indexes (every `.tar.idx`, the sqlite rows) are compared: a fast wrong
answer is worthless. Where they differ, Python's tarfile referees the shards concerned: a wrong index of
shardprep's stops the benchmark; a wrong one of energon's (its forked workers can read each other's
answers on a server that keeps connections open, see README) is reported and its time flagged, and an
energon run that fails (on Ceph, on such bytes; or for any other reason) is reported with its error; one
that hangs (neither it nor the server using CPU for two minutes: energon, after such a failure, once
waited at exit for good) is killed and reported. moto keeps objects over 1 MiB in temporary files
(`MOTO_S3_DEFAULT_KEY_BUFFER_SIZE`) and the gateway in a sparse file, so a dataset of many GB costs the
server disk, not memory.

Datasets (made here, or the text one given by `--dataset`, as `tools.bench_scale --s3` does):

- ``text``: tiny one-part samples (`tools.bench_datasets`' scale shards: a 512-byte header and a padded
  512-byte block each), so headers are half the bytes and reading the shard whole is the cheapest way;
- ``docs``: one text part of ``--doc-bytes`` per sample;
- ``big``: a ``--big-bytes`` binary part and a small JSON part per sample.

Printed per dataset: wall time and samples/s of each tool, the ratio, bytes read as a % of the shards'
size and, beside it, the shards' headers as a % of it (a member's place is known only from the header
before it, so no tool that indexes every member reads less), the CPU time of each tool (its whole process tree) and of the server meanwhile, how busy the
two together kept the machine's CPUs, and the peak memory of each tool (the largest sum of RSS over its
processes, sampled every 50 ms; the server's left out): an upper bound for a tool that forks workers
(energon's 16), whose shared pages count once per process; PSS, the honest total, costs a few ms per
process to read, CPU the tools share with the sampler. The server runs on the same machine as the tool
it serves: on a machine of few cores its CPU time is taken from the tool's (a real store's is not), which weighs on the
faster tool most (near 100%, the tool can only get faster by costing less CPU); the tools' CPU times
show what they cost by themselves. The figures compare the two tools under the same server; they do not
predict S3's absolute speed.

    python -m tools.bench_s3
    python -m tools.bench_s3 --server moto
    python -m tools.bench_s3 --text-shards 20 --text-samples-per-shard 5000 --datasets text,big
    python -m tools.bench_s3 --energon skip --num-workers 1   # shardprep alone, scanning in threads
    python -m tools.bench_s3 --energon skip --shardprep-flags "--engine ray"   # scanned by Ray tasks

moto reads an object's whole value for every ranged GET (then slices it), so a small read of a big object
costs it about 0.1 ms per MB of the object on top of its ~4 ms per request; a real S3 answers a ranged GET
in time independent of the object's size, but after 10-30 ms, so walking big members' headers costs more
there, and reading shards whole relatively less.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import resource
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prep.tar.scan import HeaderWalker
from tests.support import ceph
from tests.support.leftovers import SESSION, process_cpu_seconds, processes_where
from tests.support.prepare import sqlite_contents, tar_indexes
from tests.support.s3 import S3Server
from tools import bench_datasets
from tools.bench_prepare import energon_executable
from tools.measure import TreeSampler

REPO = Path(__file__).resolve().parents[1]

FLAGS = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress"]
PROFILE = "bench"
SERVERS = {
    "moto": "moto on loopback (a Python server: compare the tools, not absolute speeds)",
    "ceph": "Ceph's object gateway on loopback (radosgw, C++; one BlueStore daemon on a file)",
}
BUCKET = "bench-s3"
#: A tool that, with the server, uses under IDLE_RATE CPU-seconds a second for STALL_SECONDS (checked every
#: STALL_CHECK seconds) has hung: it is killed and reported.
STALL_SECONDS, STALL_CHECK, IDLE_RATE = 120.0, 10.0, 0.03
#: The CPUs the tool and the server share (the busier they are, the less a faster tool can gain).
CPUS = os.cpu_count() or 1


@dataclass
class Run:
    tool: str
    dataset: str
    samples: int
    size: int
    seconds: float
    cpu_seconds: float
    server_bytes: int
    #: The largest sum of RSS over the tool's processes (it and its workers), sampled.
    peak_rss_mb: float
    #: What was wrong with the index the tool wrote (empty: nothing found).
    wrong: str = ""
    #: The error the tool stopped on (empty: it finished).
    failed: str = ""
    #: The bytes of the shards' headers (`header_bytes`): the least any tool can read.
    headers: int = 0

    @property
    def rate(self) -> float:
        return self.samples / self.seconds

    @property
    def read_percent(self) -> float:
        return 100 * self.server_bytes / self.size

    @property
    def floor_percent(self) -> float:
        return 100 * self.headers / self.size


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


def header_bytes(folder: Path) -> int:
    """The bytes of the shards' member headers (long-name and PAX records included), found by walking
    each shard here: a member's place is known only from the header before it, so every tool that
    indexes every member reads at least these, whatever data it skips."""
    total = 0
    for path in folder.rglob("*.tar"):
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            _, starts, data_offsets, _ = HeaderWalker(str(path), buffer).scan_table()
            total += sum(data_offsets) - sum(starts)
    return total


class SessionSampler(TreeSampler):
    """The memory of the processes of one session (a tool started in a session of its own, and its
    workers), sampled: the server, a child of this process too, is not in it. RSS only, from statm, so
    that sampling a tool of many workers costs the CPUs the two share little."""

    def __init__(self, session: int, interval: float = 0.05) -> None:
        super().__init__(interval, with_pss=False)
        self.session = session

    def pids(self) -> set[int]:
        return set(processes_where(SESSION, self.session))


def prepare(
    tool: str,
    address: str,
    env: dict[str, str],
    scratch: Path,
    server: S3Server,
    flags: tuple[str, ...] = (),
) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS in MB, the error it stopped on or "") of one tool's prepare:
    the CPU time of its whole process tree (user and system), what a real object store would leave to
    the tool; the server's own is counted apart. The peak RSS is the largest sum over its processes.
    What the tool printed is kept in `scratch/TOOL.out`. A shardprep that fails stops the benchmark; an
    energon that fails (whatever the cause: its workers can read each other's answers, see README) is
    reported, and one that hangs (`STALL_SECONDS`) is killed and reported."""
    command = (
        [sys.executable, "-m", "prep", "prepare", address, *FLAGS] + list(flags)
        if tool == "shardprep"
        else [energon_executable(), "prepare", address, *FLAGS]
    )
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    with subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its workers too are ended if it hangs
    ) as process:
        sampler = SessionSampler(process.pid)
        sampler.start()
        try:
            stdout, stderr, hung = _watched(process, server)
        except BaseException:  # Ctrl-C, say: the terminal's signal misses a session of its own
            os.killpg(process.pid, signal.SIGKILL)
            raise
        finally:
            sampler.stop()
    seconds, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0 and tool == "shardprep":
        raise SystemExit(f"{tool} prepare {address} failed{hung}:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    (scratch / f"{tool}.out").write_text(stdout + stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    failed = (lines[-1] if lines else f"exit code {process.returncode}") + hung
    return seconds, cpu, sampler.peak_rss / 2**20, failed if process.returncode else ""


def _watched(process: subprocess.Popen, server: S3Server) -> tuple[str, str, str]:
    """(stdout, stderr, "" or what says it hung) of `process`, waited for; killed with its session if it
    and the server both stay idle for STALL_SECONDS (energon, after a worker fails, can wait forever at
    exit for a multiprocessing queue nobody reads any more)."""
    last = (_session_cpu_seconds(process.pid), server.cpu_seconds())
    still_since = time.perf_counter()
    while True:
        try:
            stdout, stderr = process.communicate(timeout=STALL_CHECK)
            return stdout, stderr, ""
        except subprocess.TimeoutExpired:
            now = (_session_cpu_seconds(process.pid), server.cpu_seconds())
            if any(abs(b - a) > IDLE_RATE * STALL_CHECK for a, b in zip(last, now, strict=True)):
                still_since = time.perf_counter()
            last = now
            if time.perf_counter() - still_since >= STALL_SECONDS:
                os.killpg(process.pid, signal.SIGKILL)
                stdout, stderr = process.communicate()
                return (
                    stdout,
                    stderr,
                    f"; then it hung (neither it nor the server used CPU for {STALL_SECONDS:.0f} s) and was killed",
                )


def _session_cpu_seconds(session: int) -> float:
    """The CPU seconds (user and system) of the live processes of `session`."""
    total = 0.0
    for pid in processes_where(SESSION, session):
        try:
            total += process_cpu_seconds(pid)
        except OSError:  # ended meanwhile
            pass
    return total


#: What `index_of` gives: (.tar.idx bytes by name, sqlite contents, the shards in .info.json's order).
Index = tuple[dict[str, bytes], dict, list[str]]


def index_of(server: S3Server, prefix: str, scratch: Path) -> Index:
    """A prepared prefix's index (`Index`), downloaded below `scratch`."""
    folder = scratch / prefix
    client = server.client()

    def download(key: str) -> None:
        target = folder / key[len(prefix) + 1 :]
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(target))

    wanted = (".tar.idx", "/index.sqlite", "/.info.json")
    keys = [key for key in server.keys(BUCKET, prefix + "/") if key.endswith(wanted)]
    with ThreadPoolExecutor(8) as pool:  # (the client's pool holds 10 connections)
        list(pool.map(download, keys))
    meta = folder / ".nv-meta"
    shards = list(json.loads((meta / ".info.json").read_text())["shard_counts"])
    return tar_indexes(folder), sqlite_contents(meta / "index.sqlite"), shards


def settle(server: S3Server, quiet: float = IDLE_RATE, longest: float = 180) -> None:
    """Wait until the server is idle (under `quiet` CPU-seconds a second, over two seconds), up to
    `longest` seconds: after taking in many GB, or deleting an index, Ceph's store compacts and cleans up
    for a while, and a run started then would share the CPUs with that. Each tool starts on an idle server."""
    started = time.perf_counter()
    before, rate = server.cpu_seconds(), 0.0
    while time.perf_counter() - started < longest:
        time.sleep(2)
        now = server.cpu_seconds()
        rate, before = (now - before) / 2, now
        if rate < quiet:
            break
    waited = time.perf_counter() - started
    print(f"  (waited {waited:.0f} s for the server to be idle: {rate:.2f} CPU-seconds a second)", flush=True)


def bench_dataset(
    name: str,
    folder: Path,
    samples: int,
    server: S3Server,
    env: dict,
    scratch: Path,
    tools: list[str],
    flags: tuple[str, ...] = (),
) -> list[Run]:
    size, headers = shards_size(folder), header_bytes(folder)
    print(f"  the shards' headers: {headers:,} B = {100 * headers / size:.2f}% of {size:,} B", flush=True)
    runs, indexes = [], []
    started = time.perf_counter()
    # The shards alone: tools.bench_scale prepares the scale dataset's folder in place, and its index
    # must not come along.
    server.upload_folder(folder, BUCKET, name, "*.tar")
    print(f"  uploaded to the server in {time.perf_counter() - started:.1f} s", flush=True)
    for tool in tools:
        settle(server)
        sent, busy = server.bytes_sent(), server.cpu_seconds()
        seconds, cpu, rss, failed = prepare(tool, f"msc://{PROFILE}/{name}", env, scratch, server, flags)
        read, busy = server.bytes_sent() - sent, server.cpu_seconds() - busy
        runs.append(Run(tool, name, samples, size, seconds, cpu, read, rss, failed=failed, headers=headers))
        print(
            f"  {name:5s} {tool:9s} {seconds:8.2f} s  {samples / seconds:12,.0f} samples/s"
            f"  read {read:,} B = {100 * read / size:6.2f}% of {size:,} B; CPU: the tool's {cpu:.1f} s,"
            f" the server's {busy:.1f} s, together {100 * (cpu + busy) / (seconds * CPUS):.0f}% of the"
            f" machine's {CPUS} CPUs; peak RSS summed over the tool's processes {rss:,.0f} MB"
            + (f"; it FAILED: {failed}" if failed else ""),
            flush=True,
        )
        if len(tools) == 2 and not failed:
            indexes.append(index_of(server, name, scratch / tool))
        remove_index(server, name)  # the next tool finds the shards as this one did: not prepared
    if len(indexes) == 2:
        ours, theirs = indexes
        if ours == theirs:
            print(
                f"  {name}: the two indexes are equal ({len(ours[0])} .tar.idx files, sqlite rows)",
                flush=True,
            )
        else:
            runs[-1].wrong = energon_wrong(name, folder, ours, theirs, scratch)
    server.delete_prefix(BUCKET, name)
    return runs


def energon_wrong(name: str, folder: Path, ours: Index, theirs: Index, scratch: Path) -> str:
    """Where the two indexes differ, Python's tarfile referees: each differing `.tar.idx` and shardprep's
    sample rows of those shards must be what tarfile reads, and everything else (the other shards' rows,
    the schema, the shard order) equal in both. Then energon's index is wrong there, which is reported and
    its time kept, flagged (energon's workers can read each other's answers, see README); anything else
    stops the benchmark. What energon got wrong, in short."""
    differing = sorted(
        tar_idx for tar_idx in set(ours[0]) | set(theirs[0]) if ours[0].get(tar_idx) != theirs[0].get(tar_idx)
    )
    truths = {tar_idx: tarfile_index(folder / tar_idx.removesuffix(".idx")) for tar_idx in differing}
    ids = {
        tar_idx: ours[2].index(tar_idx.removesuffix(".idx"))
        for tar_idx in differing
        if tar_idx.removesuffix(".idx") in ours[2]
    }
    if not (
        differing
        and ours[2] == theirs[2]
        and len(ids) == len(differing)
        and all(ours[0].get(tar_idx) == truth for tar_idx, truth in truths.items())
        and all(_sample_rows(ours, ids[tar_idx]) == _rows_of(truth) for tar_idx, truth in truths.items())
        and _without(ours[1], set(ids.values())) == _without(theirs[1], set(ids.values()))
    ):
        raise SystemExit(
            f"{name}: the two indexes differ, and not only where energon's is wrong:\n"
            f"{differences(ours, theirs, scratch)}"
        )
    lost = {tar_idx[:-4]: (len(truth) // 8 - 1, theirs[0].get(tar_idx)) for tar_idx, truth in truths.items()}
    shown = ", ".join(
        f"{shard}: {'no .tar.idx' if got is None else f'{len(got) // 8 - 1:,}'} of {true:,} samples"
        for shard, (true, got) in list(lost.items())[:3]
    )
    summary = f"wrong in {len(lost)} shard{'s' if len(lost) > 1 else ''} ({shown}{', ...' if len(lost) > 3 else ''})"
    print(
        f"  {name}: energon's index is {summary}, by Python's tarfile, which agrees with shardprep's;"
        " the rest of the two indexes is equal; energon's time is kept, flagged",
        flush=True,
    )
    return summary


def _sample_rows(index: Index, tar_file_id: int) -> list[tuple[int, int]]:
    """(byte_offset, byte_size) of the shard's samples, in order (energon's `samples` columns: tar_file_id,
    sample_key, sample_index, byte_offset, byte_size)."""
    rows = [row for row in index[1]["samples"]["rows"] if row[0] == tar_file_id]
    return [(row[3], row[4]) for row in sorted(rows, key=lambda row: row[2])]


def _rows_of(tar_index: bytes) -> list[tuple[int, int]]:
    offsets = struct.unpack(f"<{len(tar_index) // 8}Q", tar_index)
    return [(start, end - start) for start, end in zip(offsets[:-1], offsets[1:], strict=True)]


def _without(contents: dict, ids: set[int]) -> dict:
    """sqlite contents without the rows of the shards `ids` (column 0 of both tables is tar_file_id)."""
    return {
        table: {**parts, "rows": [row for row in parts["rows"] if row[0] not in ids]}
        for table, parts in contents.items()
    }


def tarfile_index(shard: Path) -> bytes:
    """`shard`'s `.tar.idx` as Python's tarfile reads it: each sample's first header offset (a sample being
    the members whose names agree up to the first dot, as in this benchmark's shards), then where the last
    member ends."""
    offsets, last = [], None
    with tarfile.open(shard) as tar:
        for member in tar:
            key = member.name.split(".", 1)[0]
            if member.isreg() and key != last:
                offsets.append(member.offset)
                last = key
        offsets.append(tar.offset)
    return struct.pack(f"<{len(offsets)}Q", *offsets)


def differences(ours: Index, theirs: Index, scratch: Path) -> str:
    """What differs between two `index_of` results, and what each tool printed."""
    lines = []
    for name in sorted(set(ours[0]) | set(theirs[0])):
        if ours[0].get(name) != theirs[0].get(name):
            sizes = [len(index[0][name]) if name in index[0] else "missing" for index in (ours, theirs)]
            lines.append(f"  {name}: {sizes[0]} / {sizes[1]} bytes")
    for table in sorted(set(ours[1]) | set(theirs[1])):
        a, b = ours[1].get(table, {}), theirs[1].get(table, {})
        if a != b:
            rows = [len(contents.get("rows", ())) for contents in (a, b)]
            same = "same schema" if {**a, "rows": None} == {**b, "rows": None} else "schemas differ"
            lines.append(f"  sqlite table {table}: {rows[0]:,} / {rows[1]:,} rows, {same}")
    for tool in ("shardprep", "energon"):
        lines.append(f"{tool} printed (the end):\n{(scratch / f'{tool}.out').read_text()[-3000:]}")
    return "\n".join(lines)


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
    parser.add_argument(
        "--server",
        choices=["auto", "moto", "ceph"],
        default="auto",
        help="the S3 server on loopback (auto: Ceph's gateway where its daemons are installed, else moto)",
    )
    parser.add_argument("--energon", choices=["run", "skip"], default="run")
    parser.add_argument("--num-workers", type=int, help="shardprep's --num-workers (default: its own)")
    parser.add_argument(
        "--shardprep-flags", default="", help="more flags for shardprep's prepare, such as '--engine ray'"
    )
    parser.add_argument("--cache", type=Path, default=bench_datasets.DEFAULT_ROOT)
    args = parser.parse_args(argv)
    flags = (
        *(["--num-workers", str(args.num_workers)] if args.num_workers else []),
        *shlex.split(args.shardprep_flags),
    )
    load = os.getloadavg()
    print(
        f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, load {load[0]:.2f}",
        flush=True,
    )
    tools = ["shardprep", "energon"] if args.energon == "run" else ["shardprep"]
    scratch = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    if args.server == "auto":
        args.server = "ceph" if ceph.available() else "moto"
    if args.server == "ceph":
        os.environ.update(ceph.CLIENT_ENV)  # (for both tools and this process's own client)
        server: S3Server = ceph.CephS3Server(scratch / "ceph")
    else:
        os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(1 << 20))  # (the server inherits it)
        server = S3Server(scratch / "moto.log", counted=True)
    print(f"server: {SERVERS[args.server]}", flush=True)
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
            runs += bench_dataset(name, folder, samples, server, env, scratch, tools, flags)
        print(
            "\ndataset   shardprep samples/s   energon samples/s   ratio   bytes read: shardprep / energon"
            "   tools' CPU: shardprep / energon   peak RSS sum: shardprep / energon   headers (the least)"
        )
        for name in args.datasets.split(","):
            ours = next(run for run in runs if run.dataset == name and run.tool == "shardprep")
            theirs = next((run for run in runs if run.dataset == name and run.tool == "energon"), None)
            if theirs is None or theirs.failed:
                print(
                    f"{name:8s}  {ours.rate:19,.0f}   {'failed' if theirs else '-':>17s}   {'-':>5s}"
                    f"   {ours.read_percent:6.2f}% / -{'':>23s}{ours.cpu_seconds:8.1f} s / -"
                    f"{'':>21s}{ours.peak_rss_mb:7,.0f} MB / -{'':>18s}{ours.floor_percent:6.2f}%"
                    + (f"; energon stopped after {theirs.seconds:.1f} s: {theirs.failed}" if theirs else "")
                )
                continue
            print(
                f"{name:8s}  {ours.rate:19,.0f}   {theirs.rate:17,.0f}   {ours.rate / theirs.rate:5.1f}x"
                f"   {ours.read_percent:6.2f}% / {theirs.read_percent:6.2f}%"
                f"{'':>21s}{ours.cpu_seconds:8.1f} s / {theirs.cpu_seconds:.1f} s"
                f" ({theirs.cpu_seconds / ours.cpu_seconds:.1f}x)"
                f"   {ours.peak_rss_mb:7,.0f} MB / {theirs.peak_rss_mb:,.0f} MB"
                f"   {ours.floor_percent:6.2f}%"
                + (f"; energon's index {theirs.wrong}" if theirs.wrong else "")
            )
        print(
            "issue 14's target: at least 10x energon, and under 2% of the dataset read for text shards;"
            " no tool that indexes every member reads less than the shards' headers (the last column)."
        )
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
