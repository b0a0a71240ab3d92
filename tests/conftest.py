"""The whole run's promise: it leaves no FUSE mount and no process of its own behind, also when it is
stopped by Ctrl-C or SIGTERM (`tests.support.sigterm`). And the Ctrl-C the tests send their children
reaches them as a terminal's would, however the run was started."""

from __future__ import annotations

import os
import signal

import pytest

from tests.support import ceph, energon_cli
from tests.support.leftovers import mounts_under, processes_mentioning, unmount_quietly
from tests.support.sigterm import sigterm_unwinds  # noqa: F401 - a session fixture of every run


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_reaches_children():
    """A run started in the background of a shell without job control (`cmd &`, `nohup`) has SIGINT
    ignored, and its children inherit that: the tests' Ctrl-C (SIGINT) would then do nothing. With a
    handler here, a child starts with the default instead, as under a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind(tmp_path_factory):
    """After the last test: no mount below the session's temporary folder, and no process whose command
    line names a path there. Whatever is found is cleaned up, and the run fails naming it."""
    yield
    base = tmp_path_factory.getbasetemp()
    mounts = mounts_under(base)
    for mountpoint in mounts:
        unmount_quietly(mountpoint)
    processes = processes_mentioning(base)
    for pid in processes:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    left = [f"mount {point}" for point in mounts] + [
        f"process {pid}: {cmd}" for pid, cmd in processes.items()
    ]
    assert not left, "the tests left these behind (now cleaned up):\n" + "\n".join(left)


@pytest.fixture(scope="session", autouse=True)
def energon_server(nothing_left_behind):
    """The process `energon` commands are forked from (`tests.support.energon_cli`), ended before the
    check that nothing is left behind."""
    yield energon_cli.SERVER
    energon_cli.SERVER.stop()


#: The tests that need Ceph's gateway (`early_ceph`).
CEPH_TESTS = "tests/storage/test_ceph.py"


@pytest.fixture(scope="session", autouse=True)
def early_ceph(request, tmp_path_factory, nothing_left_behind, sigterm_unwinds):  # noqa: F811 - the import
    """Ceph's gateway, started in the background as the run begins when the run holds `CEPH_TESTS` and
    the daemons are installed (None otherwise): its start, mostly waiting on its daemons, passes beside
    the tests before those. Stopped by them, or at the end of the run at the latest (before the check
    that nothing is left behind, whose fixture this one depends on)."""
    wanted = any(item.nodeid.startswith(CEPH_TESTS) for item in request.session.items)
    if not wanted or not ceph.available():
        yield None
        return
    starting = ceph.StartingCeph(tmp_path_factory.mktemp("ceph"))
    try:
        yield starting
    finally:
        starting.stop()
