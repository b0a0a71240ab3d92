"""Worker processes for prepare and write: results in task order, and a dead worker is an error, not a hang."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.index.lock import LOCK_FILE
from prep.processes import WorkerTraceback, ordered_map, worker_count
from tests.support.leftovers import GROUP, PARENT, processes_where
from tests.support.prepare import REPO, run_shardprep, snapshot


def square_slowly_in_reverse(number: int, count: int) -> tuple[int, int]:
    import time

    time.sleep(0.01 * (count - number))  # the first tasks finish last
    return number, number * number


def die_on_three(number: int) -> int:
    if number == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return number


def test_results_come_in_task_order_whatever_order_workers_finish_in() -> None:
    tasks = [(number, 12) for number in range(12)]
    results = list(ordered_map(square_slowly_in_reverse, tasks, 3, what="squaring"))
    assert results == [(number, number * number) for number in range(12)]
    assert list(ordered_map(square_slowly_in_reverse, tasks[:2], 1, what="squaring")) == results[:2]


def test_the_workers_end_when_the_last_result_is_taken() -> None:
    """A caller that takes exactly as many results as it gave tasks (and never asks for one more) must not
    leave the workers running while it holds the map."""
    tasks = [(number, 4) for number in range(4)]
    before = set(processes_where(PARENT, os.getpid()))
    mapped = ordered_map(square_slowly_in_reverse, tasks, 2, what="squaring")
    taken = [next(mapped) for _ in tasks]
    assert taken == [(number, number * number) for number in range(4)]
    assert set(processes_where(PARENT, os.getpid())) <= before, "workers outlived the last result"
    mapped.close()


def test_a_worker_killed_mid_run_ends_it_with_an_error_naming_the_work() -> None:
    with pytest.raises(PrepError, match="A process writing shards died unexpectedly"):
        list(ordered_map(die_on_three, [(number,) for number in range(8)], 2, what="writing shards"))


def refuse_five(number: int) -> int:
    if number == 5:
        raise PrepError(f"shard {number} is bad")
    return number


def test_an_error_in_a_worker_comes_back_in_task_order_with_its_traceback() -> None:
    taken = []
    with pytest.raises(PrepError, match="shard 5 is bad") as raised:
        for number in ordered_map(refuse_five, [(number,) for number in range(9)], 3, what="checking"):
            taken.append(number)
    assert taken == [0, 1, 2, 3, 4]
    assert isinstance(raised.value.__cause__, WorkerTraceback)
    assert "in refuse_five" in str(raised.value.__cause__)


def unpicklable(number: int) -> object:
    return lambda: number


def test_a_result_that_cannot_be_sent_back_is_an_error_naming_the_function() -> None:
    with pytest.raises(RuntimeError, match="unpicklable returned what cannot be sent"):
        list(ordered_map(unpicklable, [(1,), (2,)], 2, what="checking"))


def test_worker_count_is_one_per_task_at_most_and_refuses_zero() -> None:
    assert worker_count(8, 3) == 3 and worker_count(None, 1) == 1
    with pytest.raises(PrepError, match="--num-workers must be at least 1"):
        worker_count(0, 5)


# SIGKILL of the run itself (the OOM killer, a cluster scheduler): its workers must not outlive it.

ROWS = 400_000


@pytest.fixture(scope="module")
def rows_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kill-source") / "rows.jsonl"
    filler = "x" * 40
    path.write_text("".join(f'{{"text": "row {number} {filler}"}}\n' for number in range(ROWS)))
    return path


@pytest.fixture(scope="module")
def many_shards(rows_jsonl, tmp_path_factory) -> Path:
    """40 shards of 10,000 samples: prepare runs long enough on them (about 0.5 s) to be killed mid-run."""
    dataset = tmp_path_factory.mktemp("kill-dataset") / "dataset"
    run_shardprep("write", str(rows_jsonl), str(dataset), "--part", "text=txt", check=True)
    shutil.rmtree(dataset / ".nv-meta")
    for index in dataset.glob("*.tar.idx"):
        index.unlink()
    return dataset


def sigkill_mid_run(args: list[str], delay: float, sent: signal.Signals = signal.SIGKILL) -> int:
    """Start `shardprep ARGS` in its own process group, wait until its first worker is up and then
    `delay` seconds more, send it `sent`, and check that within 2 s no process of its group is left.
    Returns its exit code."""
    process = subprocess.Popen(
        [sys.executable, "-m", "prep", *args],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not processes_where(PARENT, process.pid):
            assert process.poll() is None, "the run ended before it started a worker"
            time.sleep(0.002)
        time.sleep(delay)
        # A run may start its workers in waves (write plans in a short-lived child first): on a loaded
        # machine the delay can fall between two waves, so wait for the next worker to be up.
        while not processes_where(PARENT, process.pid):
            assert process.poll() is None, (
                f"the run ended within {delay} s of its first worker: give it more data"
            )
            time.sleep(0.002)
        os.kill(process.pid, sent)
        process.wait(timeout=30)
        deadline = time.monotonic() + 2
        while processes_where(GROUP, process.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        left = processes_where(GROUP, process.pid)
        assert not left, f"processes of the killed run still alive 2 s later: {left}"
        return process.returncode
    finally:
        for pid in processes_where(GROUP, process.pid):
            os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.12])
def test_prepare_killed_mid_run_leaves_no_worker_and_a_rerun_succeeds(many_shards, tmp_path, delay):
    dataset = shutil.copytree(many_shards, tmp_path / "dataset")
    command = ["prepare", str(dataset), "--non-interactive", "--split-ratio", "1,0,0", "--num-workers", "2"]
    sigkill_mid_run(command, delay)
    run_shardprep(*command, check=True)
    assert (dataset / ".nv-meta" / "index.sqlite").is_file()


@pytest.mark.parametrize("delay", [0.0, 0.3, 0.8])
def test_write_killed_mid_run_leaves_no_worker_and_a_rerun_succeeds(rows_jsonl, tmp_path, delay):
    out = tmp_path / "out"
    command = ["write", str(rows_jsonl), str(out), "--num-workers", "2"]
    sigkill_mid_run(command, delay)
    assert not (out / ".nv-meta").exists(), "a killed write left a dataset that looks complete"
    run_shardprep(*command, check=True)  # no --overwrite: what the killed run staged is not a dataset
    assert sorted(path.name for path in out.iterdir()) == [
        ".nv-meta",
        *sorted(
            f"shard-{number:06d}.tar{suffix}" for number in range(ROWS // 10_000) for suffix in ("", ".idx")
        ),
    ]


@pytest.mark.parametrize("delay", [0.05, 0.4, 0.7])
def test_a_write_over_a_dataset_killed_mid_run_leaves_the_old_one_whole(rows_jsonl, tmp_path, delay):
    out = tmp_path / "out"
    old_source = tmp_path / "old.jsonl"
    old_source.write_text('{"text": "the old dataset"}\n')
    run_shardprep("write", str(old_source), str(out), check=True)
    before = snapshot(out)
    sigkill_mid_run(["write", str(rows_jsonl), str(out), "--num-workers", "2", "--overwrite"], delay)
    run_shardprep("verify", str(out), check=True)  # removes nothing: verify takes no lock
    left = {name for name in snapshot(out) if ".shardprep-" not in name and name != LOCK_FILE}
    assert left == set(before), "the killed write changed the old dataset"
    assert all(snapshot(out)[name] == before[name] for name in left)


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_mid_run_cleans_up_at_once(many_shards, rows_jsonl, tmp_path, sent):
    dataset = shutil.copytree(many_shards, tmp_path / "dataset")
    before = snapshot(dataset)
    prepare = ["prepare", str(dataset), "--non-interactive", "--split-ratio", "1,0,0", "--num-workers", "2"]
    assert sigkill_mid_run(prepare, 0.05, sent) != 0
    assert snapshot(dataset) == before, "an interrupted prepare left files behind or changed some"
    out = tmp_path / "out"
    assert sigkill_mid_run(["write", str(rows_jsonl), str(out), "--num-workers", "2"], 0.3, sent) != 0
    assert not out.exists(), "an interrupted write into a new folder left it behind"
