"""`shardprep verify`: healthy datasets pass; damage after prepare is found, named and given a fix."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tarfile
from contextlib import closing
from pathlib import Path

import pytest
import yaml

from prep.errors import PrepError
from prep.index import sqlite as index_sqlite
from prep.index.columns import TextColumn
from prep.index.sqlite import IndexChangedError, IndexReader
from prep.inspect.verify import Problem, member_name_fields, unread_index_problem, verify_dataset
from prep.prepare import prepare_dataset
from tests.support.damaged_index import dataset_with_damaged_index, described_by_extension
from tests.support.datasets import PREPARERS, prepared_dataset, writable_copy
from tests.support.prepare import run_shardprep
from tests.support.shards import sample_members, write_tarfile


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


def test_the_field_map_check_decodes_no_part_name_one_by_one(base, monkeypatch):
    """The parts a field map may read are found per shard in one step, not by a Python step per part (that
    was a quarter of a big dataset's verify)."""
    decoded = []
    read_one = TextColumn.__getitem__
    monkeypatch.setattr(
        TextColumn, "__getitem__", lambda self, row: decoded.append(row) or read_one(self, row)
    )
    report = verify_dataset(prepared_dataset(base, "energon", field_map=True))
    assert report.healthy, report.problems
    assert decoded == []


def test_a_dataset_config_in_a_sub_folder_of_nv_meta_is_found(base, tmp_path):
    """`prepare --dataset-yaml-name configs/x.yaml` writes it there; verify named no config then, and
    said to re-run prepare (which writes the same name again)."""
    dataset = writable_copy(prepared_dataset(base, "energon", field_map=True), tmp_path / "d")
    (dataset / ".nv-meta" / "configs").mkdir()
    (dataset / ".nv-meta" / "dataset.yaml").rename(dataset / ".nv-meta" / "configs" / "x.yaml")
    [problem] = problems_of(dataset)
    assert "give it with --dataset-config configs/x.yaml" in problem.what, problem
    assert problem.fix.startswith("verify with --dataset-config configs/x.yaml")
    assert verify_dataset(dataset, dataset_config="configs/x.yaml").healthy


def test_a_field_map_reading_the_sample_key_is_healthy(base, tmp_path):
    """energon puts `__key__` (and `__shard__`) in every raw sample: a field read from it loads."""
    dataset = writable_copy(prepared_dataset(base, "energon", field_map=True), tmp_path / "d")
    config = dataset / ".nv-meta" / "dataset.yaml"
    parsed = yaml.safe_load(config.read_text())
    parsed["field_map"] = {name: "__key__" for name in parsed["field_map"]}
    config.write_text(yaml.safe_dump(parsed))
    assert verify_dataset(dataset).healthy, verify_dataset(dataset).problems


def test_a_missing_split_yaml_is_rebuilt_not_made_readable(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "energon"), tmp_path / "d")
    (dataset / ".nv-meta" / "split.yaml").unlink()
    [problem] = problems_of(dataset)
    assert problem.where == ".nv-meta/split.yaml" and "No such file or directory" in problem.what
    assert problem.fix == f"re-run `shardprep prepare {dataset}` to rebuild the index"


def test_a_missing_dataset_config_of_another_name_is_rebuilt_under_that_name(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "energon"), tmp_path / "d")
    (dataset / ".nv-meta" / "dataset.yaml").unlink()
    [problem] = verify_dataset(dataset, dataset_config="text.yaml").problems
    assert problem.where == ".nv-meta/text.yaml" and problem.what.startswith("is missing")
    assert (
        problem.fix
        == f"re-run `shardprep prepare {dataset} --dataset-yaml-name text.yaml` to rebuild the index"
    )


def test_the_commands_fixes_give_quote_the_dataset_as_a_shell_needs(base, tmp_path):
    """Pasted, `shardprep prepare /data/my set` would prepare /data/my."""
    dataset = writable_copy(prepared_dataset(base, "energon"), tmp_path / "my data")
    quoted = f"'{dataset}'"
    (dataset / ".nv-meta" / "split.yaml").unlink()
    (dataset / "shard-001.tar.idx").unlink()
    fixes = {problem.where: problem.fix for problem in problems_of(dataset)}
    assert fixes[".nv-meta/split.yaml"] == f"re-run `shardprep prepare {quoted}` to rebuild the index"
    assert f"`shardprep prepare {quoted}`" in fixes["shard-001.tar"]
    (dataset / ".nv-meta" / "dataset.yaml").unlink()
    fixes = {
        problem.where: problem.fix for problem in verify_dataset(dataset, dataset_config="t.yaml").problems
    }
    assert f"`shardprep prepare {quoted} --dataset-yaml-name t.yaml`" in fixes[".nv-meta/t.yaml"]


def test_cli_exits_zero_and_says_healthy(base):
    result = run_shardprep("verify", str(prepared_dataset(base, "shardprep")))
    assert result.returncode == 0 and result.stdout.rstrip().endswith("healthy")


@pytest.mark.parametrize("deep", [False, True])
def test_a_shard_without_end_marker_is_healthy_and_cut_further_it_is_not(tmp_path, deep):
    root = tmp_path / "d"
    shard = write_tarfile(root / "a.tar", sample_members("a-", 3))
    shard.write_bytes(shard.read_bytes()[: 512 * 12])  # three whole samples, no end-of-archive marker
    with pytest.warns(UserWarning, match="end-of-archive marker"):
        prepare_dataset(root, sample_type="CrudeWebdataset")
    report = verify_dataset(root, deep=deep)
    assert report.healthy and report.samples == 3, report.problems
    assert [(warning.where, "end-of-archive marker" in warning.what) for warning in report.warnings] == [
        ("a.tar", True)
    ]
    os.truncate(shard, 512 * 11)  # now the last member's data is gone
    assert "truncated" in problems_of(root, deep)[0].what


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
    assert "after its end-of-archive marker" in problems[0].what and "joined end to end" in problems[0].what
    assert "GNU tar" in problems[0].fix and "restore" in problems[0].fix


def test_archives_joined_end_to_end_are_healthy_once_repacked_as_the_fix_says(tmp_path):
    """`cat a.tar b.tar`: every reader stops at a.tar's end-of-archive marker, so preparing again cannot
    help; the command the fix gives puts both archives' members into one, and then they are all indexed."""
    tar_version = subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout
    if "GNU tar" not in tar_version:
        pytest.skip("the suggested command is for GNU tar")
    dataset = tmp_path / "joined"
    first = write_tarfile(tmp_path / "a.tar", sample_members("a-", 3))
    second = write_tarfile(tmp_path / "b.tar", sample_members("b-", 2))
    dataset.mkdir()
    (dataset / "ab.tar").write_bytes(first.read_bytes() + second.read_bytes())
    flags = ["--non-interactive", "--split-ratio", "1,0,0", "--crude", "--no-progress"]
    run_shardprep("prepare", str(dataset), *flags, check=True)
    problems = problems_of(dataset)
    assert [p.where for p in problems] == ["ab.tar"]
    assert f"after its end-of-archive marker at byte {512 * 12:,}" in problems[0].what
    command = problems[0].fix.split("`")[1]
    subprocess.run(["sh", "-c", command], check=True)
    (dataset / "ab.tar.repacked").replace(dataset / "ab.tar")
    run_shardprep("prepare", str(dataset), *flags, "--force-overwrite", check=True)
    report = verify_dataset(dataset, deep=True)
    assert report.healthy and report.samples == 5, report.problems


