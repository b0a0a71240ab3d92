"""All-or-nothing runs: staged files land together on commit, and vanish, with the folders the run made,
when the run ends any other way."""

from __future__ import annotations

from pathlib import Path

import pytest

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
