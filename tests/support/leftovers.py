"""What a test run may leave behind, found and cleaned up: FUSE mounts and processes of ours.

The suite must end with no mount and no process of its own left, on a machine with Debian's fuse3 and
on one without it (where root mounts through mount(2) and `fusermount3` is not there to unmount). So
tests unmount through the product's own `prep.mount.device.unmount`, and `tests/conftest.py` checks at
the end of the session that nothing under the session's temporary folder is still mounted or running.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from prep.mount.device import mount_table, mounted_here, unmount


def unmount_quietly(mountpoint: Path, server_pid: int | None = None) -> None:
    """Unmount `mountpoint` if it is mounted (lazily, so open files cannot stop it), then wait up to 5 s
    for its server process to end and kill it if it has not: for the clean-up of a test, pass or fail."""
    if mounted_here(str(mountpoint)) is not None:  # a mount whose server died is one too
        unmount(str(mountpoint), lazy=True)
    if server_pid is not None:
        end_process(server_pid)


def end_process(pid: int, wait: float = 5.0) -> bool:
    """Wait up to `wait` seconds for `pid` to exit, then SIGKILL it. True if it had exited by itself."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    return False


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting to be reaped by a parent."""
    try:
        return stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


def mounts_under(folder: Path) -> list[Path]:
    """Mount points at or below `folder`, from this process's mount table."""
    prefix = str(folder.resolve())
    return [Path(point) for point, _ in mount_table() if point == prefix or point.startswith(prefix + "/")]


def processes_mentioning(folder: Path) -> dict[int, str]:
    """Live processes, other than this one and its ancestors, whose command line names a path under
    `folder`: the servers, workers and commands a test started there."""
    mine = {os.getpid()}
    pid = os.getpid()
    while pid > 1:
        pid = int(stat_fields(pid)[PARENT])
        mine.add(pid)
    needle = str(folder.resolve()).encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in command and _alive(int(entry.name)):
            found[int(entry.name)] = command.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: state, parent, process group, ..."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu_seconds(pid: int) -> float:
    """The CPU time process `pid` has used so far, user and system, all its threads."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processes_where(field: int, value: int) -> list[int]:
    """Live processes whose stat field `field` (1: parent pid, 2: process group, 3: session) equals
    `value`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = stat_fields(int(entry.name))
            except OSError:
                continue
            if int(fields[field]) == value and fields[0] != "Z":
                found.append(int(entry.name))
    return found


PARENT, GROUP, SESSION = 1, 2, 3
