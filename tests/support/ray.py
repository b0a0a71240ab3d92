"""A real local Ray instance for the engine tests, started and stopped by the test module."""

from __future__ import annotations

import contextlib
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
    shut it down afterwards. Skips when Ray is not installed or cannot start on this machine. Its token
    is the run's own, as a local instance of the engine's is (`token_of_its_own`): Ray would write one to
    ~/.ray/auth_token, which every later `ray start` of the machine's user then finds."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    from prep.engines.ray_cluster import token_of_its_own

    with token_of_its_own():
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


def ray_head(folder: Path, cpus: int, token: Path | None = None) -> Iterator[str]:
    """Start the head node of a new Ray cluster offering `cpus` CPUs to tasks, through Ray's own CLI (as a
    user does, `ray start --head`), its files under `folder`; yield its address; stop it afterwards by
    killing each process of it (not with `ray stop`, which ends every Ray of this machine's user).

    Token authentication is on with `token` (a file holding the cluster's token) and off without: with a
    token in ~/.ray, `ray start` would turn it on by itself."""
    port = free_port()
    options = [f"--port={port}", "--include-dashboard=false", f"--temp-dir={folder}"]
    head = RayNode(["--head", f"--num-cpus={cpus}", *options], token)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        head.kill(also=processes_mentioning(folder))


class RayNode:
    """A node of a test's Ray cluster, started through `ray start ARGS` (`token`: as for `ray_head`) in a
    session of its own, which every process of the node inherits (Ray's agents rename themselves, so not
    all of them can be told by their command line). Skips the test when Ray cannot start here."""

    def __init__(self, args: list[str], token: Path | None = None) -> None:
        ray = shutil.which("ray", path=str(Path(sys.executable).parent))
        if ray is None:
            pytest.skip("Ray is not installed (pip install shardprep[ray])")
        env = {name: value for name, value in os.environ.items() if not name.startswith("RAY_AUTH_")}
        env["RAY_AUTH_MODE"] = "disabled" if token is None else "token"
        if token is not None:
            env["RAY_AUTH_TOKEN_PATH"] = str(token)
        self._starting = subprocess.Popen(
            [ray, "start", *args, "--disable-usage-stats"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, errors = self._starting.communicate(timeout=120)
        except BaseException:
            self.kill()
            raise
        if self._starting.returncode != 0:
            self.kill()
            pytest.skip(f"a Ray node cannot start here: {errors.strip()[-500:]}")

    def leave(self) -> None:
        """Leave the cluster as a node an autoscaler scales down does: its raylet is told to stop
        (SIGTERM) and tells the head at once; a raylet killed outright is noticed only by the head's
        health checks, some 15 s later. The node's other processes stay until `kill`."""
        for pid in processes_where(SESSION, self._starting.pid):
            with contextlib.suppress(OSError):  # gone meanwhile
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    os.kill(pid, signal.SIGTERM)
                    end_process(pid, wait=10)

    def kill(self, also: dict[int, str] | None = None) -> None:
        """Kill every process of the node (and the processes `also`), and wait until they are gone.
        Outright: on SIGTERM Ray's processes take many seconds to end, and a test's node holds nothing."""
        node = set(processes_where(SESSION, self._starting.pid)) | set(also or {})
        for pid in node:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in node:
            end_process(pid, wait=10)  # gone, not only told to go