def test_members_appended_over_the_end_marker_after_prepare_ask_for_prepare_again(tmp_path):
    dataset = tmp_path / "d"
    shard = write_tarfile(dataset / "a.tar", sample_members("a-", 3))
    prepare_dataset(dataset, sample_type="CrudeWebdataset")
    with tarfile.open(shard, "a") as tar:  # as `tar -r` does: the new member's header overwrites the marker
        info = tarfile.TarInfo("a-00003.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    problems = problems_of(dataset)
    assert [p.where for p in problems] == ["a.tar"]
    assert problems[0].what.startswith(
        f"holds data at byte {512 * 12:,}, where its index puts the end-of-archive"
    )
    assert problems[0].fix.startswith("if the new data belongs in the dataset, re-run `shardprep prepare")


@pytest.mark.parametrize("samples", [5, 2], ids=["longer", "shorter"])
def test_a_shard_replaced_by_another_tar_of_the_same_name_is_named_replaced_not_appended_to(
    tmp_path, samples
):
    """A longer tar in the shard's place holds data past the indexed end, as one appended to with `tar -r`
    does; but its samples are not the indexed ones, so the shard is named replaced, first."""
    dataset = tmp_path / "d"
    write_tarfile(dataset / "a.tar", sample_members("a-", 3))
    write_tarfile(dataset / "b.tar", sample_members("b-", 3))
    prepare_dataset(dataset, sample_type="CrudeWebdataset")
    write_tarfile(dataset / "a.tar", sample_members("z-", samples))
    problems = problems_of(dataset)
    assert {p.where for p in problems} == {"a.tar"}
    assert problems[0].what.startswith(
        "is not the tar its index describes (at byte 0, where its index has sample 'a-00000', it holds"
        " 'z-00000'"
    ), problems[0]
    assert problems[0].what.endswith(
        "it was replaced by another tar of the same name, or rewritten, since prepare."
    )
    assert problems[0].fix.startswith(
        f"if the new shard is the one to use, re-run `shardprep prepare {dataset}`"
    )
    assert not [p for p in problems if "tar -r" in p.what], problems


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


@pytest.mark.parametrize(
    ("split_parts", "exclude", "problem"),
    [
        ({"train": [], "val": []}, [], "no split names a shard that `exclude` leaves in"),
        ({"train": ["a.tar"]}, ["a.tar"], "no split names a shard that `exclude` leaves in"),
        ({"train": ["a.tar"]}, [f"a.tar/a-{i:05d}" for i in range(3)], "`exclude` drops every sample"),
    ],
    ids=["no shards", "shard excluded", "every sample excluded"],
)
def test_a_split_yaml_leaving_no_split_a_sample_to_load_is_a_problem(tmp_path, split_parts, exclude, problem):
    """energon cannot load a split without shards (EmptyDatasetError), and finds nothing in one whose every
    sample is excluded (its training loader waits for ever): with no split to load, the dataset is not
    healthy. One sample left in, it is."""
    dataset = tmp_path / "d"
    write_tarfile(dataset / "a.tar", sample_members("a-", 3))
    prepare_dataset(dataset, sample_type="CrudeWebdataset")
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    split_yaml.write_text(yaml.safe_dump({"split_parts": split_parts, "exclude": exclude}))
    [found] = [p for p in problems_of(dataset) if p.where == ".nv-meta/split.yaml"]
    assert found.what.startswith(problem), found
    assert f"re-run `shardprep prepare {dataset}`" in found.fix
    left_in = {"split_parts": {"train": ["a.tar"]}, "exclude": ["a.tar/a-00000", "a.tar/a-00001"]}
    split_yaml.write_text(yaml.safe_dump(left_in))
    report = verify_dataset(dataset)
    assert report.healthy, report.problems


def test_a_split_whose_every_sample_is_excluded_is_a_problem_for_train_and_a_warning_for_val(tmp_path):
    """With another split to load, a split whose shards `exclude` empties sample by sample still loads
    nothing: energon's training loader on it waits for ever (a problem), its validation loader yields no
    sample without saying why (a warning for val and test). prepare's output, whose val and test name no
    shard (energon raises EmptyDatasetError for those), stays healthy without a warning."""
    dataset = tmp_path / "d"
    for prefix in "ab":
        write_tarfile(dataset / f"{prefix}.tar", sample_members(f"{prefix}-", 3))
    prepare_dataset(dataset, sample_type="CrudeWebdataset", split_ratio="1,0,0")
    report = verify_dataset(dataset)
    assert report.healthy and not report.warnings, (report.problems, report.warnings)
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    drop_b = [f"b.tar/b-{i:05d}" for i in range(3)]
    split_yaml.write_text(
        yaml.safe_dump({"split_parts": {"train": ["a.tar"], "val": ["b.tar"], "test": []}, "exclude": drop_b})
    )
    report = verify_dataset(dataset)
    assert report.healthy, report.problems
    [warning] = report.warnings
    assert warning.where == ".nv-meta/split.yaml"
    assert warning.what.startswith("`exclude` drops every sample of the 1 shard(s) split 'val' names"), (
        warning
    )
    assert "validation loader yields no sample" in warning.what
    assert "from `exclude` in split.yaml" in warning.fix
    split_yaml.write_text(
        yaml.safe_dump({"split_parts": {"train": ["b.tar"], "val": ["a.tar"]}, "exclude": drop_b})
    )
    [problem] = problems_of(dataset)
    assert problem.what.startswith("`exclude` drops every sample of the 1 shard(s) split 'train' names"), (
        problem
    )
    assert "training loader on it waits for ever" in problem.what
    assert not verify_dataset(dataset).warnings
    result = run_shardprep("verify", str(dataset))
    assert result.returncode == 1 and "PROBLEM .nv-meta/split.yaml: `exclude` drops" in result.stdout


def test_a_val_split_of_shards_that_hold_no_sample_is_a_warning_while_train_has_samples(tmp_path):
    dataset = tmp_path / "d"
    write_tarfile(dataset / "a.tar", sample_members("a-", 3))
    write_tarfile(dataset / "b.tar", [("README", b"no KEY.PART member")])
    prepare_dataset(dataset, sample_type="CrudeWebdataset", split_ratio="1,0,0")
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    split_yaml.write_text(yaml.safe_dump({"split_parts": {"train": ["a.tar"], "val": ["b.tar"]}}))
    report = verify_dataset(dataset)
    assert report.healthy, report.problems
    [warning] = report.warnings
    assert warning.what.startswith("the 1 shard(s) split 'val' names (b.tar) hold no sample"), warning
    assert warning.fix.startswith("add shards that hold samples (members named KEY.PART) to split 'val'")


def test_a_dataset_whose_shards_hold_no_sample_is_a_problem_prepare_again_cannot_fix(tmp_path):
    dataset = tmp_path / "d"
    write_tarfile(dataset / "a.tar", [("README", b"no KEY.PART member")])
    prepare_dataset(dataset, sample_type="CrudeWebdataset")
    [found] = problems_of(dataset)
    assert found.what.startswith("the shards the splits name hold no sample"), found
    assert found.fix.startswith("add shards that hold samples")


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("sample_type: {\n  bad: [\n", "is not valid"),
        ("- CrudeWebdataset\n", "holds a YAML list, not a mapping"),
        (None, "cannot be read (Is a directory)"),
    ],
    ids=["invalid YAML", "a list", "a folder"],
)
def test_dataset_yaml_that_energon_cannot_load_is_reported(base, tmp_path, damage, problem):
    dataset = damaged(base, tmp_path, "shardprep")
    dataset_yaml = dataset / ".nv-meta" / "dataset.yaml"
    if damage is None:
        dataset_yaml.unlink()
        dataset_yaml.mkdir()
    else:
        dataset_yaml.write_text(damage)
    problems = problems_of(dataset)
    assert [(p.where, p.what.startswith(f"{dataset_yaml} {problem}")) for p in problems] == [
        (".nv-meta/dataset.yaml", True)
    ]


def test_field_map_reading_a_part_no_sample_has_is_a_dataset_yaml_problem(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "energon", field_map=True), tmp_path / "damaged")
    dataset_yaml = dataset / ".nv-meta" / "dataset.yaml"
    text = dataset_yaml.read_text()
    assert "image: png" in text
    dataset_yaml.write_text(text.replace("image: png", "image: jpg,webp[image]"))
    problems = problems_of(dataset)  # energon's loader would fail on every sample, each named alone
    assert [p.where for p in problems] == [".nv-meta/dataset.yaml"], problems
    assert "field 'image'" in problems[0].what and "part 'jpg' or 'webp'" in problems[0].what
    assert "png" in problems[0].what and "field_map" in problems[0].fix
    dataset_yaml.write_text(text.replace("image: png", "image: jpg,png"))  # one sample has one of them
    assert verify_dataset(dataset).healthy


def test_cli_reports_an_unreadable_dataset_yaml_and_exits_non_zero(base, tmp_path):
    dataset = damaged(base, tmp_path, "shardprep")
    (dataset / ".nv-meta" / "dataset.yaml").chmod(0)
    result = run_shardprep("verify", str(dataset), honour_permissions=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        "PROBLEM .nv-meta/dataset.yaml: " in result.stdout and "cannot be read (Permission" in result.stdout
    )


