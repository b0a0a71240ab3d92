"""`shardprep verify`: healthy datasets pass; damage after prepare is found, named and given a fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from prep.verify import verify_dataset
from tests.inspect_datasets import PREPARERS, prepared_dataset, run_shardprep, writable_copy


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("verify-datasets")


@pytest.mark.parametrize("preparer", PREPARERS)
@pytest.mark.parametrize("deep", [False, True])
def test_freshly_prepared_dataset_is_healthy(base, preparer, deep):
    report = verify_dataset(prepared_dataset(base, preparer), deep=deep)
    assert report.healthy, report.problems
    assert report.shards == 5 and report.samples == 28


def test_field_map_dataset_is_healthy(base):
    report = verify_dataset(prepared_dataset(base, "energon", field_map=True), deep=True)
    assert report.healthy, report.problems


def test_cli_exits_zero_and_says_healthy(base):
    result = run_shardprep("verify", str(prepared_dataset(base, "shardprep")))
    assert result.returncode == 0 and result.stdout.rstrip().endswith("healthy")


def damaged(base: Path, tmp_path: Path, preparer: str) -> Path:
    return writable_copy(prepared_dataset(base, preparer), tmp_path / "damaged")


def problems_of(dataset: Path, deep: bool = False) -> list:
    report = verify_dataset(dataset, deep=deep)
    assert not report.healthy
    assert all(problem.fix for problem in report.problems)
    return report.problems


@pytest.mark.parametrize("preparer", PREPARERS)
def test_truncated_shard_is_reported_with_restore_advice(base, tmp_path, preparer):
    dataset = damaged(base, tmp_path, preparer)
    shard = dataset / "shard-002.tar"
    os.truncate(shard, shard.stat().st_size - 3000)
    problems = problems_of(dataset)
    assert problems[0].where == "shard-002.tar"
    assert "truncated" in problems[0].what and "restore" in problems[0].fix


@pytest.mark.parametrize("preparer", PREPARERS)
def test_shard_with_data_appended_after_prepare_is_reported(base, tmp_path, preparer):
    dataset = damaged(base, tmp_path, preparer)
    with open(dataset / "shard-000.tar", "ab") as shard:
        shard.write((dataset / "shard-003.tar").read_bytes())
    problems = problems_of(dataset)
    assert [p.where for p in problems] == ["shard-000.tar"]
    assert "appended" in problems[0].what and "prepare" in problems[0].fix


@pytest.mark.parametrize("preparer", PREPARERS)
def test_flipped_byte_in_a_member_header_is_reported(base, tmp_path, preparer):
    dataset = damaged(base, tmp_path, preparer)
    shard = dataset / "shard-001.tar"
    data = bytearray(shard.read_bytes())
    header = data.index(b"s1_003.png")  # the name field of that member's ustar header
    data[header + 3] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = problems_of(dataset)
    assert problems[0].where == "shard-001.tar"
    assert "s1_003" in problems[0].what


@pytest.mark.parametrize("preparer", PREPARERS)
def test_missing_shard_is_reported_for_the_index_and_the_split(base, tmp_path, preparer):
    dataset = damaged(base, tmp_path, preparer)
    (dataset / "shard-001.tar").unlink()
    problems = problems_of(dataset)
    assert [p.where for p in problems] == ["shard-001.tar"]
    assert "missing" in problems[0].what


def test_split_naming_a_shard_that_is_not_indexed_is_reported(base, tmp_path):
    dataset = damaged(base, tmp_path, "shardprep")
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    split_yaml.write_text(
        split_yaml.read_text().replace("split_parts:", "split_parts:\n  extra:\n  - gone-{0..1}.tar", 1)
    )
    problems = problems_of(dataset)
    assert {p.what.split(",")[0] for p in problems} == {
        "split 'extra' names shard 'gone-0.tar'",
        "split 'extra' names shard 'gone-1.tar'",
    }


def test_tar_index_disagreeing_with_sqlite_is_reported(base, tmp_path):
    dataset = damaged(base, tmp_path, "energon")
    index = dataset / "shard-000.tar.idx"
    data = bytearray(index.read_bytes())
    data[8] ^= 0x02  # the second sample's start offset moves by 512 bytes
    index.write_bytes(bytes(data))
    problems = problems_of(dataset)
    assert problems[0].where == "shard-000.tar" and "disagree" in problems[0].what


def test_deep_check_reports_undecodable_content(base, tmp_path):
    dataset = damaged(base, tmp_path, "energon")
    shard = dataset / "shard-003.tar"
    data = bytearray(shard.read_bytes())
    content = data.index(b'{"shard": 3, "index": 4')
    data[content] = ord("X")
    shard.write_bytes(bytes(data))
    assert verify_dataset(dataset).healthy  # headers and index still agree
    problems = problems_of(dataset, deep=True)
    assert "s3_004.json" in problems[0].what and "cannot be decoded" in problems[0].what


def test_cli_exits_non_zero_and_prints_each_problem_with_its_fix(base, tmp_path):
    dataset = damaged(base, tmp_path, "energon")
    os.truncate(dataset / "shard-000.tar", 10000)
    (dataset / "shard-003.tar").unlink()
    result = run_shardprep("verify", str(dataset))
    assert result.returncode == 1
    assert result.stdout.count("PROBLEM") == 2 and result.stdout.count("fix:") == 2
    as_json = json.loads(run_shardprep("verify", str(dataset), "--json").stdout)
    assert as_json["healthy"] is False and len(as_json["problems"]) == 2


def test_folder_that_is_not_a_prepared_dataset_gets_one_clear_error(tmp_path):
    result = run_shardprep("verify", str(tmp_path))
    assert result.returncode == 1
    assert "not a prepared dataset" in result.stderr and "Traceback" not in result.stderr
