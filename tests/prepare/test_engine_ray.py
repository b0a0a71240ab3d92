"""`prepare --engine ray` on a real local Ray instance of 2 CPUs (started and stopped by this module)
writes byte for byte what the local engine writes: every `.tar.idx`, the sqlite rows, `.info.json` and
`split.yaml`. A bad shard is named and nothing is written; progress counts every shard in order. A cluster
none of whose nodes can run a task is said at once."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prep.engines.ray_cluster import STOP_GRACE
from prep.errors import PrepError, ShardError
from prep.index.splits import SHUFFLE_SEED
from prep.prepare import prepare_dataset
from prep.prepare.run import PrepareOptions, Unattended, prepare
from tests.support.prepare import (
    REPO,
    prepared_outputs,
    run_shardprep,
    snapshot,
    twin,
)
from tests.support.ray import local_ray, ray_head
from tests.support.shards import sample_members, tricky_members, write_tarfile

SHARDS = 40  # more than the chunks in flight on 2 CPUs, so results stream back in several rounds
FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--shuffle-tars", "--no-progress", "--crude"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local Ray instance with 2 CPUs, shut down after the module's tests; yields its address."""
    for ray in local_ray(tmp_path_factory):
        yield ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def cluster_without_cpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The head of a Ray cluster, its only node, offering no CPU to tasks (`ray start --head --num-cpus 0`,
    as is usual for a head whose workers join later); stopped after the module's tests. Yields its address."""
    yield from ray_head(tmp_path_factory.mktemp("head"), cpus=0)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """Shards of plain and tricky samples, in sub-folders, in PAX and GNU formats."""
    root = tmp_path / "dataset"
    for n in range(SHARDS):
        members = sample_members(f"s{n}-", 5 + n % 7) + tricky_members(f"t{n}/")
        fmt = tarfile.GNU_FORMAT if n % 2 else tarfile.PAX_FORMAT
        write_tarfile(root / f"part-{n % 3}" / f"shard-{n:04d}.tar", members, fmt)
    return root


def test_ray_and_local_engines_write_the_same_bytes(cluster: str, dataset: Path) -> None:
    local = twin(dataset, "local")
    run_shardprep("prepare", str(local), *FLAGS, "--num-workers", "2", check=True)
    run_shardprep("prepare", str(dataset), *FLAGS, "--engine", "ray", "--ray-address", cluster, check=True)
    ours, theirs = prepared_outputs(dataset), prepared_outputs(local)
    assert len(ours["tar.idx"]) == SHARDS
    assert ours == theirs


def test_python_api_uses_the_ray_already_running(cluster: str, dataset: Path) -> None:
    local = twin(dataset, "local")
    seen: list[tuple[int, int]] = []
    options = PrepareOptions(
        split_ratio="1,1,1", shuffle_seed=SHUFFLE_SEED, sample_type="CrudeWebdataset", engine="ray"
    )
    counts = prepare(dataset, options, progress=lambda state: seen.append((state.done, state.total)))
    assert counts == prepare_dataset(local, split_ratio="1,1,1", sample_type="CrudeWebdataset")
    assert seen == [(done, SHARDS) for done in range(1, SHARDS + 1)]
    assert prepared_outputs(dataset) == prepared_outputs(local)


def test_a_bad_shard_is_named_and_nothing_is_written(cluster: str, dataset: Path) -> None:
    shard = dataset / "part-1" / "shard-0004.tar"
    shard.write_bytes(shard.read_bytes()[: 512 * 3 + 100])  # cut inside a member's data
    before = snapshot(dataset)
    with pytest.raises(ShardError) as raised:
        prepare_dataset(dataset, engine="ray")
    assert "part-1/shard-0004.tar" in str(raised.value)
    assert snapshot(dataset) == before


def test_a_cluster_with_no_cpu_for_a_task_is_said_at_once_and_ctrl_c_stops_the_wait(
    cluster_without_cpus: str, dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray keeps tasks no node can run waiting, without a word, until a node that can joins (an autoscaler
    starts one): the run says so at once, and Ctrl-C ends the wait at once (none of its chunks can have
    started, so none is given STOP_GRACE to end), nothing written."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as the head was started (`ray_head`)
    before = snapshot(dataset)
    command = [sys.executable, "-m", "prep", "prepare", str(dataset), *FLAGS]
    command += ["--engine", "ray", "--ray-address", cluster_without_cpus]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as run:
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in run.stderr], daemon=True).start()
        said, deadline = "", time.monotonic() + 60
        while "no node of" not in said and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                said += lines.get(timeout=1)
        time.sleep(1.5)  # the note comes just before the first chunks go to Ray: Ctrl-C once they wait
        run.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        assert run.wait(timeout=60) != 0
        stopping = time.monotonic() - interrupted
        while not lines.empty():
            said += lines.get()
    assert f"no node of the Ray cluster at {cluster_without_cpus} can run a task of this run now" in said
    assert "each asks for 1 CPU, and its one node offers no CPU to tasks" in said
    assert "--num-cpus N" in said and "run without --ray-address" in said
    assert snapshot(dataset) == before
    assert stopping < STOP_GRACE and "unexpected system state" not in said, f"{stopping:.1f} s: {said}"


def test_the_local_engine_never_imports_ray() -> None:
    check = "import sys, prep.prepare.cli, prep.prepare.run; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", check], cwd=REPO, check=True)


def test_a_ray_address_without_the_ray_engine_is_refused() -> None:
    with pytest.raises(PrepError, match="--ray-address is for --engine ray"):
        PrepareOptions(split_ratio="1,0,0", ray_address="auto")


def test_without_ray_the_ray_engine_is_refused_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when Ray is not installed
    with pytest.raises(PrepError, match=r"pip install shardprep\[ray\]"):
        PrepareOptions(split_ratio="1,0,0", engine="ray")


class Recording(Unattended):
    """The unattended wizard, remembering what a resumed run reports."""

    reused: tuple[int, int] | None = None

    def shards_reused(self, reused: int, total: int) -> None:
        self.reused = (reused, total)


def test_the_ray_engine_resumes_a_failed_run(cluster: str, dataset: Path) -> None:
    local = twin(dataset, "local")
    shard = dataset / "part-2" / "shard-0011.tar"
    good = shard.read_bytes()
    shard.write_bytes(good[: 512 * 3 + 100])
    options = PrepareOptions(split_ratio="8,1,1", shuffle_seed=SHUFFLE_SEED, engine="ray", resume=True)
    with pytest.raises(ShardError):
        prepare(dataset, options)
    shard.write_bytes(good)
    wizard = Recording(options)
    prepare(dataset, options, wizard)
    assert wizard.reused == (SHARDS - 1, SHARDS)
    prepare_dataset(local, split_ratio="8,1,1")
    assert prepared_outputs(dataset) == prepared_outputs(local)