@pytest.mark.parametrize("unreadable", ["shard-001.tar", "shard-001.tar.idx"])
def test_cli_reports_an_unreadable_shard_or_offset_file_and_checks_the_rest(base, tmp_path, unreadable):
    dataset = damaged(base, tmp_path, "shardprep")
    (dataset / unreadable).chmod(0)
    os.truncate(dataset / "shard-003.tar", 10000)
    result = run_shardprep("verify", str(dataset), honour_permissions=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    what = "cannot be opened" if unreadable.endswith(".tar") else "shard-001.tar.idx cannot be read"
    assert f"PROBLEM shard-001.tar: {what} (Permission denied)." in result.stdout
    assert "PROBLEM shard-003.tar:" in result.stdout and "NOT healthy: 2 problem(s)" in result.stdout


@pytest.mark.parametrize("damage", ["missing", "unreadable", "not a database"])
def test_an_index_sqlite_that_cannot_be_read_is_one_problem_and_the_offset_files_are_still_checked(
    base, tmp_path, damage
):
    dataset = damaged(base, tmp_path, "energon")
    index = dataset / ".nv-meta" / "index.sqlite"
    if damage == "missing":  # as an energon older than index.sqlite left it
        index.unlink()
    elif damage == "unreadable":
        index.chmod(0)
    else:
        index.write_bytes(b"not sqlite" * 100)
    (dataset / "shard-003.tar.idx").unlink()
    result = run_shardprep("verify", str(dataset), honour_permissions=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    problems = [line for line in result.stdout.splitlines() if line.startswith("PROBLEM")]
    what = {
        "missing": "is missing; energon",
        "unreadable": "cannot be read (Permission denied)",
        "not a database": "cannot be read as energon's index",
    }[damage]
    assert len(problems) == 2, result.stdout  # not one more per shard saying sqlite has no samples for it
    assert problems[0].startswith("PROBLEM .nv-meta/index.sqlite: ") and what in problems[0], result.stdout
    assert (
        problems[1]
        == "PROBLEM shard-003.tar: has no offset file shard-003.tar.idx; energon's loader needs it."
    )
    fix = result.stdout.splitlines()[result.stdout.splitlines().index(problems[0]) + 1]
    assert ("make it readable" in fix) == (damage == "unreadable"), fix


@pytest.mark.parametrize("damage", ["samples", "sample_parts", "not a database"])
def test_a_damaged_index_sqlite_is_one_problem_saying_what_and_the_fix_once(tmp_path, damage):
    # It said "cannot be read: PATH cannot be read (...). Re-run `shardprep prepare` ..." and the fix again.
    dataset = dataset_with_damaged_index(tmp_path / "d", "samples" if damage == "not a database" else damage)
    if damage == "not a database":
        (dataset / ".nv-meta" / "index.sqlite").write_bytes(b"not sqlite" * 100)
    what = {
        "not a database": "cannot be read as energon's index (file is not a database); it needs the tables"
        " `samples` and `sample_parts`."
    }.get(damage, "cannot be read (database disk image is malformed).")
    assert verify_dataset(dataset).problems == [
        Problem(".nv-meta/index.sqlite", what, f"re-run `shardprep prepare {dataset}` to rebuild the index")
    ]


def test_a_damaged_index_with_media_says_to_describe_the_media_again_too(tmp_path):
    dataset = dataset_with_damaged_index(tmp_path / "d", "samples")
    described_by_extension(dataset / ".nv-meta" / "index.sqlite")
    [problem] = verify_dataset(dataset).problems
    assert problem.fix == (
        f"re-run `shardprep prepare {dataset}` to rebuild the index, then"
        f" `shardprep prepare-media {dataset} --media-metadata-by-extension` for its media metadata"
    )


def test_an_index_rewritten_while_read_is_verified_again_its_fix_said_once(tmp_path):
    # It said "cannot be read: PATH changed while it was read (...). Open the dataset anew (...)" with
    # "fix: re-run `shardprep prepare`": the fix twice, and the second wrong (shown by truncating a large
    # index while `python -m prep verify` read it).
    dataset = tmp_path / "d"
    write_tarfile(dataset / "shard-000.tar", sample_members("sample-", 10))
    prepare_dataset(dataset, sample_type="CrudeWebdataset")
    index = dataset / ".nv-meta" / "index.sqlite"
    reader = IndexReader(index)
    reader.check()
    os.replace(shutil.copyfile(index, tmp_path / "new.sqlite"), index)
    with pytest.raises(IndexChangedError) as raised:
        reader.check()
    reader.close()
    problem = unread_index_problem(raised.value, str(dataset))
    assert problem.what.startswith("was replaced after it was opened") and "anew" not in problem.what
    assert problem.fix == "run verify again once what writes the index is done"


def test_a_val_only_dataset_is_healthy_with_a_warning_that_training_on_it_fails(tmp_path):
    # verify said "healthy" and nothing else, while energon's get_train_dataset raises EmptyDatasetError.
    dataset = tmp_path / "d"
    for shard in range(2):
        write_tarfile(dataset / f"shard-{shard}.tar", sample_members(f"s{shard}-", 3))
    prepare_dataset(dataset, split_ratio="0,1,0", sample_type="CrudeWebdataset")
    report = verify_dataset(dataset)
    assert report.problems == []
    assert report.warnings == [
        Problem(
            ".nv-meta/split.yaml",
            "split 'train' names no shard, so training on this dataset fails (energon's get_train_dataset"
            " raises EmptyDatasetError, 'No shards found in split part'); only 'val' (6) has samples, which"
            " is fine for evaluation.",
            "to train on it, name shards under 'train' in `split_parts` in split.yaml, or re-run `shardprep"
            f" prepare {dataset}` with a --split-ratio that gives train a share",
        )
    ]


def test_info_and_preview_name_an_unreadable_index_sqlite_as_unreadable(base, tmp_path):
    dataset = damaged(base, tmp_path, "energon")
    (dataset / ".nv-meta" / "index.sqlite").chmod(0)
    for command in ("info", "preview"):
        result = run_shardprep(command, str(dataset), honour_permissions=True)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert "index.sqlite cannot be read (Permission denied)" in result.stderr, result.stderr
        assert "make it readable" in result.stderr


@pytest.mark.parametrize("folder", ["shard-001.tar", "shard-001.tar.idx"])
def test_shard_or_offset_file_replaced_by_a_folder_is_reported_as_a_folder(base, tmp_path, folder):
    dataset = damaged(base, tmp_path, "shardprep")
    (dataset / folder).unlink()
    (dataset / folder).mkdir()
    problems = problems_of(dataset)
    assert [p.where for p in problems] == ["shard-001.tar"]
    assert problems[0].what == (
        "is a folder, not a tar file."
        if folder.endswith(".tar")
        else f"{folder} is a folder, not an offset file."
    )


def test_shard_replaced_by_a_fifo_is_reported_without_waiting_for_a_writer(base, tmp_path):
    dataset = damaged(base, tmp_path, "shardprep")
    (dataset / "shard-001.tar").unlink()
    os.mkfifo(dataset / "shard-001.tar")
    problems = problems_of(dataset)
    assert [(p.where, p.what) for p in problems] == [
        ("shard-001.tar", "is not a regular file, not a tar file.")
    ]


def test_empty_offset_file_is_reported_as_empty(base, tmp_path):
    dataset = damaged(base, tmp_path, "energon")
    (dataset / "shard-000.tar.idx").write_bytes(b"")
    problems = problems_of(dataset)
    assert [(p.where, p.what) for p in problems] == [
        ("shard-000.tar", "shard-000.tar.idx is empty but .info.json counts 6 samples.")
    ]


def test_tar_index_disagreeing_with_sqlite_is_reported(base, tmp_path):
    dataset = damaged(base, tmp_path, "energon")
    index = dataset / "shard-000.tar.idx"
    data = bytearray(index.read_bytes())
    data[8] ^= 0x02  # the second sample's start offset moves by 512 bytes
    index.write_bytes(bytes(data))
    problems = problems_of(dataset)
    assert problems[0].where == "shard-000.tar" and "disagree" in problems[0].what


@pytest.mark.parametrize(
    ("table", "column"),
    [
        ("samples", "byte_offset"),
        ("sample_parts", "content_byte_offset"),
        ("sample_parts", "content_byte_size"),
        ("sample_parts", "part_name"),
    ],
)
def test_index_rows_without_an_offset_size_or_name_are_named_as_null_with_their_sample(
    base, tmp_path, table, column
):
    """A NULL read as offset 0, size 0 or an empty part name gave a problem blaming the shard."""
    dataset = damaged(base, tmp_path, "energon")
    with closing(sqlite3.connect(dataset / ".nv-meta" / "index.sqlite")) as db:
        emptied = db.execute(
            f"UPDATE {table} SET {column} = NULL WHERE tar_file_id = 1 AND sample_index IN (2, 3)"
        ).rowcount
        db.commit()
    assert emptied >= 2
    problems = problems_of(dataset)
    assert [(p.where, p.what) for p in problems if "NULL" in p.what] == [
        (
            ".nv-meta/index.sqlite",
            f"{emptied} row(s) of its {table} table have no {column} (NULL), the first of sample 's1_002' of"
            " shard shard-001.tar: the index was damaged after prepare, which writes every row whole.",
        )
    ], problems
    assert all(p.where != "shard-001.tar" for p in problems), problems
    assert problems[0].fix == f"re-run `shardprep prepare {dataset}` to rebuild the index"


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


def test_member_name_fields_hold_what_tarfile_writes_in_each_header_name_field():
    keys = ["a", "s0_001", "folder/inner", "ü" * 20, "k" * 98, "k" * 99, "k" * 100, "k" * 130]
    parts = ["json", "txt", "seg.0.json", "png", "x", "y", "z", "npy"]
    fields = member_name_fields(
        TextColumn.from_joined("\0".join(keys), len(keys)),
        TextColumn.from_joined("\0".join(parts), len(parts)),
    )
    for row, (key, part) in enumerate(zip(keys, parts, strict=True)):
        blocks = tarfile.TarInfo(f"{key}.{part}").tobuf(format=tarfile.GNU_FORMAT)
        member_header = blocks[-tarfile.BLOCKSIZE :]  # after any long-name header
        assert fields[row].tobytes() == member_header[:100], (key, part)


@pytest.mark.parametrize("preparer", PREPARERS)
def test_bulk_column_read_returns_every_sqlite_row_in_any_chunk_size(base, preparer, monkeypatch):
    database = prepared_dataset(base, preparer) / ".nv-meta" / "index.sqlite"
    with closing(sqlite3.connect(database)) as db:
        rows = db.execute(
            "SELECT tar_file_id, sample_index, content_byte_offset, part_name FROM sample_parts ORDER BY rowid"
        ).fetchall()
    reader = IndexReader(database)
    for chunk_rows in (1, 7, len(rows), len(rows) + 1):
        monkeypatch.setattr(index_sqlite, "COLUMN_CHUNK_ROWS", chunk_rows)
        columns, names = reader.columns(
            "sample_parts",
            {"tar": "tar_file_id", "index": "sample_index", "offset": "content_byte_offset"},
            "part_name",
        )
        read = list(zip(*(columns[name].tolist() for name in ("tar", "index", "offset")), names, strict=True))
        assert read == rows
    reader.close()


def test_index_with_rows_stored_out_of_order_is_healthy_and_still_checked(base, tmp_path):
    dataset = damaged(base, tmp_path, "shardprep")
    with closing(sqlite3.connect(dataset / ".nv-meta" / "index.sqlite")) as db:
        for table in ("samples", "sample_parts"):
            rows = db.execute(f"SELECT * FROM {table}").fetchall()
            db.execute(f"DELETE FROM {table}")
            marks = ", ".join("?" * len(rows[0]))
            db.executemany(f"INSERT INTO {table} VALUES ({marks})", reversed(rows))
        db.commit()
    report = verify_dataset(dataset, deep=True)
    assert report.healthy, report.problems
    assert report.samples == 28
    shard = dataset / "shard-001.tar"
    data = bytearray(shard.read_bytes())
    data[data.index(b"s1_003.png") + 3] ^= 0x01
    shard.write_bytes(bytes(data))
    assert "s1_003" in problems_of(dataset)[0].what


@pytest.mark.parametrize("preparer", PREPARERS)
def test_part_renamed_in_sqlite_but_not_in_the_shard_is_reported(base, tmp_path, preparer):
    dataset = damaged(base, tmp_path, preparer)
    with closing(sqlite3.connect(dataset / ".nv-meta" / "index.sqlite")) as db:
        db.execute(
            "UPDATE sample_parts SET part_name = 'jpg' WHERE part_name = 'png' AND sample_index = 4"
            " AND tar_file_id = (SELECT tar_file_id FROM samples WHERE sample_key = 's2_004')"
        )
        db.commit()
    problems = problems_of(dataset)
    assert problems[0].where == "shard-002.tar"
    assert "s2_004.jpg" in problems[0].what and "does not hold the members" in problems[0].what


@pytest.mark.parametrize("preparer", PREPARERS)
def test_samples_rechecked_member_by_member_keep_what_energon_keeps(tmp_path, preparer):
    """Samples whose member names need the ustar prefix field fail the bulk header check and are re-walked
    one by one. That walk must decide what energon indexes by energon's own key rule: `__data/.../k.txt`
    is a part (key `__data/.../k`), a `README` between two parts of a sample is skipped. Judged by a
    leading `__` instead, a healthy dataset was reported damaged."""
    import tarfile

    from tests.support.prepare import run_energon_prepare
    from tests.support.shards import write_tarfile

    folder = "d" * 90  # with the rest of the name, past ustar's 100-byte name field: the prefix is used
    members = [
        (f"__data/{folder}/k.txt", b"k"),
        (f"__data/{folder}/k.json", b'{"k": 1}'),
        (f"{folder}/s.txt", b"s"),
        (f"{folder}/README", b"not a part of any sample"),
        (f"{folder}/s.json", b'{"s": 1}'),
        ("plain.txt", b"plain"),
    ]
    dataset = tmp_path / preparer
    write_tarfile(dataset / "shard-000.tar", members, tarfile.USTAR_FORMAT)
    flags = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress"]
    if preparer == "energon":
        run_energon_prepare(str(dataset), *flags, "--sample-type", "CrudeWebdataset")
    else:
        run_shardprep("prepare", str(dataset), *flags, "--crude", check=True)
    for deep in (False, True):
        report = verify_dataset(dataset, deep=deep)
        assert report.healthy, report.problems
        assert (report.samples, report.parts) == (3, 5)
    # the re-walk still tells real damage in such a sample: a member renamed in the shard
    shard = dataset / "shard-000.tar"
    data = bytearray(shard.read_bytes())
    at = data.index(b"k.json")
    data[at : at + 6] = b"k.jsox"
    header = at - at % 512
    data[header + 148 : header + 156] = b"%06o\0 " % (
        sum(data[header : header + 148]) + 256 + sum(data[header + 156 : header + 512])
    )
    shard.write_bytes(bytes(data))
    problems = problems_of(dataset)
    assert (
        "does not hold the members its index names" in problems[0].what
        and f"__data/{folder}/k" in problems[0].what
    )


class NoAliasDumper(yaml.SafeDumper):
    """`yaml.safe_dump` writing an object met twice out in full each time, as energon's reader needs."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def energon_load_yaml(text: bytes) -> object:
    from megatron.energon.eyaml import load_yaml

    return load_yaml(text)


def polylithic(folder: Path, aux_format: str) -> Path:
    """A dataset written with `--media-column`: `primary/`, `media/` and `metadataset.yaml`."""
    from prep.write import write_dataset

    rows = [{"__key__": f"k{i:02d}", "img": b"IMG%d" % i, "txt": f"caption {i}"} for i in range(6)]
    write_dataset(rows, folder, media_columns=["img=jpg"], aux_format=aux_format, maxcount=4, num_workers=1)
    return folder


@pytest.mark.parametrize("aux_format", ["folder", "tar"])
def test_a_metadataset_is_verified_whole_and_a_moved_auxiliary_dataset_is_named(tmp_path, aux_format):
    folder = polylithic(tmp_path / "poly", aux_format)
    for given in (folder, folder / "metadataset.yaml"):
        result = run_shardprep("verify", str(given))
        assert result.returncode == 0 and result.stdout.rstrip().endswith("healthy"), result.stdout
    counted = [verify_dataset(folder / "primary")] + (
        [verify_dataset(folder / "media")] if aux_format == "tar" else []
    )
    shards, samples = sum(report.shards for report in counted), sum(report.samples for report in counted)
    assert f"{shards:,} shards, {samples:,} samples" in result.stdout
    (folder / "media").rename(tmp_path / "moved")
    result = run_shardprep("verify", str(folder))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        f"PROBLEM metadataset.yaml: split 'train' joins auxiliary dataset 'media' from"
        f" '{'filesystem://media' if aux_format == 'folder' else 'media'}', which is {folder / 'media'}:"
        " it does not exist." in result.stdout
    ), result.stdout
    assert f"fix: move it back to {folder / 'media'}, or correct the path in" in result.stdout


@pytest.mark.parametrize("aux_format", ["folder", "tar"])
def test_a_media_file_a_sample_reads_that_the_auxiliary_dataset_lacks_is_named_with_the_sample(
    tmp_path, aux_format
):
    """energon's loader skips a sample whose `aux.json` names a file the auxiliary dataset does not have;
    excluding the sample, as the fix says, makes the metadataset healthy again."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", aux_format)
    media = folder / "media"
    if aux_format == "folder":
        (media / "k03.jpg").unlink()
    else:  # the media shard written again without k03.jpg, and the auxiliary dataset prepared again
        shard = media / "shard-000000.tar"
        kept = [member for member in tar_members_of(shard) if member[0] != "k03.jpg"]
        assert len(kept) == 3
        write_tarfile(shard, kept)
        prepare_dataset(media, sample_type="CrudeWebdataset")
    problems = verify_metadataset(folder / "metadataset.yaml").problems
    [problem] = problems
    assert problem.where == "primary/shard-000000.tar", problems
    assert problem.what.startswith("sample 'k03' (its aux.json at byte ") and "from 'k03.jpg'" in problem.what
    assert problem.what.endswith("energon's loader skips the sample.")
    assert problem.fix.endswith("`shard-000000.tar/k03` to `exclude` in primary/.nv-meta/split.yaml")
    split_yaml = folder / "primary" / ".nv-meta" / "split.yaml"
    document = yaml.safe_load(split_yaml.read_text())
    document["exclude"] = ["shard-000000.tar/k03"]
    split_yaml.write_text(yaml.safe_dump(document))
    report = verify_metadataset(folder / "metadataset.yaml")
    assert report.healthy, report.problems


def test_media_files_are_checked_for_the_samples_of_the_split_each_reference_loads(tmp_path):
    """energon loads, for a metadataset split, the dataset's split its reference's `split_part` names (the
    metadataset's split when none): a sample of a split no reference loads reads no media, so a file
    missing for it is no problem, until a reference loads its split."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    (folder / "primary" / ".nv-meta" / "split.yaml").write_text(
        yaml.safe_dump({"split_parts": {"train": ["shard-000000.tar"], "val": ["shard-000001.tar"]}})
    )
    (folder / "media" / "k05.jpg").unlink()  # k05 is in shard-000001.tar, the primary's val split
    metadataset = folder / "metadataset.yaml"
    reference = {"path": "primary", "aux": {"media": "filesystem://media"}}

    def write(splits: dict) -> None:
        document = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": splits}
        metadataset.write_text(yaml.dump(document, Dumper=NoAliasDumper))
        assert energon_load_yaml(metadataset.read_bytes()) == document  # `reference` is shared, unaliased

    write({"train": reference, "val": {**reference, "split_part": "train"}})
    report = verify_metadataset(metadataset)
    assert report.healthy, report.problems
    write({"train": reference, "test": {**reference, "split_part": "val"}})
    [problem] = verify_metadataset(metadataset).problems
    assert problem.where == "primary/shard-000001.tar"
    assert problem.what.startswith("sample 'k05' (its aux.json at byte "), problem
    (folder / "primary" / ".nv-meta" / "all.yaml").write_text(
        yaml.safe_dump({"split_parts": {"train": ["shard-000000.tar", "shard-000001.tar"]}})
    )
    write({"train": {**reference, "split_config": "all.yaml"}})
    [problem] = verify_metadataset(metadataset).problems
    assert problem.what.startswith("sample 'k05' (its aux.json at byte "), problem
    assert problem.fix.endswith("`shard-000001.tar/k05` to `exclude` in primary/.nv-meta/all.yaml")


#: A value written twice in each YAML file energon reads: by `yaml.safe_dump` of an object met twice, or by hand.
ALIASED = {
    "metadataset.yaml": lambda text: yaml.safe_dump(  # the `aux` mapping of both references
        {
            **(doc := yaml.safe_load(text)),
            "splits": {"train": (train := doc["splits"]["train"]), "val": {**train, "split_part": "train"}},
        }
    ),
    "primary/.nv-meta/split.yaml": lambda text: yaml.safe_dump(
        {
            **(doc := yaml.safe_load(text)),
            "split_parts": {**doc["split_parts"], "val": doc["split_parts"]["train"]},
        }
    ),
    "primary/.nv-meta/dataset.yaml": lambda text: (
        "__module__: &module megatron.energon\n__class__: CrudeWebdataset\nsubflavors: {origin: *module}\n"
    ),
}


@pytest.mark.parametrize("file", list(ALIASED))
def test_an_alias_in_a_yaml_file_energon_reads_is_named_with_its_line(tmp_path, file):
    """energon's YAML reader reads an alias as the text `*name`, not the value its anchor marks: a file
    with one is named, with the alias's line and how to write it, not found healthy."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    path = folder / file
    text = ALIASED[file](path.read_text())
    path.write_text(text)
    line, alias = next((n, row) for n, row in enumerate(text.splitlines(), 1) if ": *" in row)
    alias = alias.split(": *")[1].rstrip("}")
    assert f"'*{alias}'" in repr(
        energon_load_yaml(text.encode())
    )  # energon's reader: the text, not the value
    said = f"line {line} holds the alias `*{alias}` (of the anchor `&{alias}` on line"
    if file == "metadataset.yaml":
        with pytest.raises(PrepError, match=re.escape(f"{path}: {said}")):
            verify_metadataset(path)
    else:
        [problem] = verify_metadataset(folder / "metadataset.yaml").problems
        assert problem.where == file and problem.what.startswith(said), problem
        assert "energon's YAML reader does not resolve anchors and aliases" in problem.what
        assert problem.fix.startswith(f"write the value out in full in place of each alias in {path}")
    path.write_text(yaml.dump(yaml.safe_load(text), Dumper=NoAliasDumper))
    assert verify_metadataset(folder / "metadataset.yaml").healthy


def tar_members_of(shard: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(shard) as tar:
        return [(member.name, tar.extractfile(member).read()) for member in tar.getmembers()]


def test_an_undecodable_member_of_an_auxiliary_dataset_is_not_to_be_excluded_in_its_split_yaml(tmp_path):
    """energon reads an auxiliary dataset's members by name: its split.yaml `exclude` drops nothing."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "tar")  # its media are not JPEGs: --deep cannot decode them
    problems = verify_metadataset(folder / "metadataset.yaml", deep=True).problems
    media = [problem for problem in problems if problem.where.startswith("media/")]
    assert media and "cannot be decoded as jpg" in media[0].what, problems
    assert all("exclude" not in problem.fix.split("(")[0] for problem in media), media
    assert media[0].fix.startswith("fix the source data and re-write the shard (energon reads an auxiliary")


def test_an_auxiliary_dataset_prepared_without_dataset_yaml_is_healthy(tmp_path):
    """energon reads an auxiliary dataset through its index.sqlite alone: `energon prepare
    --skip-dataset-yaml` prepares one so, and the metadataset is healthy."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "tar")
    (folder / "media" / ".nv-meta" / "dataset.yaml").unlink()
    report = verify_metadataset(folder / "metadataset.yaml")
    assert report.healthy, report.problems
    (folder / "primary" / ".nv-meta" / "dataset.yaml").unlink()  # the primary dataset's is needed
    problems = verify_metadataset(folder / "metadataset.yaml").problems
    assert [(p.where, p.what.split(";")[0]) for p in problems] == [
        ("primary/.nv-meta/dataset.yaml", "is missing")
    ]


def test_a_metadataset_naming_a_metadataset_folder_is_told_to_name_its_yaml_not_to_prepare_it(tmp_path):
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    outer = tmp_path / "outer.yaml"
    outer.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: poly\n"
    )
    [problem] = verify_metadataset(outer).problems
    assert problem.where == "poly" and "is an energon metadataset" in problem.what
    assert problem.fix.startswith(f"name {folder / 'metadataset.yaml'} as the path instead"), problem.fix


def test_a_problem_of_a_nested_metadataset_is_named_by_its_full_path_of_the_top_one_by_its_file_name(
    tmp_path,
):
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    inner, outer = folder / "metadataset.yaml", tmp_path / "outer.yaml"

    def write(path: Path, splits: dict) -> None:
        document = {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": splits}
        path.write_text(yaml.safe_dump(document))

    write(inner, {"train": {"path": "gone"}, "val": {"path": "primary", "split_part": "bogus"}})
    write(outer, {"train": {"path": "poly/metadataset.yaml"}, "val": {"path": "lost"}})
    problems = verify_metadataset(outer).problems
    assert [(p.where, p.what.split(" ", 3)[:3]) for p in problems] == [
        (str(inner), ["split", "'train'", "reads"]),  # the dataset is missing
        (str(inner), ["split", "'val'", "loads"]),  # a split the dataset does not have
        ("outer.yaml", ["split", "'val'", "reads"]),
    ], problems


def test_a_metadataset_whose_primary_dataset_is_damaged_names_the_shard_below_it(tmp_path):
    folder = polylithic(tmp_path / "poly", "folder")
    shard = sorted((folder / "primary").glob("*.tar"))[0]
    os.truncate(shard, 700)
    result = run_shardprep("verify", str(folder))
    assert result.returncode == 1
    assert f"PROBLEM primary/{shard.name}: the shard is 700 bytes" in result.stdout, result.stdout


@pytest.mark.parametrize("command", ["info", "preview"])
def test_info_and_preview_of_a_metadataset_name_its_datasets_instead_of_asking_to_prepare_it(
    tmp_path, command
):
    folder = polylithic(tmp_path / "poly", "folder")
    result = run_shardprep(command, str(folder))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "shardprep prepare" not in result.stderr  # preparing it would index primary's shards again
    assert (
        f"is an energon metadataset (metadataset.yaml), not a prepared dataset. Give one of the datasets it names: {folder / 'primary'} (split train)"
        in result.stderr
    )
    assert not (folder / ".nv-meta").exists()


@pytest.mark.parametrize("damage", ["truncated", "no .tar.idx", "missing"])
def test_the_counts_said_are_the_datasets_whatever_its_shards_problems(base, tmp_path, damage):
    healthy = verify_dataset(prepared_dataset(base, "energon"))
    dataset = damaged(base, tmp_path, "energon")
    if damage == "truncated":
        os.truncate(dataset / "shard-002.tar", 3000)
    elif damage == "no .tar.idx":
        (dataset / "shard-002.tar.idx").unlink()
    else:
        (dataset / "shard-002.tar").unlink()
    report = verify_dataset(dataset)
    assert not report.healthy
    info = json.loads((dataset / ".nv-meta" / ".info.json").read_text())["shard_counts"]
    with closing(sqlite3.connect(dataset / ".nv-meta" / "index.sqlite")) as db:
        parts = db.execute("SELECT count(*) FROM sample_parts").fetchone()[0]
    # what energon info says of it, as of the healthy dataset: a damaged shard is a problem, not fewer samples
    assert (report.shards, report.samples, report.parts) == (len(info), sum(info.values()), parts)
    assert (report.shards, report.samples, report.parts) == (healthy.shards, healthy.samples, healthy.parts)


def test_the_problems_left_out_get_the_fix_of_those_shown(base, tmp_path):
    dataset = damaged(base, tmp_path, "energon")
    (dataset / "shard-002.tar").write_bytes((dataset / "shard-003.tar").read_bytes())  # same name, others
    problems = [p for p in problems_of(dataset) if "damaged samples" in p.what or "does not hold" in p.what]
    assert problems[-1].what.startswith("... and ") and len(problems) == 4, problems
    assert {p.fix for p in problems} == {problems[0].fix} and problems[0].fix.startswith("restore the shard")


def test_a_sample_loader_module_dataset_yaml_names_but_that_is_gone_is_a_problem(base, tmp_path):
    dataset = damaged(base, tmp_path, "shardprep")
    meta = dataset / ".nv-meta"
    (meta / "sample_loader.py").write_text(
        "def sample_loader(raw):\n    return raw\n\n\ndef part_filter(part):\n    return True\n"
    )
    (meta / "dataset.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n"
        "sample_loader: sample_loader.py:sample_loader\npart_filter: sample_loader.py:part_filter\n"
    )
    assert verify_dataset(dataset).healthy
    (meta / "sample_loader.py").unlink()
    problems = problems_of(dataset)
    assert [(p.where, p.what) for p in problems] == [
        (
            ".nv-meta/dataset.yaml",
            f"its {key} is 'sample_loader.py:{key}', but .nv-meta/sample_loader.py does not exist: energon"
            " cannot build the dataset.",
        )
        for key in ("sample_loader", "part_filter")
    ]


def test_a_missing_module_of_a_config_of_another_name_is_fixed_by_writing_that_config(base, tmp_path):
    dataset = damaged(base, tmp_path, "shardprep")
    meta = dataset / ".nv-meta"
    (meta / "dataset.yaml").unlink()
    (meta / "text.yaml").write_text(
        "sample_type:\n  __module__: megatron.energon\n  __class__: TextSample\n"
        "sample_loader: loader.py:sample_loader\npart_filter: loader.py:part_filter\n"
    )
    problems = verify_dataset(dataset, dataset_config="text.yaml").problems
    assert [p.where for p in problems] == [".nv-meta/text.yaml"] * 2, problems
    assert problems[0].fix == (
        "put loader.py back in .nv-meta/, or re-run prepare to write a new text.yaml (--dataset-yaml-name"
        " text.yaml)"
    )


@pytest.mark.parametrize("preparer", PREPARERS)
def test_the_sample_loader_template_prepare_writes_is_a_problem_until_edited(tmp_path, preparer):
    root = tmp_path / "d"
    write_tarfile(root / "a.tar", sample_members("a-", 3))
    flags = ["--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "TextSample"]
    if preparer == "energon":
        from tests.support.prepare import run_energon_prepare

        run_energon_prepare(str(root), *flags)
    else:
        run_shardprep("prepare", str(root), *flags, check=True)
    loader = root / ".nv-meta" / "sample_loader.py"
    problems = problems_of(root)  # energon's loader fails on every sample: KeyError 'TODO'
    assert [(p.where, p.what.split(":")[0]) for p in problems] == [
        (".nv-meta/sample_loader.py", "is still the template prepare wrote")
    ]
    loader.write_text(loader.read_text().replace('raw["TODO"]', 'raw["txt"]'))
    assert verify_dataset(root).healthy


@pytest.mark.parametrize("deep", [False, True])
def test_a_shard_compressed_after_prepare_is_named_compressed_not_truncated(base, tmp_path, deep):
    dataset = damaged(base, tmp_path, "energon")
    shard = dataset / "shard-002.tar"
    shard.write_bytes(gzip.compress(shard.read_bytes()))
    problems = problems_of(dataset, deep)
    assert [(p.where, p.what.split(".")[0]) for p in problems] == [("shard-002.tar", "is gzip-compressed")]
    assert "Decompress it" in problems[0].fix


def test_a_dataset_config_of_another_name_is_found_and_checked_with_dataset_config(tmp_path):
    root = tmp_path / "d"
    write_tarfile(root / "a.tar", sample_members("a-", 3))
    flags = ["--non-interactive", "--split-ratio", "1,0,0", "--sample-type", "TextSample"]
    flags += ["--field-map", '{"text": "txt"}', "--dataset-yaml-name", "text.yaml"]
    run_shardprep("prepare", str(root), *flags, check=True)
    config = root / ".nv-meta" / "text.yaml"
    assert not (root / ".nv-meta" / "dataset.yaml").exists()
    result = run_shardprep("verify", str(root))
    assert result.returncode == 1
    assert "PROBLEM .nv-meta/dataset.yaml: is missing; energon's loader needs it" in result.stdout
    assert (
        "text.yaml, a dataset config of another name: give it with --dataset-config text.yaml"
        in result.stdout
    )
    for flags in ([], ["--load"]):
        result = run_shardprep("verify", str(root), "--dataset-config", "text.yaml", *flags)
        assert result.returncode == 0 and result.stdout.rstrip().endswith("healthy"), (
            result.stdout + result.stderr
        )
    assert "3 samples loaded through text.yaml" in result.stdout
    info = run_shardprep("info", str(root), "--dataset-config", "text.yaml", "--json", check=True)
    assert json.loads(info.stdout)["field_map"] == {"text": "txt"}
    text = config.read_text()
    config.write_text(text.replace("text: txt", "text: txt[field]"))  # each sample's txt has no field
    result = run_shardprep("verify", str(root), "--dataset-config", "text.yaml", "--load")
    assert result.returncode == 1 and "does not load through text.yaml" in result.stdout, result.stdout
    config.write_text(text.replace("text: txt", "text: md"))
    result = run_shardprep("verify", str(root), "--dataset-config", "text.yaml")
    assert result.returncode == 1
    assert "PROBLEM .nv-meta/text.yaml: the field map reads field 'text'" in result.stdout


def test_a_metadataset_reference_with_its_own_dataset_config_is_verified_with_it(tmp_path):
    folder = polylithic(tmp_path / "poly", "folder")
    meta = folder / "primary" / ".nv-meta"
    (meta / "dataset.yaml").rename(meta / "crude.yaml")
    metadataset = folder / "metadataset.yaml"
    text = metadataset.read_text()
    assert "    path: primary\n" in text
    metadataset.write_text(
        text.replace("    path: primary\n", "    path: primary\n    dataset_config: crude.yaml\n")
    )
    result = run_shardprep("verify", str(folder))
    assert result.returncode == 0 and result.stdout.rstrip().endswith("healthy"), result.stdout


def test_an_undecodable_member_of_a_shard_named_with_braces_is_named_with_its_fix(tmp_path):
    """The fix names the shard and key to exclude; braces in them (a shard may be named `y{1..2}.tar`) were
    read as placeholders of the fix text, and verify --deep ended in a traceback."""
    root = tmp_path / "d"
    members = sample_members("k{1}-", 4)
    members[0] = ("k{1}-00000.json", b"{not json")
    write_tarfile(root / "y{1..2}.tar", members)
    prepare_dataset(root, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    report = verify_dataset(root, deep=True)
    (problem,) = [problem for problem in report.problems if "cannot be decoded" in problem.what]
    assert problem.fix.endswith("`y{1..2}.tar/k{1}-00000` to `exclude` in split.yaml"), problem.fix


def test_an_undecodable_member_is_to_be_excluded_in_the_split_file_a_metadataset_loads(tmp_path):
    """A dataset a metadataset loads only through another `split_config`: excluding the sample in its
    split.yaml would drop nothing energon loads, so the --deep fix names the split file that applies."""
    from prep.inspect.verify import verify_metadataset

    root = tmp_path / "d"
    members = sample_members("k", 4)
    members[0] = ("k00000.json", b"{not json")
    write_tarfile(root / "y.tar", members)
    prepare_dataset(root, split_ratio="1,0,0", sample_type="CrudeWebdataset")
    meta = root / ".nv-meta"
    (meta / "all.yaml").write_text((meta / "split.yaml").read_text())
    metadataset = tmp_path / "m.yaml"
    reference = {"path": "d", "split_config": "all.yaml"}
    metadataset.write_text(
        yaml.safe_dump(
            {"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": {"train": reference}}
        )
    )
    (problem,) = [
        p for p in verify_metadataset(metadataset, deep=True).problems if "cannot be decoded" in p.what
    ]
    assert problem.where == "d/y.tar" and problem.fix.endswith("`y.tar/k00000` to `exclude` in all.yaml"), (
        problem
    )
    (problem,) = [p for p in verify_dataset(root, deep=True).problems if "cannot be decoded" in p.what]
    assert problem.fix.endswith("`y.tar/k00000` to `exclude` in split.yaml"), problem  # the dataset alone


def _energon_split_error(dataset: Path, split_part: str, split_config: str) -> str:
    """What energon's loader says reading `split_part` of `dataset` from `.nv-meta/{split_config}`."""
    from megatron.energon.epathlib import EPath
    from megatron.energon.flavors.webdataset.metadata import WebdatasetMeta

    with pytest.raises((AssertionError, FileNotFoundError)) as raised:
        WebdatasetMeta.from_config(EPath(dataset), split_part=split_part, split_config=split_config)
    return str(raised.value)


def test_a_reference_to_a_split_its_dataset_does_not_have_is_named_with_the_splits_it_has(tmp_path):
    """energon's loader fails on a reference whose split (its `split_part`, else the metadataset's split)
    is not in the dataset's split file; verify names the YAML, the split, the dataset and its splits."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    assert "Invalid split part: 'bogus'" in _energon_split_error(folder / "primary", "bogus", "split.yaml")
    metadataset = folder / "metadataset.yaml"
    reference = {"path": "primary", "aux": {"media": "filesystem://media"}}
    metadataset.write_text(
        yaml.dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {
                    "train": reference,
                    "extra": reference,
                    "val": {**reference, "split_part": "bogus"},
                },
            },
            Dumper=NoAliasDumper,
        )
    )
    result = run_shardprep("verify", str(metadataset))
    assert result.returncode == 1, result.stdout
    problems = verify_metadataset(metadataset).problems
    assert [(problem.where, problem.what) for problem in problems] == [
        (
            "metadataset.yaml",
            f"split 'extra' loads split 'extra' of dataset 'primary' ({folder / 'primary'}), which"
            " .nv-meta/split.yaml does not have (its splits: train, val, test): energon's loader fails on"
            " it ('Invalid split part').",
        ),
        (
            "metadataset.yaml",
            f"split 'val' loads split 'bogus' of dataset 'primary' ({folder / 'primary'}), which"
            " .nv-meta/split.yaml does not have (its splits: train, val, test): energon's loader fails on"
            " it ('Invalid split part').",
        ),
    ]
    assert problems[0].fix == (
        "give the reference under split 'extra' in metadataset.yaml the `split_part` of a split it has"
        f" (train), or add split 'extra' to `split_parts` in {folder / 'primary' / '.nv-meta' / 'split.yaml'}"
    )


def test_a_reference_with_a_split_config_to_a_folder_never_prepared_is_named_not_a_traceback(tmp_path):
    """With no `.nv-meta` at all, the split files it holds could not be listed: verify ended in a
    FileNotFoundError traceback. The dataset's own check names it as not prepared."""
    from prep.inspect.verify import verify_metadataset

    (tmp_path / "ds").mkdir()
    metadataset = tmp_path / "metadataset.yaml"
    metadataset.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    path: ds\n"
        "    split_config: custom.yaml\n"
    )
    [problem] = verify_metadataset(metadataset).problems
    assert problem.where == "ds" and "is not a prepared dataset" in problem.what


def test_a_reference_whose_split_config_is_missing_is_named_with_the_file(tmp_path):
    """energon's loader fails on a reference whose `split_config` is not in the dataset's `.nv-meta`."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    assert "nope.yaml" in _energon_split_error(folder / "primary", "train", "nope.yaml")
    metadataset = folder / "metadataset.yaml"
    metadataset.write_text(
        metadataset.read_text().replace(
            "    path: primary\n", "    path: primary\n    split_config: nope.yaml\n"
        )
    )
    [problem] = verify_metadataset(metadataset).problems
    assert (problem.where, problem.what) == (
        "metadataset.yaml",
        f"split 'train' reads the splits of dataset 'primary' ({folder / 'primary'}) from its split_config"
        f" 'nope.yaml', but {folder / 'primary' / '.nv-meta' / 'nope.yaml'} does not exist: energon's"
        " loader fails on it.",
    )
    assert problem.fix == (
        "correct `split_config` in metadataset.yaml to a split file .nv-meta holds (split.yaml), or write"
        f" {folder / 'primary' / '.nv-meta' / 'nope.yaml'}"
    )


def _energon_loaded(metadataset: Path, split: str) -> list:
    """The datasets (energon's `LoadedDataset`s) energon's loader builds for `split` of the metadataset,
    raising what it raises."""
    from megatron.energon import WorkerConfig
    from megatron.energon.metadataset.loader import load_dataset

    loaded = load_dataset(metadataset).get_datasets(
        training=False, split_part=split, worker_config=WorkerConfig(rank=0, world_size=1, num_workers=0)
    )
    return loaded.datasets


def _energon_loads(metadataset: Path, split: str) -> int:
    """How many samples energon's loader finds in `split` of the metadataset (raising what it raises)."""
    return sum(len(dataset.dataset) for dataset in _energon_loaded(metadataset, split))


def test_a_dataset_loaded_only_through_its_split_config_needs_no_split_yaml(tmp_path):
    """energon reads a reference's splits from its `split_config` alone: a dataset that has all.yaml and
    no split.yaml loads through a reference to all.yaml, so verify judges its splits by all.yaml (a shard
    all.yaml names that is not indexed is a problem of all.yaml). Verified alone, it needs split.yaml."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    meta = folder / "primary" / ".nv-meta"
    (meta / "split.yaml").rename(meta / "all.yaml")
    metadataset = folder / "metadataset.yaml"
    metadataset.write_text(
        metadataset.read_text().replace(
            "    path: primary\n", "    path: primary\n    split_config: all.yaml\n"
        )
    )
    assert _energon_loads(metadataset, "train") == 6
    report = verify_metadataset(metadataset)
    assert report.healthy, report.problems
    assert [p.where for p in problems_of(folder / "primary")] == [".nv-meta/split.yaml"]
    all_yaml = yaml.safe_load((meta / "all.yaml").read_text())
    all_yaml["split_parts"]["train"].append("gone.tar")
    (meta / "all.yaml").write_text(yaml.safe_dump(all_yaml))
    [problem] = verify_metadataset(metadataset).problems
    assert problem.where == "primary/.nv-meta/all.yaml", problem
    assert problem.what.startswith("split 'train' names shard 'gone.tar', which is not in .info.json"), (
        problem
    )


def test_a_reference_loading_a_split_that_names_no_shard_is_named_with_the_splits_that_do(tmp_path):
    """prepare leaves val and test naming no shard, and the dataset alone is healthy so; but energon's
    loader raises EmptyDatasetError on a metadataset reference that loads such a split."""
    from megatron.energon.flavors.webdataset.empty_dataset_error import EmptyDatasetError

    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    assert verify_dataset(folder / "primary").healthy
    metadataset = folder / "metadataset.yaml"

    def write(val_split_part: str) -> None:
        splits = {
            split: {"path": "primary", "aux": {"media": "filesystem://media"}, "split_part": split_part}
            for split, split_part in (("train", "train"), ("val", val_split_part))
        }
        metadataset.write_text(
            yaml.safe_dump({"__module__": "megatron.energon", "__class__": "MetadatasetV2", "splits": splits})
        )

    write("val")
    with pytest.raises(EmptyDatasetError, match="No shards found in split part 'val'"):
        _energon_loads(metadataset, "val")
    [problem] = verify_metadataset(metadataset).problems
    split_yaml = folder / "primary" / ".nv-meta" / "split.yaml"
    assert (problem.where, problem.what) == (
        "metadataset.yaml",
        f"split 'val' loads split 'val' of dataset 'primary' ({folder / 'primary'}), which names no shard in"
        " .nv-meta/split.yaml: energon's loader fails on it (EmptyDatasetError, 'No shards found in split"
        " part').",
    )
    assert problem.fix == (
        "give the reference under split 'val' in metadataset.yaml the `split_part` of a split that names"
        f" shards (train), or name the shards of split 'val' under `split_parts` in {split_yaml}"
    )
    write("train")
    assert _energon_loads(metadataset, "val") == 6
    report = verify_metadataset(metadataset)
    assert report.healthy, report.problems


def test_aux_on_an_element_of_a_join_is_said_to_be_ignored_not_checked(tmp_path):
    """energon 7.4.1 gives no auxiliary dataset to the samples of a `join` (its join loader drops each
    element's `aux`, and does not look for it): a missing media file or folder there stops nothing, so
    verify says `aux` is ignored instead of naming what it lacks."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    shutil.copytree(folder / "primary", folder / "other")
    (folder / "media" / "k03.jpg").unlink()
    metadataset = folder / "join.yaml"
    join = {
        "a": {"path": "primary", "aux": {"media": "filesystem://media"}},
        "b": {"path": "other", "aux": {"media": "filesystem://gone"}},
    }
    joiner = {"__module__": "megatron.energon", "__class__": "CaptioningSample"}
    metadataset.write_text(
        yaml.safe_dump(
            {
                "__module__": "megatron.energon",
                "__class__": "MetadatasetV2",
                "splits": {"train": {"join": join, "joiner": joiner}},
            }
        )
    )
    loaded = _energon_loaded(metadataset, "train")
    assert [(len(dataset.dataset), dataset.aux) for dataset in loaded] == [(6, None)]
    report = verify_metadataset(metadataset)
    assert report.healthy, report.problems
    assert [(warning.where, warning.what) for warning in report.warnings] == [
        (
            "join.yaml",
            f"split 'train' joins dataset {written!r} ({folder / written}) with `aux` (media), which energon"
            " ignores on an element of a `join`: its samples get no auxiliary dataset, and verify does not"
            " check it.",
        )
        for written in ("primary", "other")
    ]
    assert report.warnings[0].fix == (
        "remove `aux` from the element of the `join` in join.yaml; only a dataset reference outside a"
        " `join` gives its samples auxiliary datasets"
    )


def _with_split_config(folder: Path, split_config: str) -> Path:
    """The polylithic `folder`'s metadataset.yaml, its reference to `primary` reading `split_config`."""
    metadataset = folder / "metadataset.yaml"
    metadataset.write_text(
        metadataset.read_text().replace(
            "    path: primary\n", f"    path: primary\n    split_config: {split_config}\n"
        )
    )
    return metadataset


def test_a_json_split_file_is_read_as_json_as_energon_reads_it(tmp_path):
    """energon reads a split file whose name ends in .json with json.load: a tab-indented one loads (PyYAML
    refused it: tabs cannot indent YAML), and YAML or a trailing comma in one fails its loader (PyYAML
    read both: verify said healthy). A syntax error is named with the file, line and column."""
    from json import JSONDecodeError

    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    meta = folder / "primary" / ".nv-meta"
    splits = yaml.safe_load((meta / "split.yaml").read_text())
    metadataset = _with_split_config(folder, "split.json")
    (meta / "split.json").write_text(json.dumps(splits, indent="\t"))
    assert _energon_loads(metadataset, "train") == 6
    report = verify_metadataset(metadataset)
    assert report.healthy, report.problems
    for text, line, column in [
        (yaml.safe_dump(splits), 1, 1),
        (
            '{\n  "split_parts": {\n    "train": ["shard-{000000..000001}.tar",],\n    "val": []\n  }\n}\n',
            3,
            44,
        ),
    ]:
        (meta / "split.json").write_text(text)
        with pytest.raises(JSONDecodeError) as raised:
            _energon_loads(metadataset, "train")
        assert (raised.value.lineno, raised.value.colno) == (line, column)
        [problem] = verify_metadataset(metadataset).problems
        assert (problem.where, problem.what) == (
            "metadataset.yaml",
            f"{meta / 'split.json'} is not valid JSON: {raised.value.msg} at line {line}, column {column}."
            " energon reads a split file whose name ends in .json with json.load, so its loader fails on it.",
        )


def test_a_split_file_named_neither_yaml_nor_json_is_one_energon_refuses(tmp_path):
    """energon reads a split file as YAML or JSON by the ending of its name, and refuses any other
    ('Invalid file extension'); PyYAML read a split.yml, and verify said healthy."""
    from prep.inspect.verify import verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    meta = folder / "primary" / ".nv-meta"
    (meta / "split.yaml").rename(meta / "split.yml")
    metadataset = _with_split_config(folder, "split.yml")
    with pytest.raises(ValueError, match="Invalid file extension: split.yml"):
        _energon_loads(metadataset, "train")
    [problem] = verify_metadataset(metadataset).problems
    assert (problem.where, problem.what) == (
        "metadataset.yaml",
        f"{meta / 'split.yml'} is not a split file energon reads: it reads one whose name ends in .yaml (as"
        " YAML) or .json (as JSON), and refuses any other ('Invalid file extension').",
    )


def test_split_json_is_read_in_place_of_a_missing_split_yaml_as_energon_reads_it(base, tmp_path):
    """energon's loader reads split.json when split.yaml, the split file it reads unless told another, is
    missing (and only then: split.yaml first); verify, info and preview said split.yaml was missing. A
    problem of the splits is named with split.json."""
    from prep.index.dataset import PreparedDataset
    from prep.inspect.info import dataset_info
    from prep.inspect.preview import first_samples

    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    meta = dataset / ".nv-meta"
    splits = yaml.safe_load((meta / "split.yaml").read_text())
    (meta / "split.yaml").unlink()
    (meta / "split.json").write_text(json.dumps(splits))
    loaded = _energon_loads(dataset, "train")
    assert verify_dataset(dataset).healthy, verify_dataset(dataset).problems
    with PreparedDataset(dataset) as prepared:
        assert {split.split: split.samples for split in dataset_info(prepared).splits}["train"] == loaded
        assert len(list(first_samples(prepared, "train", 100))) == loaded
    splits["split_parts"]["train"].append("gone.tar")
    (meta / "split.json").write_text(json.dumps(splits))
    [problem] = problems_of(dataset)
    assert problem.where == ".nv-meta/split.json", problem
    (meta / "split.yaml").write_text(yaml.safe_dump({"split_parts": {"train": ["shard-000.tar"]}}))
    assert _energon_loads(dataset, "train") == 6
    with PreparedDataset(dataset) as prepared:
        assert prepared.splits() == {"train": ["shard-000.tar"]}


def test_a_json_split_file_in_any_encoding_json_detects_is_read_as_energon_reads_it(base, tmp_path):
    """energon reads a .json split file as bytes (`json.load` on a binary file), which takes UTF-8 with a
    byte order mark, UTF-16 and UTF-32; verify read UTF-8 text alone, and called those not valid."""
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    meta = dataset / ".nv-meta"
    splits = yaml.safe_load((meta / "split.yaml").read_text())
    (meta / "split.yaml").unlink()
    for encoding in ("utf-8-sig", "utf-16", "utf-16-le", "utf-32"):
        (meta / "split.json").write_bytes(json.dumps(splits, ensure_ascii=False).encode(encoding))
        assert _energon_loads(dataset, "train") > 0, encoding
        assert verify_dataset(dataset).healthy, (encoding, verify_dataset(dataset).problems)


def test_what_a_verify_leaves_unchecked_is_in_its_json_report(tmp_path):
    """A verify of a metadataset naming datasets in object storage does not read their samples' aux.json
    parts, and says so; --json said it nowhere (the text report's first line did)."""
    from prep.inspect.verify import AUX_FILES_IN_STORAGE, report_json, verify_metadataset

    folder = polylithic(tmp_path / "poly", "folder")
    checked = verify_metadataset(folder / "metadataset.yaml")
    assert "unchecked" not in json.loads(report_json(checked))
    mirrored = verify_metadataset(folder / "metadataset.yaml", mirror=folder)  # as if mirrored from a bucket
    assert mirrored.healthy and mirrored.unchecked == AUX_FILES_IN_STORAGE
    assert json.loads(report_json(mirrored))["unchecked"] == AUX_FILES_IN_STORAGE
