"""The `--resume` folder: entries go through the folder as it was checked, never its path again."""

from __future__ import annotations

import os
from pathlib import Path

from prep.index.checkpoint import Checkpoint


def test_entries_are_read_from_the_folder_checked_not_one_swapped_in_at_its_path(tmp_path: Path) -> None:
    """Whoever can write the folder above could rename ours away and put theirs in its place between
    the check and a read: the pickles read are still ours."""
    ours = Checkpoint(tmp_path / "dataset")
    ours.save("shard-0", "key", "rows of shard-0", files={".tar": _file(tmp_path / "a.tar", b"ours")})
    theirs = Checkpoint(tmp_path / "elsewhere")
    theirs.save("shard-0", "key", "planted", files={".tar": _file(tmp_path / "b.tar", b"planted")})
    os.rename(ours.folder, tmp_path / "moved")
    os.rename(theirs.folder, ours.folder)
    assert ours.matches("shard-0", "key") and ours.load("shard-0") == "rows of shard-0"
    ours.restore("shard-0", ".tar", tmp_path / "restored.tar")
    assert (tmp_path / "restored.tar").read_bytes() == b"ours"
    assert ours.entries() == 1


def test_a_new_folder_is_this_users_alone_and_removing_it_forgets_every_entry(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "dataset")
    assert not checkpoint.trusted() and checkpoint.entries() == 0
    checkpoint.save("a", 1, "A")
    assert checkpoint.folder.stat().st_mode & 0o777 == 0o700
    assert Checkpoint(tmp_path / "dataset").load("a") == "A"
    checkpoint.remove()
    assert not checkpoint.folder.exists() and not checkpoint.matches("a", 1)


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
