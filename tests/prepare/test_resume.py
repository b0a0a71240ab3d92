"""`prepare --resume`: a run killed or failed midway keeps the rows of the shards it finished; a rerun
with the same arguments reuses them, says how many, scans the rest and any shard changed since, and
writes exactly what a clean run writes. The checkpoint is gone once the index is in place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prep.errors import ShardError
from prep.prepare import prepare_dataset
from prep.prepare.resume import RESUME_DIR
from tests.support.prepare import REPO, prepared_outputs, run_shardprep, twin
from tests.support.shards import sample_members, without_end_marker, write_tarfile

FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--shuffle-tars", "--no-progress", "--crude"]


def write_dataset(root: Path, shards: int, samples: int) -> Path:
    for n in range(shards):
        write_tarfile(root / f"shard-{n:04d}.tar", sample_members(f"s{n}-", samples))
    return root


def reused(stdout: str) -> tuple[int, int]:
    """(reused, total) from the line a resumed run prints."""
    line = next(line for line in stdout.splitlines() if line.startswith("Resuming:"))
    words = line.split()
    return int(words[1]), int(words[3])


def test_a_killed_prepare_resumes_with_the_shards_it_finished(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "dataset", 200, 200)
    clean = twin(root, "clean")
    command = [sys.executable, "-m", "prep", "prepare", str(root), *FLAGS, "--num-workers", "1", "--resume"]
    run = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    checkpoint = root / RESUME_DIR
    deadline = time.monotonic() + 60
    while run.poll() is None and time.monotonic() < deadline:
        if checkpoint.is_dir() and sum(name.endswith(".record") for name in os.listdir(checkpoint)) >= 20:
            os.kill(run.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    assert run.wait() == -signal.SIGKILL, "the prepare ended before it could be killed midway"
    assert not (root / ".nv-meta").exists()

    result = run_shardprep("prepare", str(root), *FLAGS, "--resume", check=True)
    count, total = reused(result.stdout)
    assert total == 200 and 20 <= count < 200
    run_shardprep("prepare", str(clean), *FLAGS, check=True)
    assert prepared_outputs(root) == prepared_outputs(clean)
    assert not checkpoint.exists(), "the checkpoint outlived the index it was for"


def test_a_failed_prepare_resumes_and_a_shard_changed_since_is_scanned_again(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "dataset", 12, 10)
    bad = root / "shard-0005.tar"
    good_bytes = bad.read_bytes()
    bad.write_bytes(good_bytes[: 512 * 3 + 100])  # cut inside a member: the run fails
    failed = run_shardprep("prepare", str(root), *FLAGS, "--resume")
    assert failed.returncode != 0 and "shard-0005.tar" in failed.stderr
    assert sum(name.endswith(".record") for name in os.listdir(root / RESUME_DIR)) == 11

    bad.write_bytes(good_bytes)
    write_tarfile(root / "shard-0007.tar", sample_members("changed-", 4))  # new content since
    result = run_shardprep("prepare", str(root), *FLAGS, "--resume", check=True)
    assert reused(result.stdout) == (10, 12)
    clean = twin(root, "clean")
    run_shardprep("prepare", str(clean), *FLAGS, check=True)
    assert prepared_outputs(root) == prepared_outputs(clean)
    assert "changed-00000" in str(prepared_outputs(root)["sqlite"]["samples"]["rows"])


def test_without_resume_nothing_is_kept(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "dataset", 3, 4)
    (root / "shard-0001.tar").write_bytes(b"not a tar" * 100)
    assert run_shardprep("prepare", str(root), *FLAGS).returncode != 0
    assert not (root / RESUME_DIR).exists()


def test_the_python_api_resumes_too(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "dataset", 4, 3)
    bad = root / "shard-0002.tar"
    good = bad.read_bytes()
    bad.write_bytes(b"not a tar" * 100)
    with pytest.raises(ShardError):
        prepare_dataset(root, resume=True)
    assert sum(name.endswith(".record") for name in os.listdir(root / RESUME_DIR)) == 3
    bad.write_bytes(good)
    assert sum(prepare_dataset(root, resume=True).values()) == 12
    assert not (root / RESUME_DIR).exists()


def test_a_ray_rerun_that_reuses_every_shard_reaches_no_ray(tmp_path: Path) -> None:
    """Nothing left to scan, nothing to send: no local Ray instance is started (5-15 s) and no cluster
    reached (here an address nothing answers, which reaching would refuse)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    root = write_dataset(tmp_path / "dataset", 3, 4)
    without_end_marker(root / "shard-0001.tar")
    with pytest.raises(ShardError, match="end-of-archive marker"):
        prepare_dataset(root, resume=True, strict=True)  # every shard scanned and kept, then refused
    with pytest.warns(UserWarning, match="shard-0001.tar"):  # indexed to its end, without --strict
        counts = prepare_dataset(root, resume=True, engine="ray", ray_address="127.0.0.1:1")
    assert sum(counts.values()) == 12 and not (root / RESUME_DIR).exists()


@pytest.mark.parametrize("how", ["writable-by-others", "someone-else's", "a-link"])
def test_a_checkpoint_folder_others_could_write_is_refused(tmp_path: Path, how: str) -> None:
    """The checkpoint holds pickles, which run as code when read: a folder another user could have
    written is refused, with what to do, and nothing of it is read."""
    dataset = write_dataset(tmp_path / "dataset", 3, 10)
    folder = dataset / RESUME_DIR
    if how == "a-link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir(mode=0o700)
        if how == "writable-by-others":
            folder.chmod(0o777)
        elif os.getuid() != 0:
            pytest.skip("giving the folder to another user needs root")
        else:
            os.chown(folder, 65534, 65534)
    (folder / "planted.record").write_bytes(b"not read")
    result = run_shardprep("prepare", str(dataset), "--non-interactive", "--split-ratio", "1,0,0", "--resume")
    assert result.returncode != 0
    assert "is not safe to resume from" in result.stderr and str(folder) in result.stderr
