"""All-or-nothing runs: staged files land together on commit, and vanish, with the folders the run made,
when the run ends any other way."""

from __future__ import annotations

from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.index.staging import Staging, commit_together, remove_leftovers
from tests.support.immutable import immutable


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


def test_stagings_committed_together_are_undone_together_when_a_later_one_fails(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    (first / ".nv-meta").mkdir(parents=True)
    (first / ".nv-meta" / "index.sqlite").write_text("old index")
    (first / "a.tar.idx").write_text("old a")
    (first / "gone.txt").write_text("an old file nothing replaces")
    before = {"first": listing(first), "second": old_dataset(second)}
    with pytest.raises(PrepError) as raised:
        with Staging(first) as one, Staging(second) as two:
            stage_new_versions(first, one)
            one.retire(first / "gone.txt")
            stage_new_versions(second, two)
            commit_together([one, two])  # all of `one` is in place, then c.tar.idx of `two` cannot be
    message = str(raised.value)
    assert f"{second / 'c.tar.idx'} in place: Is a directory" in message
    assert f"{tmp_path} is as it was before the run" in message
    assert {"first": listing(first), "second": listing(second)} == before


def test_an_interrupt_while_a_later_staging_commits_undoes_all_last_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a write with --overwrite: one staging moves the old files aside, the next puts new ones at the
    same paths. Undone in the other order, the old a.tar.idx would go back over the new one, and then out
    with it as a staged file."""
    root = tmp_path / "dataset"
    old_dataset(root)
    (root / "c.tar.idx" / "inside").unlink()
    (root / "c.tar.idx").rmdir()
    before = listing(root)

    def interrupted() -> None:  # as Ctrl-C arrives: the new .tar.idx files are in place, not the index
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with Staging(root) as new, Staging(root, meta=False) as old:  # left in the order WriteRun leaves them
            stage_new_versions(root, new)
            for path in sorted(root.glob("*.tar.idx")):
                old.retire(path)
            monkeypatch.setattr(new, "_swap_meta", interrupted)
            commit_together([old, new])
    assert listing(root) == before


def test_a_retired_path_goes_aside_first_and_is_removed_once_all_is_in_place(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    (root / "old" / "sub").mkdir(parents=True)
    (root / "old" / "sub" / "x.tar").write_text("old shard")
    (root / "a.tar.idx").mkdir()  # a non-empty folder where the new a.tar.idx goes: retired, not in the way
    (root / "a.tar.idx" / "inside").write_text("old")
    with Staging(root) as staging:
        staging.temp_path(root / "a.tar.idx").write_text("new a")
        staging.meta_file("index.sqlite").write_text("new index")
        staging.retire(root / "old")
        staging.retire(root / "a.tar.idx")
        staging.commit()
    assert listing(root) == {
        ".nv-meta": None,
        ".nv-meta/index.sqlite": b"new index",
        "a.tar.idx": b"new a",
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
