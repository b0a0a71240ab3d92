"""One run at a time per dataset: a second prepare or write refuses, naming the first; a killed run's lock
is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.index.lock import LOCK_FILE, dataset_lock
from tests.support.prepare import REPO, run_shardprep, snapshot
from tests.support.shards import sample_members, write_tarfile

FLAGS = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress", "--crude", "--force-overwrite"]


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "dataset"
    for number in range(2):
        write_tarfile(root / f"shard-{number}.tar", sample_members(f"s{number}-", 4))
    return root


def test_a_run_on_a_locked_dataset_refuses_naming_the_owner_and_changes_nothing(dataset: Path) -> None:
    run_shardprep("prepare", str(dataset), *FLAGS, check=True)
    source = dataset.parent / "rows.jsonl"
    source.write_text('{"text": "a"}\n')
    write = ["write", str(source), str(dataset), "--overwrite"]
    with dataset_lock(dataset, "prepare"):
        before = snapshot(dataset)
        for command in (["prepare", str(dataset), *FLAGS], write):
            result = run_shardprep(*command)
            assert result.returncode != 0
            assert f"{dataset} is being written by another run" in result.stderr
            assert f"pid {os.getpid()} on host {socket.gethostname()}" in result.stderr
            assert "`shardprep prepare`" in result.stderr and "Traceback" not in result.stderr
            assert snapshot(dataset) == before
    assert not (dataset / LOCK_FILE).exists()
    run_shardprep("prepare", str(dataset), *FLAGS, check=True)


def test_the_lock_is_exclusive_within_one_process_too(dataset: Path) -> None:
    with dataset_lock(dataset, "write"):
        with pytest.raises(PrepError, match="`shardprep write`, pid"):
            with dataset_lock(dataset, "prepare"):
                pass


def test_a_stale_lock_file_of_a_dead_run_is_taken_over(dataset: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    owner = {"pid": int(dead.stdout), "host": socket.gethostname(), "command": "write", "started": "then"}
    (dataset / LOCK_FILE).write_text(json.dumps(owner))
    run_shardprep("prepare", str(dataset), *FLAGS, check=True)
    assert not (dataset / LOCK_FILE).exists()


def test_a_write_into_a_new_folder_that_fails_leaves_no_folder(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    result = run_shardprep("write", str(tmp_path / "bad.jsonl"), str(tmp_path / "new" / "out"))
    assert result.returncode != 0 and "bad.jsonl" in result.stderr
    assert not (tmp_path / "new").exists()


def test_prepare_during_a_write_of_the_same_folder_refuses(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(f'{{"text": "row {number} {"x" * 60}"}}\n' for number in range(200_000)))
    out = tmp_path / "out"
    writing = subprocess.Popen(
        [sys.executable, "-m", "prep", "write", str(source), str(out), "--num-workers", "1", "--no-progress"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not (out / LOCK_FILE).exists():
            assert writing.poll() is None, writing.stderr.read()
            time.sleep(0.005)
        result = run_shardprep("prepare", str(out), *FLAGS)
        still_writing = writing.poll() is None
    finally:
        _, err = writing.communicate(timeout=120)
    assert writing.returncode == 0, err
    assert still_writing, "the write ended before prepare ran: give it more rows"
    assert result.returncode != 0 and "`shardprep write`" in result.stderr, result.stderr
    assert (out / ".nv-meta" / "index.sqlite").is_file() and not (out / LOCK_FILE).exists()
