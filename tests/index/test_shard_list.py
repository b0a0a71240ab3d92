"""Shards found and ordered as energon's glob finds and numbers them."""

from __future__ import annotations

from pathlib import Path

from prep.index.shard_list import find_shards


def test_shard_discovery_matches_energons_glob_and_order(tmp_path: Path) -> None:
    from megatron.energon.epathlib import EPath

    for name in [
        "a.tar",
        "a-b.tar",
        "a/b.tar",
        "sub/deep/c.tar",
        "x.tgz",
        ".hidden/d.tar",
        ".e.tar",
        "X.TAR",
        "n.tar.gz",
    ]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "f.tar").write_bytes(b"")
    (tmp_path / "link").symlink_to("target")
    root = EPath(tmp_path)
    found = list(root.glob("**/*.tar")) + list(root.glob("**/*.tgz"))
    theirs = [p.relative_to(root) for p in sorted(found)]
    assert find_shards(tmp_path) == theirs
