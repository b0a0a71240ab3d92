"""SIGTERM ends a test run as Ctrl-C does: the servers the run started are stopped on the way out.

A test run killed with SIGTERM (a CI job cancelled, `timeout`, `kill`) died at once, and its session
fixtures' teardown never ran: Ceph's daemons, started with the run (`tests.conftest.early_ceph`), and a
module's moto server were left running. With `sigterm_unwinds`, SIGTERM in the run's own process raises
KeyboardInterrupt, which pytest unwinds through every fixture's teardown, as it does a Ctrl-C. A process
forked from the run (a test's worker) starts with SIGTERM's default again: it dies at once, as it would
have.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from types import FrameType

import pytest


class Terminated(KeyboardInterrupt):
    """The test run was sent SIGTERM."""


def _unwind(signum: int, frame: FrameType | None) -> None:
    raise Terminated("SIGTERM: the test run stops, and its servers with it")


def _default_in_fork() -> None:
    if signal.getsignal(signal.SIGTERM) is _unwind:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_in_fork)


@pytest.fixture(scope="session", autouse=True)
def sigterm_unwinds() -> Iterator[None]:
    before = signal.signal(signal.SIGTERM, _unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)
