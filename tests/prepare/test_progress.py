"""The driver's progress while indexing: shards done of all, samples so far, and each failed shard named
as it comes in (all of them again in the error at the end)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.prepare.run import IndexProgress, PrepareOptions, prepare
from tests.support.shards import sample_members, write_tarfile

OPTIONS = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset", num_workers=2)


def dataset(root: Path, shards: int, broken: int | None = None) -> Path:
    for shard in range(shards):
        write_tarfile(root / f"shard-{shard:02d}.tar", sample_members(f"s{shard}-", 7))
    if broken is not None:
        path = root / f"shard-{broken:02d}.tar"
        path.write_bytes(path.read_bytes()[:1500])  # cut inside a member
    return root


def test_progress_counts_shards_and_samples_in_order(tmp_path: Path) -> None:
    seen: list[IndexProgress] = []
    prepare(dataset(tmp_path / "ds", 6), OPTIONS, progress=seen.append)
    assert [(state.done, state.total, state.samples) for state in seen] == [
        (n, 6, 7 * n) for n in range(1, 7)
    ]
    assert all(state.failed is None for state in seen)


def test_a_failed_shard_is_named_when_it_comes_in(tmp_path: Path) -> None:
    seen: list[IndexProgress] = []
    with pytest.raises(PrepError, match="shard-02.tar"):
        prepare(dataset(tmp_path / "ds", 5, broken=2), OPTIONS, progress=seen.append)
    failed = [(state.done, str(state.failed)) for state in seen if state.failed is not None]
    assert len(failed) == 1 and failed[0][0] == 3 and "shard-02.tar" in failed[0][1]
    assert len(seen) == 5  # the scan goes on, to report every bad shard


def test_the_terminal_shows_rate_eta_and_the_failure(tmp_path: Path) -> None:
    """On a terminal (a real pseudo-terminal here), the line shows samples/s and the failed shard."""
    root = dataset(tmp_path / "ds", 40, broken=3)
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "prep", "prepare", str(root), "--non-interactive", "--split-ratio",
               "1,0,0", "--crude", "--num-workers", "2"]  # fmt: skip
    result = subprocess.run(command, stdin=follower, stdout=follower, stderr=follower, timeout=120)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    text = shown.decode(errors="replace")
    assert result.returncode == 1
    assert "Failed: shard-03.tar" in text
    assert "/40 shards" in text and "samples/s" in text


def test_a_failed_shard_is_named_in_a_log_too(tmp_path: Path) -> None:
    """Not on a terminal (a log): no progress line, but each failed shard is named as it comes in."""
    root = dataset(tmp_path / "ds", 5, broken=1)
    command = [sys.executable, "-m", "prep", "prepare", str(root), "--non-interactive", "--split-ratio",
               "1,0,0", "--crude"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.startswith("Failed: shard-01.tar"), result.stderr
    assert "Indexing" not in result.stderr
    quiet = subprocess.run([*command, "--no-progress"], capture_output=True, text=True, timeout=120)
    assert "Failed:" not in quiet.stderr and "shard-01.tar" in quiet.stderr


def test_shards_reused_by_resume_are_told_apart_from_those_scanned(tmp_path: Path) -> None:
    """After a resume, the pace counts only this run's work: the progress says which shards came from
    the checkpoint, and how many it holds."""
    root = dataset(tmp_path / "ds", 5, broken=3)
    options = PrepareOptions(split_ratio="1,0,0", sample_type="CrudeWebdataset", num_workers=2, resume=True)
    with pytest.raises(PrepError):
        prepare(root, options)
    write_tarfile(root / "shard-03.tar", sample_members("s3-", 7))
    seen: list[IndexProgress] = []
    prepare(root, options, progress=seen.append)
    assert seen[-1].reused == (4, 4, 28)
    assert [state.reused[0] for state in seen] == [1, 2, 3, 3, 4]  # shard-03 is scanned, in its place
