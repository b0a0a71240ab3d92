"""All-or-nothing runs: staged files land together on commit, and vanish, with the folders the run made,
when the run ends any other way."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.index.staging import Staging, remove_leftovers


def listing(root: Path) -> dict[str, bytes | None]:
    """Every path under `root`: a file's bytes, None for a folder."""
    return {
        str(path.relative_to(root)): path.read_bytes() if path.is_file() else None
        for path in sorted(root.rglob("*"))
    }


def test_leaving_without_commit_removes_what_was_staged_and_the_folders_made(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    (root / ".nv-meta").mkdir(parents=True)
    (root / ".nv-meta" / "dataset.yaml").write_text("old")
    (root / "kept").mkdir()
    before = listing(root)
    with pytest.raises(KeyboardInterrupt):
        with Staging(root) as staging:
            staging.temp_path(root / "new" / "deeper" / "a.tar").write_bytes(b"a")
            staging.temp_path(root / "kept" / "b.tar").write_bytes(b"b")
            staging.meta_file("index.sqlite").write_bytes(b"db")
            assert (root / "new" / "deeper").is_dir()
            raise KeyboardInterrupt  # Ctrl-C, or SIGTERM as the commands turn it
    assert listing(root) == before


def test_commit_puts_files_in_place_and_swaps_the_index_last(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    (root / ".nv-meta").mkdir(parents=True)
    (root / ".nv-meta" / "dataset.yaml").write_text("the user's")
    (root / ".nv-meta" / "index.sqlite").write_text("old index")
    (root / "train").mkdir()
    (root / "train" / "shard-000.tar.idx").write_bytes(b"old idx")  # replaced; no old copy stays behind
    with Staging(root) as staging:
        staging.temp_path(root / "train" / "shard-000.tar").write_bytes(b"tar")
        staging.tar_index_file("train/shard-000.tar").write_bytes(b"idx")
        staging.meta_file("index.sqlite").write_text("new index")
        assert not (root / "train" / "shard-000.tar").exists()  # nothing is in place before commit
        staging.commit()
    assert listing(root) == {
        ".nv-meta": None,
        ".nv-meta/dataset.yaml": b"the user's",  # carried over: the run did not write a new one
        ".nv-meta/index.sqlite": b"new index",
        "train": None,
        "train/shard-000.tar": b"tar",
        "train/shard-000.tar.idx": b"idx",
    }


def stage_new_versions(root: Path, staging: Staging) -> None:
    """A new version of a.tar.idx to e.tar.idx and of the index, for a dataset made by `old_dataset`."""
    for name in "abcde":
        staging.temp_path(root / f"{name}.tar.idx").write_text(f"new {name}")
    staging.meta_file("index.sqlite").write_text("new index")


def old_dataset(root: Path) -> dict[str, bytes | None]:
    """A prepared dataset's old files (c.tar.idx is a folder, in the way of a new c.tar.idx); its listing."""
    (root / ".nv-meta").mkdir(parents=True)
    (root / ".nv-meta" / "index.sqlite").write_text("old index")
    (root / ".nv-meta" / "dataset.yaml").write_text("the user's")
    for name in "abde":
        (root / f"{name}.tar.idx").write_text(f"old {name}")
    (root / "c.tar.idx").mkdir()
    (root / "c.tar.idx" / "inside").write_text("a user's file")
    return listing(root)


def test_a_rename_failing_at_commit_puts_back_the_files_moved_before_it(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    before = old_dataset(root)
    with pytest.raises(PrepError) as raised:
        with Staging(root) as staging:
            stage_new_versions(root, staging)
            staging.commit()  # a.tar.idx and b.tar.idx are replaced, then c.tar.idx cannot be
    message = str(raised.value)
    assert f"{root / 'c.tar.idx'} in place: Is a directory" in message
    assert f"{root} is as it was before the run" in message
    assert listing(root) == before


@contextmanager
def immutable(path: Path) -> Iterator[None]:
    """`path` made immutable (chattr +i: as root too, renaming it fails with EPERM) while in the block."""
    try:
        subprocess.run(["chattr", "+i", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"chattr +i does not work here: {error}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_an_index_swap_failing_at_commit_puts_back_every_file_moved_before_it(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    old_dataset(root)
    (root / "c.tar.idx" / "inside").unlink()
    (root / "c.tar.idx").rmdir()  # nothing in the way of the files: only the .nv-meta swap fails
    before = listing(root)
    with immutable(root / ".nv-meta"):
        with pytest.raises(PrepError) as raised:
            with Staging(root) as staging:
                stage_new_versions(root, staging)
                staging.commit()
    message = str(raised.value)
    assert f"{root / '.nv-meta'} in place: Operation not permitted" in message
    assert listing(root) == before


def test_a_staging_without_index_made_its_root_and_removes_it_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with Staging(out, meta=False) as staging:
        staging.temp_path(out / "rejects.jsonl").write_text("{}")
        with pytest.raises(ValueError):
            staging.meta_file("dataset.yaml")
    assert not out.exists()


def test_leftovers_of_a_killed_run_are_exactly_what_staging_names(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.tar").write_bytes(b"kept")
    (root / "notes.shardprep-draft.tmp").write_text("a user's file: not a staged name")
    before = listing(root)
    staging = Staging(root)  # never committed nor aborted, as when SIGKILL ends the run
    staging.temp_path(root / "sub" / "b.tar").write_bytes(b"b")
    staging.temp_path(root / "c.tar.idx").write_bytes(b"c")
    staging.meta_file("index.sqlite").write_bytes(b"db")
    assert remove_leftovers(root) == 3
    assert listing(root) == before
