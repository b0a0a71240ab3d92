"""The index format's names, as energon spells them."""

from __future__ import annotations

from prep.index.format import tar_index_name


def test_tar_index_file_names_follow_energon() -> None:
    assert tar_index_name("a/shard.tar") == "a/shard.tar.idx"
    assert tar_index_name("a/shard.tgz") == "a/shard.tar.idx"
    assert tar_index_name("v1.2/s.tar") == "v1.2/s.tar.idx"
