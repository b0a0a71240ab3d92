"""A read-only FUSE filesystem over a prepared dataset: a MountTree served by a FuseSession.

`serve` mounts and answers requests in this process until the filesystem is unmounted (or Ctrl-C /
SIGTERM, which unmount it, serving files still open until they are closed); `serve_in_background` mounts here, so every error still reaches the
caller's terminal and exit status, then leaves the serving to a forked child and returns its pid. What
the server says while it serves goes to the tree's `messages` (`prep.mount.messages`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from prep.errors import PrepError
from prep.mount.device import mount_device, unmount, unmount_if_left_dead
from prep.mount.session import FuseSession, Owner
from prep.mount.tree import MountTree

INIT_TIMEOUT_SECONDS = 30
#: How long files still open at Ctrl-C or SIGTERM are served, at most, before the server ends anyway.
OPEN_FILES_GRACE_SECONDS = 60


def _owner(tree: MountTree) -> Owner:
    modified = os.stat(tree.dataset.meta).st_mtime_ns
    return Owner(os.getuid(), os.getgid(), modified // 10**9, modified % 10**9)


def _mount(tree: MountTree, mountpoint: str) -> int:
    """Mount an empty FUSE filesystem named for the dataset; the device descriptor that serves it."""
    return mount_device(mountpoint, f"shardprep:{tree.dataset.root}")


def _run(session: FuseSession, mountpoint: str, on_ready: Callable[[], None] | None) -> None:
    """Serve until unmounted; Ctrl-C or SIGTERM unmount first (`_stop`), and a watcher unmounts if this
    process ends any other way."""
    guard = unmount_if_left_dead(mountpoint)
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        session.start()
        if not session.initialised.wait(INIT_TIMEOUT_SECONDS):
            unmount(mountpoint, lazy=True)
            raise PrepError(f"The kernel never started the FUSE session at {mountpoint}; it was unmounted.")
        if on_ready is not None:
            on_ready()
        try:
            while not session.finished.wait(1.0):
                pass
        except KeyboardInterrupt:
            _stop(session, mountpoint)
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.close(session.device)
        os.close(guard)
        session.tree.close()


def _session(device: int, tree: MountTree, owner: Owner, trace: bool = False) -> FuseSession:
    return FuseSession(device, tree, owner, trace=trace, messages=tree.messages)


def _stop(session: FuseSession, mountpoint: str) -> None:
    """Unmount. If files are open there, detach the mount (no new file opens) and go on serving the open
    ones until the last is closed, which ends the session, for at most OPEN_FILES_GRACE_SECONDS or until
    a second Ctrl-C or SIGTERM; files still open then fail with ENOTCONN."""
    if unmount(mountpoint) is None:
        session.finished.wait(10)
        return
    unmount(mountpoint, lazy=True)
    session.messages.say(
        f"files are still open under {mountpoint}; it is detached, and they are served until they are"
        f" closed (at most {OPEN_FILES_GRACE_SECONDS} s). Ctrl-C again to stop now."
    )
    try:
        session.finished.wait(OPEN_FILES_GRACE_SECONDS)
    except KeyboardInterrupt:
        pass


def serve(
    tree: MountTree, mountpoint: str, *, trace: bool = False, on_ready: Callable[[], None] | None = None
) -> None:
    """Mount `tree` at `mountpoint` and serve it in this process until it is unmounted (or Ctrl-C).

    `on_ready` runs once the kernel has started the session, before anything else is answered.
    """
    owner = _owner(tree)  # before mounting: nothing under the mount point may be read once it is there
    device = _mount(tree, mountpoint)
    _run(_session(device, tree, owner, trace), mountpoint, on_ready)


def serve_in_background(tree: MountTree, mountpoint: str) -> int:
    """Mount `tree` at `mountpoint`, hand the serving to a forked child, and return the child's pid.

    Returns once the child has answered the kernel's first request, so the mount is usable; if the
    child fails before that, the mount is undone and the reason raised here. The child's stdin, stdout and
    stderr are /dev/null: it speaks through `tree.messages`, whose log file (if any) it inherits open.
    """
    owner = _owner(tree)
    device = _mount(tree, mountpoint)
    ready_read, ready_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:  # the server: its own session, no terminal, nothing to print, no folder kept busy
        os.close(ready_read)
        try:
            os.setsid()
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for stream in (0, 1, 2):
                os.dup2(null, stream)
            os.close(null)
            signal.signal(signal.SIGINT, signal.default_int_handler)

            def ready() -> None:
                os.write(ready_write, b"1")
                os.close(ready_write)

            _run(_session(device, tree, owner), mountpoint, ready)
        except BaseException as error:  # noqa: BLE001 - nobody else would hear of it
            tree.messages.say(f"the server of {mountpoint} stopped: {error}")
        finally:
            os._exit(0)
    os.close(ready_write)
    os.close(device)
    tree.messages.close()  # the child's copy stays open
    answered = os.read(ready_read, 1)
    os.close(ready_read)
    if answered != b"1":
        os.waitpid(child, 0)
        unmount(mountpoint, lazy=True)
        kept = tree.messages.where
        said = f" What it said, if anything, is in {kept}." if kept is not None else ""
        raise PrepError(
            f"The mount process for {mountpoint} stopped before the kernel started the session.{said}"
        )
    return child
