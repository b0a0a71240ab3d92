"""Run a command as a child process and measure its wall time and the peak memory of its whole process tree.

Three memory figures, because one number alone misleads when a program forks workers:

- ``peak_tree_rss``: the largest sum of RSS over the child and all its descendants, sampled from /proc every
  ``interval`` seconds. Pages shared between a parent and its forked workers count once per process, so this
  is an upper bound; it is the figure benchmark targets are checked against.
- ``peak_tree_pss``: the same sampling with PSS (shared pages divided among their sharers), the honest total.
- ``peak_tree_anon``: the same sampling of RSS minus its file-backed and shared-memory part (statm's
  ``resident - shared``): memory the tree allocated itself, without page-cache pages it merely mapped
  (an mmap-ed shard shows up in RSS, but not here).
- ``max_process_rss``: ``ru_maxrss`` of the command, i.e. the high-water mark of the largest single process
  in its tree (the kernel folds in every descendant that was waited for). Sampling can miss a short spike;
  this cannot, so the tree peak is never reported below it.

A child forked from this (Python, tens of MB) process inherits its parent's high-water mark until it execs,
which would put a floor of our own size under every ``ru_maxrss``. So when GNU time is installed the command
is launched through it (``/usr/bin/time -f %M``, a ~2 MB process) and its ``wait4`` figure is used; without
it the figure comes from our own ``wait4`` and ``max_process_rss_clean`` is False.

The measuring process makes itself a child subreaper (Linux), so workers orphaned by an exiting parent stay in
the tree and are still counted.

    python -m tools.measure -- tar -tf some.tar
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
PR_SET_CHILD_SUBREAPER = 36
MB = 1024 * 1024
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Measurement:
    """What one run of a command cost."""

    argv: tuple[str, ...]
    returncode: int
    wall_seconds: float
    peak_tree_rss: int  # bytes
    peak_tree_pss: int  # bytes
    peak_tree_anon: int  # bytes
    max_process_rss: int  # bytes
    peak_process_count: int
    user_seconds: float
    system_seconds: float
    max_process_rss_clean: bool
    other_cpu_seconds: float  # CPU the rest of the machine used meanwhile (other programs, the sampler)

    @property
    def other_cores(self) -> float:
        """Average number of cores busy with something else during the run: contention, if well above 0."""
        return self.other_cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def peak_tree_rss_mb(self) -> float:
        return self.peak_tree_rss / MB

    @property
    def peak_tree_pss_mb(self) -> float:
        return self.peak_tree_pss / MB

    @property
    def peak_tree_anon_mb(self) -> float:
        return self.peak_tree_anon / MB

    @property
    def max_process_rss_mb(self) -> float:
        return self.max_process_rss / MB


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine have spent busy since boot (from /proc/stat), 0 if unknown."""
    try:
        with open("/proc/stat", "rb") as stat:
            fields = stat.readline().split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def _become_subreaper() -> None:
    """Adopt orphaned descendants, so a worker whose parent exits first is still counted (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` from /proc, or None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return None
    # The command name sits in parentheses and may itself hold spaces or parentheses.
    return int(data[data.rfind(b")") + 2 :].split()[1])


def _parent_map(known: dict[int, int] | None = None) -> dict[int, int]:
    """pid -> parent pid for every process visible in /proc.

    With ``known`` (the previous map) only new pids, and pids whose parent has gone (an orphan is
    re-parented), are read again: the sampler runs beside the measured program, and reading every
    process's stat file each time costs a few percent of a core. A pid freed and reused between two
    samples (pids cycle through the whole pid space first) would keep its old parent.
    """
    known = known or {}
    pids = [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]
    present = set(pids)
    parents: dict[int, int] = {}
    for pid in pids:
        parent = known.get(pid)
        if parent is None or (parent not in present and parent > 1):
            parent = _parent_of(pid)
            if parent is None:
                continue
        parents[pid] = parent
    return parents


def descendants(root: int, parents: dict[int, int]) -> set[int]:
    """The pids below ``root`` (not ``root`` itself) in a pid -> parent map."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _memory(pid: int, with_pss: bool) -> tuple[int, int, int]:
    """Resident, proportional and anonymous set size of one process in bytes; zeros once it has gone."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            fields = statm.read().split()
        rss, anon = int(fields[1]) * PAGE_SIZE, (int(fields[1]) - int(fields[2])) * PAGE_SIZE
        if not with_pss:
            return rss, rss, anon
        with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
            for line in rollup:
                if line.startswith(b"Pss:"):
                    return rss, int(line.split()[1]) * 1024, anon
    except (OSError, ValueError, IndexError):
        return 0, 0, 0
    return rss, rss, anon


class TreeSampler(threading.Thread):
    """Samples the memory of every process below the measuring process until stopped."""

    def __init__(self, interval: float, with_pss: bool = True) -> None:
        super().__init__(daemon=True)
        self.excluded: set[int] = set()
        self.interval = interval
        self.with_pss = with_pss
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_anon = 0
        self.peak_count = 0
        self._halt = threading.Event()
        self._me = os.getpid()
        self._parents: dict[int, int] = {}

    def pids(self) -> set[int]:
        """The processes to sum now: every descendant of the measuring process but the excluded."""
        self._parents = _parent_map(self._parents)
        return descendants(self._me, self._parents) - self.excluded

    def sample_once(self) -> None:
        pids = self.pids()
        rss_total = pss_total = anon_total = 0
        for pid in pids:
            rss, pss, anon = _memory(pid, self.with_pss)
            rss_total += rss
            pss_total += pss
            anon_total += anon
        self.peak_rss = max(self.peak_rss, rss_total)
        self.peak_pss = max(self.peak_pss, pss_total)
        self.peak_anon = max(self.peak_anon, anon_total)
        self.peak_count = max(self.peak_count, len(pids))

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample_once()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def gnu_time() -> str | None:
    """Path of GNU time if it is installed and understands ``-f %M``, else None."""
    path = shutil.which("time", path="/usr/bin:/bin:/usr/local/bin")
    if path is None:
        return None
    probe = subprocess.run([path, "-f", "%M", "true"], capture_output=True, text=True)
    return path if probe.returncode == 0 and probe.stderr.strip().isdigit() else None


def measure(
    argv: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: dict[str, str] | None = None,
    stdout: int | object = subprocess.DEVNULL,
    stderr: int | object = subprocess.PIPE,
    interval: float = 0.02,
    with_pss: bool = True,
    launcher: str | None = "auto",
) -> tuple[Measurement, bytes]:
    """Run ``argv`` to completion; return its Measurement and whatever it wrote to stderr (if piped).

    ``launcher`` is the path of GNU time, "auto" to look for it, or None to fork the command directly.
    Only one measurement may run at a time in a process: the sampler counts every descendant of the caller.
    """
    _become_subreaper()
    if launcher == "auto":
        launcher = gnu_time()
    with tempfile.NamedTemporaryFile(prefix="measure-", suffix=".maxrss") as maxrss_file:
        command = list(argv)
        if launcher is not None:
            command = [launcher, "-q", "-f", "%M", "-o", maxrss_file.name, *command]
        sampler = TreeSampler(interval, with_pss)
        busy_before = machine_busy_seconds()
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
        if launcher is not None:
            sampler.excluded.add(process.pid)  # GNU time itself is not part of what is measured
        sampler.start()
        error_output = b""
        if process.stderr is not None:
            # Read before waiting so a chatty child cannot block on a full pipe.
            error_output = process.stderr.read()
            process.stderr.close()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        busy = machine_busy_seconds() - busy_before
        process.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop()
        _reap_orphans()
        max_process_rss = usage.ru_maxrss * 1024  # Linux reports kilobytes
        clean = False
        if launcher is not None:
            reported = Path(maxrss_file.name).read_text().split()
            if reported and reported[-1].isdigit():
                max_process_rss = int(reported[-1]) * 1024
                clean = True
    measurement = Measurement(
        argv=tuple(argv),
        returncode=process.returncode,
        wall_seconds=wall,
        peak_tree_rss=max(sampler.peak_rss, max_process_rss),
        peak_tree_pss=sampler.peak_pss,
        peak_tree_anon=sampler.peak_anon,
        max_process_rss=max_process_rss,
        peak_process_count=max(sampler.peak_count, 1),
        user_seconds=usage.ru_utime,
        system_seconds=usage.ru_stime,
        max_process_rss_clean=clean,
        other_cpu_seconds=max(0.0, busy - usage.ru_utime - usage.ru_stime),
    )
    return measurement, error_output


def _reap_orphans() -> None:
    """Collect descendants that were orphaned onto us and have exited, so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def describe(measurement: Measurement) -> str:
    """One line for people: wall time and the three memory figures."""
    return (
        f"exit {measurement.returncode}  wall {measurement.wall_seconds:.3f} s  "
        f"cpu {measurement.user_seconds + measurement.system_seconds:.2f} s  "
        f"peak tree RSS {measurement.peak_tree_rss_mb:.1f} MB  PSS {measurement.peak_tree_pss_mb:.1f} MB  "
        f"anon {measurement.peak_tree_anon_mb:.1f} MB  "
        f"max process RSS {measurement.max_process_rss_mb:.1f} MB"
        f"{'' if measurement.max_process_rss_clean else ' (includes the launcher at fork)'}  "
        f"processes {measurement.peak_process_count}  "
        f"other load {measurement.other_cores:.2f} cores"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.measure",
        description="Run a command and print its wall time, CPU time and peak memory of its process tree.",
    )
    parser.add_argument(
        "--interval-ms", type=float, default=20.0, help="sampling period of /proc (default 20)"
    )
    parser.add_argument(
        "--no-pss", action="store_true", help="sample RSS only (cheaper; PSS reported as RSS)"
    )
    parser.add_argument("--show-output", action="store_true", help="let the command's stdout through")
    parser.add_argument(
        "--no-launcher", action="store_true", help="fork the command directly, not via GNU time"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    measurement, error_output = measure(
        command,
        stdout=None if args.show_output else subprocess.DEVNULL,
        stderr=None,
        interval=args.interval_ms / 1000,
        with_pss=not args.no_pss,
        launcher=None if args.no_launcher else "auto",
    )
    print(describe(measurement), file=sys.stderr)
    return measurement.returncode


if __name__ == "__main__":
    sys.exit(main())
