"""A real local Ray instance for the engine tests, started and stopped by the test module."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.leftovers import SESSION, end_process, processes_mentioning, processes_where
from tests.support.s3 import free_port


def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Start a local Ray instance with 2 CPUs, its files (and so its processes' command lines) under the
    session's temporary folder, where the end-of-run check looks for leftovers; yield the `ray` module;
    shut it down afterwards. Skips when Ray is not installed or cannot start on this machine."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=str(tmp_path_factory.mktemp("ray")),
        )
    except Exception as error:  # noqa: BLE001 - a sandbox without what Ray needs (shared memory, ports)
        ray.shutdown()
        pytest.skip(f"a local Ray instance cannot start here: {error}")
    try:
        yield ray
    finally:
        ray.shutdown()


def ray_head(folder: Path, cpus: int) -> Iterator[str]:
    """Start the head node of a new Ray cluster offering `cpus` CPUs to tasks, through Ray's own CLI (as a
    user does, `ray start --head`), its files under `folder`; yield its address; stop it afterwards by
    killing each process of it (not with `ray stop`, which ends every Ray of this machine's user).

    Token authentication is off for it: with a token in ~/.ray, `ray start` turns it on and a driver given
    an address does not (Ray 2.60), which could then not connect."""
    ray = shutil.which("ray", path=str(Path(sys.executable).parent))
    if ray is None:
        pytest.skip("Ray is not installed (pip install shardprep[ray])")
    port = free_port()
    command = [ray, "start", "--head", f"--num-cpus={cpus}", f"--port={port}", "--include-dashboard=false"]
    command += ["--disable-usage-stats", f"--temp-dir={folder}"]
    # In a session of its own, which every process of the head inherits: Ray's agents rename themselves,
    # so not all of them name `folder` on their command line.
    starting = subprocess.Popen(
        command,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, errors = starting.communicate(timeout=120)
        if starting.returncode != 0:
            pytest.skip(f"a Ray head cannot start here: {errors.strip()[-500:]}")
        yield f"127.0.0.1:{port}"
    finally:
        # Killed outright: on SIGTERM Ray's processes take many seconds to end, and the head holds nothing.
        head = set(processes_where(SESSION, starting.pid)) | set(processes_mentioning(folder))
        for pid in head:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in head:
            end_process(pid, wait=10)  # gone, not only told to go
