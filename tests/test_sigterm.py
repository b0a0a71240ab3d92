"""A test run sent SIGTERM stops as after Ctrl-C: its session's teardown runs, so the servers it started
stop with it (`tests.support.sigterm`), while a process the run forked still dies of SIGTERM at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

A_RUN = """
import multiprocessing, os, pathlib, time
import pytest

HERE = pathlib.Path(__file__).parent

@pytest.fixture(scope="session")
def server():
    yield
    (HERE / "stopped").write_text("the session's teardown ran")

def sleep_forever():
    # Said from the child itself, once its fork hooks have run: a SIGTERM before then, while it still had
    # the run's handler, would be lost (the hook raises, or the reset finds the signal pending).
    (HERE / "child").write_text(str(os.getpid()))
    time.sleep(60)

def test_waits(server):
    child = multiprocessing.get_context("fork").Process(target=sleep_forever)
    child.start()
    child.join()
    (HERE / "child-exit").write_text(str(child.exitcode))
    (HERE / "waiting").write_text("")
    time.sleep(60)
"""


def _wait_for(path: Path, seconds: float = 20) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        time.sleep(0.05)
    return path.read_text()


def test_sigterm_runs_the_sessions_teardown_and_a_forked_child_still_dies_of_it(tmp_path):
    (tmp_path / "test_a_run.py").write_text(textwrap.dedent(A_RUN))
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.sigterm"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        os.kill(int(_wait_for(tmp_path / "child")), signal.SIGTERM)
        assert _wait_for(tmp_path / "child-exit") == str(-signal.SIGTERM), (
            "the forked child did not die of it"
        )
        _wait_for(tmp_path / "waiting")
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=20)
    finally:
        run.kill()
    assert (tmp_path / "stopped").exists(), f"the session's teardown did not run:\n{output}"
    assert run.returncode == 2 and "SIGTERM" in output, output
