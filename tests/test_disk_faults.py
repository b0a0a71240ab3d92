"""A full disk and a read-only folder, for real (a small tmpfs, as root): prepare and write stop with a
clear message, exit non-zero, and leave what was there before exactly as it was."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.support.prepare import run_shardprep, snapshot
from tests.support.shards import sample_members, write_tarfile

FLAGS = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress", "--crude", "--force-overwrite"]


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MiB tmpfs at tmp_path/disk, unmounted afterwards whatever happens."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path, leave: int = 4096) -> Path:
    """Fill the disk until fewer than `leave` bytes are free; returns the filler file."""
    filler = disk / "filler"
    with filler.open("wb") as out:
        while (usage := os.statvfs(disk)).f_bavail * usage.f_frsize > leave:
            try:
                out.write(bytes(min(65536, usage.f_bavail * usage.f_frsize - leave // 2)))
                out.flush()
            except OSError:
                break
    return filler


def without(state: dict, *names: str) -> dict:
    return {name: value for name, value in state.items() if name not in names}


def clean_failure(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr


def test_prepare_on_a_full_disk_stops_clearly_and_keeps_the_previous_index(small_disk: Path) -> None:
    dataset = small_disk / "d"
    for number in range(2):
        write_tarfile(dataset / f"s{number}.tar", sample_members(f"s{number}-", 60))
    run_shardprep("prepare", str(dataset), *FLAGS, check=True)
    write_tarfile(dataset / "s2.tar", sample_members("s2-", 60))  # more to index than room for it
    before = snapshot(dataset)
    fill(small_disk)
    clean_failure(run_shardprep("prepare", str(dataset), *FLAGS), "No space left", "as it was before")
    assert snapshot(dataset) == before


def test_write_on_a_full_disk_stops_clearly_and_keeps_the_old_dataset(
    small_disk: Path, tmp_path: Path
) -> None:
    out = small_disk / "out"
    (tmp_path / "small.jsonl").write_text('{"text": "the old dataset"}\n')
    run_shardprep("write", str(tmp_path / "small.jsonl"), str(out), check=True)
    before = snapshot(out)
    (tmp_path / "big.jsonl").write_text("".join(f'{{"text": "{"z" * 500} {n}"}}\n' for n in range(4000)))
    fill(small_disk, leave=64 * 1024)
    result = run_shardprep(
        "write", str(tmp_path / "big.jsonl"), str(out), "--overwrite", "--num-workers", "1"
    )
    clean_failure(result, "No space left", "as it was before")
    assert snapshot(out) == before
    new_out = small_disk / "new"
    clean_failure(run_shardprep("write", str(tmp_path / "big.jsonl"), str(new_out)), "No space left")
    assert not new_out.exists()


def test_a_read_only_folder_is_refused_clearly(small_disk: Path, tmp_path: Path) -> None:
    dataset = small_disk / "d"
    write_tarfile(dataset / "s0.tar", sample_members("s0-", 5))
    (tmp_path / "rows.jsonl").write_text('{"text": "a"}\n')
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    before = snapshot(dataset)
    clean_failure(run_shardprep("prepare", str(dataset), *FLAGS), "Read-only file system")
    clean_failure(
        run_shardprep("write", str(tmp_path / "rows.jsonl"), str(dataset / "out")), "Read-only file system"
    )
    assert snapshot(dataset) == before


def test_a_disk_filled_by_the_shards_index_files_is_named_not_the_shards(small_disk: Path) -> None:
    """A full disk met where a worker writes a shard's `.tar.idx` is the run's problem, reported as the
    full disk it is (as one met writing index.sqlite is), not as each shard scanned since failing to be
    indexed, with nothing said of the space to free."""
    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    dataset = small_disk / "d"
    for number in range(4):  # each .tar.idx 24 KB
        members = [(f"s{number}-{i:05d}.txt", b"") for i in range(3000)]
        write_tarfile(dataset / f"s{number}.tar", members, fmt=tarfile.USTAR_FORMAT)
    usage = os.statvfs(small_disk)
    # room for index.sqlite's first pages, not for one .tar.idx
    (small_disk / "filler").write_bytes(bytes(usage.f_bavail * usage.f_frsize - 40 * 1024))
    result = run_shardprep("prepare", str(dataset), *FLAGS, "--num-workers", "2")
    clean_failure(result, "No space left on the device", "Free some space there")
    assert "could not be indexed" not in result.stderr
