"""Members to samples: energon's key rule, exactly, and both ways of grouping a shard agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.index.group import SAMPLE_NAME_RE, SKIP_META_RE, key_and_part, shard_rows
from tests.support.shards import sample_members, write_tarfile


@given(st.text(alphabet="ab._/_-", max_size=12))
@settings(max_examples=2000, deadline=None)
def test_member_names_split_exactly_as_energons_regex(name: str) -> None:
    expected = None
    if not SKIP_META_RE.match(name):
        match = SAMPLE_NAME_RE.match(name)
        expected = (match.group(1), match.group(2)) if match else None
    assert key_and_part(name) == expected


@pytest.mark.parametrize("prefix", ["a.b/x", "dü€𝄞.x/ké"])
def test_vectorised_grouping_agrees_with_member_by_member_grouping(tmp_path: Path, prefix: str) -> None:
    from prep.index.group import _group_one_by_one, _group_vectorised
    from prep.index.rows import ShardRows
    from prep.tar.scan import HeaderWalker, open_shard
    from tests.support.shards import sample_members, write_tarfile

    members = sample_members(prefix, 30, {"jpg": b"j%d", "ség.0.txt": b"t%d", "json": b"{}"})
    shard = write_tarfile(tmp_path / "s.tar", members)
    walker = HeaderWalker("s.tar", open_shard(str(shard), "s.tar"))
    scanned = walker.scan()
    vectorised, one_by_one = ShardRows("s.tar", 3, end=walker.end), ShardRows("s.tar", 3, end=walker.end)
    _group_one_by_one(one_by_one, *scanned)
    assert _group_vectorised(vectorised, *scanned)  # empties the names list
    assert vectorised.sample_rows() == one_by_one.sample_rows()
    assert vectorised.part_rows() == one_by_one.part_rows()
    assert vectorised.count == 30 and len(vectorised.part_rows()) == 90
    assert vectorised.sample_keys[0] == f"{prefix}00000" and vectorised.keys_between(29, 30) == [
        f"{prefix}00029"
    ]


def test_a_shard_whose_first_block_is_zero_has_no_rows_of_any_kind(tmp_path: Path) -> None:
    shard = write_tarfile(tmp_path / "a.tar", sample_members("a-", 2))
    shard.write_bytes(bytes(512) + shard.read_bytes()[512:])  # reads as an empty tar, as in tarfile
    rows = shard_rows(str(shard), "a.tar", 0)
    assert (rows.count, rows.sample_rows(), rows.part_rows(), list(rows.sample_sizes)) == (0, [], [], [])
