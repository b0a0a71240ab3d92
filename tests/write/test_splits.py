"""Write-time splits: a group never lands in two splits; with --group-contiguous, in one shard, contiguously."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.errors import PrepError
from prep.write import BadInputError, write_dataset
from prep.write.splits import group_of, split_for
from tests.support.write import split_shards, tar_samples

RATIO = [("train", 6.0), ("val", 3.0), ("test", 1.0)]


def written_groups(out: Path) -> list[tuple[str, str, list[str]]]:
    """(split, shard, [group of each sample in shard order]) from the shards themselves."""
    found = []
    for split, shards in split_shards(out).items():
        for shard in shards:
            groups = [parts["txt"].decode() for _, parts in tar_samples(out / shard)]
            found.append((split, shard, groups))
    return found


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.lists(st.integers(0, 12), min_size=1, max_size=80),
    maxcount=st.integers(1, 9),
    seed=st.integers(0, 2**32),
    contiguous=st.booleans(),
)
def test_group_lands_whole_in_one_split(
    groups: list[int], maxcount: int, seed: int, contiguous: bool
) -> None:
    folder = Path(tempfile.mkdtemp())
    try:
        rows = [
            {"__key__": f"k{i:03d}", "txt": f"g{group}", "group": group} for i, group in enumerate(groups)
        ]
        write_dataset(
            rows,
            folder / "out",
            parts=["txt"],
            maxcount=maxcount,
            split_ratio="6,3,1",
            group_by="group",
            group_contiguous=contiguous,
            seed=seed,
        )
        shards = written_groups(folder / "out")
        split_of: dict[str, set[str]] = {}
        shard_of: dict[str, set[str]] = {}
        for split, shard, shard_groups in shards:
            for group in shard_groups:
                split_of.setdefault(group, set()).add(split)
                shard_of.setdefault(group, set()).add(shard)
        assert sorted(split_of) == sorted({f"g{group}" for group in groups})
        assert all(len(splits) == 1 for splits in split_of.values())
        assert sum(len(g) for _, _, g in shards) == len(groups), "every sample written once"
        if contiguous:
            assert all(len(found) == 1 for found in shard_of.values())
            for _, _, shard_groups in shards:
                runs = [g for i, g in enumerate(shard_groups) if i == 0 or shard_groups[i - 1] != g]
                assert len(runs) == len(set(runs)), "a group's samples are next to each other"
    finally:
        shutil.rmtree(folder)


def test_split_depends_only_on_seed_and_group() -> None:
    assert [split_for(g, RATIO, 7) for g in range(50)] == [split_for(g, RATIO, 7) for g in range(50)]
    assert [split_for(g, RATIO, 7) for g in range(50)] != [split_for(g, RATIO, 8) for g in range(50)]
    counts = {name: 0 for name, _ in RATIO}
    for group in range(20_000):
        counts[split_for(group, RATIO, 0)] += 1
    assert abs(counts["train"] / 20_000 - 0.6) < 0.02 and abs(counts["test"] / 20_000 - 0.1) < 0.02


def test_same_seed_writes_identical_shards(tmp_path: Path) -> None:
    rows = [{"txt": f"row {i}", "user": i % 5} for i in range(40)]
    for name in ("a", "b"):
        write_dataset(
            rows, tmp_path / name, parts=["txt"], split_ratio="8,1,1", group_by="user", seed=11, maxcount=6
        )
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.tar*"))
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.tar*"))
    assert files_a == files_b
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files_a)


def test_list_and_object_groups_keep_together_contiguously(tmp_path: Path) -> None:
    """A group value that is a list or an object (JSON) is one group per value, whatever its key order."""
    values = [["u", 1], {"b": 2, "a": 1}, ["u", 2], {"a": 1, "b": 2}, ["u", 1], ["u", 2]]
    rows = [{"__key__": f"k{i}", "txt": f"g{i}", "group": value} for i, value in enumerate(values)]
    write_dataset(rows, tmp_path / "out", parts=["txt"], group_by="group", group_contiguous=True)
    [(_, _, order)] = written_groups(tmp_path / "out")
    assert order == ["g0", "g4", "g1", "g3", "g2", "g5"]
    assert split_for(group_of(rows[1], "k1", "group"), RATIO, 0) == split_for('{"a": 1, "b": 2}', RATIO, 0)


def test_a_group_value_that_has_no_json_form_is_rejected_by_record(tmp_path: Path) -> None:
    rows = [{"txt": "a", "group": {1: "x", "y": 2}}]
    with pytest.raises(BadInputError, match="<iterable>:1: the value of 'group' cannot be a group"):
        write_dataset(rows, tmp_path / "out", parts=["txt"], group_by="group", group_contiguous=True)


@pytest.mark.parametrize("ratio", ["inf,1,1", "nan,1,1", "1,nan,0", "1e308,1e308,1"])
def test_a_split_ratio_that_is_not_finite_is_refused(tmp_path: Path, ratio: str) -> None:
    with pytest.raises(PrepError, match=f"Invalid split ratio '{ratio}': give three finite non-negative"):
        write_dataset([{"txt": "x"}], tmp_path / "out", split_ratio=ratio)
    assert not (tmp_path / "out").exists()
