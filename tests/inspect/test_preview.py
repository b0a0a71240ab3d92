"""`shardprep preview`: the first samples of a split, or one sample by key, decoded or raw."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import tarfile
from contextlib import closing
from pathlib import Path

import pytest

from tests.support.damaged_index import dataset_with_damaged_index
from tests.support.datasets import LONG_KEY, PREPARERS, prepared_dataset, tar_members, writable_copy
from tests.support.prepare import run_shardprep


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("preview-datasets")


def first_train_shard(dataset: Path) -> str:
    from prep.index.dataset import PreparedDataset

    with PreparedDataset(dataset) as prepared:
        return prepared.split_shards("train")[0]


@pytest.mark.parametrize("preparer", PREPARERS)
def test_first_samples_of_train_are_decoded(base, preparer):
    dataset = prepared_dataset(base, preparer)
    shard = first_train_shard(dataset)
    members = tar_members(dataset)[shard]
    text = run_shardprep("preview", str(dataset), "-n", "2", check=True).stdout
    keys = sorted({name.split(".")[0] for name in members})[:2]
    assert [line.split()[1] for line in text.splitlines() if line.startswith("== ")] == keys
    record = json.loads(members[f"{keys[0]}.json"])
    assert json.dumps(record, indent=2, ensure_ascii=False).splitlines()[1].strip() in text
    assert members[f"{keys[0]}.txt"].decode().strip() in text
    assert "image PNG 9x" in text and "mode RGB" in text
    assert "array shape (" in text and "dtype float32" in text


def test_key_option_shows_that_sample_even_with_a_long_name(base):
    dataset = prepared_dataset(base, "energon")
    text = run_shardprep(
        "preview", str(dataset), "--key", LONG_KEY, "--key", "folder.d/inner", check=True
    ).stdout
    assert f"== {LONG_KEY}  (shard-004.tar" in text and "a long name" in text
    assert "== folder.d/inner" in text and "-- seg.0.json" in text


def test_raw_shows_bytes_not_decoded_content(base):
    dataset = prepared_dataset(base, "shardprep")
    text = run_shardprep("preview", str(dataset), "--key", "s0_001", "--raw", check=True).stdout
    assert "-- txt (9 bytes): b'sample 1\\n'" in text
    assert "b'\\x89PNG" in text


def test_unknown_key_and_unknown_split_are_clear_errors(base):
    dataset = prepared_dataset(base, "energon")
    result = run_shardprep("preview", str(dataset), "--key", "no-such-key")
    assert result.returncode == 1 and "no sample with key 'no-such-key'" in result.stderr
    result = run_shardprep("preview", str(dataset), "--split", "holdout")
    assert result.returncode == 1 and "no split 'holdout'" in result.stderr


def test_parts_that_cannot_be_read_are_shown_as_unreadable_and_the_command_fails(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    shard = first_train_shard(dataset)
    with tarfile.open(dataset / shard) as tar:
        second_member = tar.getmembers()[1].offset
    os.truncate(dataset / shard, second_member)  # the first member remains, nothing after it
    result = run_shardprep("preview", str(dataset), "-n", "2")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines() if line.startswith("== ")] == ["==", "=="]
    unreadable = result.stdout.count("): unreadable (")
    assert unreadable >= 2 and result.stdout.count("\n-- ") > unreadable  # what could be read is shown
    assert f"Error: {unreadable} of the parts above could not be read or are not where the index says." in (
        result.stderr
    )
    assert f"`shardprep verify {dataset}`" in result.stderr


def test_a_part_row_without_offset_is_named_not_a_traceback(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    with closing(sqlite3.connect(dataset / ".nv-meta" / "index.sqlite")) as db:
        db.execute(
            "UPDATE sample_parts SET content_byte_offset = NULL WHERE part_name = 'txt' AND sample_index = 1"
            " AND tar_file_id = (SELECT tar_file_id FROM samples WHERE sample_key = 's0_001')"
        )
        db.commit()
    result = run_shardprep("preview", str(dataset), "--key", "s0_001")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        "-- txt: its index.sqlite row has no byte offset or size. Re-run `shardprep prepare`" in result.stdout
    )
    assert "-- json (" in result.stdout and "Error: 1 of the parts above could not be read" in result.stderr


@pytest.mark.parametrize(("option", "value"), [("-n", "0"), ("-n", "-1"), ("--limit", "-5")])
def test_a_count_or_limit_below_its_least_is_refused_by_name(base, option, value):
    """`-n 0` said "The split has no samples." of a split that has them, and a negative --limit cut every
    part at a place counted from its end."""
    result = run_shardprep("preview", str(prepared_dataset(base, "shardprep")), option, value)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"Invalid value for '{option}" in result.stderr and "no samples" not in result.stdout


@pytest.mark.parametrize("damage", ["shard replaced by another", "index.sqlite of other shards"])
def test_parts_the_index_no_longer_describes_are_not_shown_as_the_sample(base, tmp_path, damage):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    if damage == "shard replaced by another":  # same name, same layout, other samples
        (dataset / "shard-001.tar").write_bytes((dataset / "shard-002.tar").read_bytes())
        key = "s1_001"
    else:
        other = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "other")
        with closing(sqlite3.connect(other / ".nv-meta" / "index.sqlite")) as db:
            db.execute("UPDATE samples SET sample_key = 'other-' || sample_key")
            db.execute("UPDATE sample_parts SET content_byte_offset = content_byte_offset + 512")
            db.commit()
        (dataset / ".nv-meta" / "index.sqlite").write_bytes(
            (other / ".nv-meta" / "index.sqlite").read_bytes()
        )
        key = "other-s1_001"
    result = run_shardprep("preview", str(dataset), "--key", key)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    parts = [line for line in result.stdout.splitlines() if line.startswith("-- ")]
    assert parts and all(": not shown: the index puts it at byte " in line for line in parts), result.stdout
    if damage == "shard replaced by another":
        assert "the tar header there is of 's2_001." in result.stdout
    assert "`shardprep verify" in result.stderr


def test_a_split_naming_a_shard_the_index_does_not_list_is_named_with_split_yaml(base, tmp_path):
    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    split_yaml.write_text("split_parts:\n  train:\n  - shard-000.tar\n  - gone/x.tar\nexclude: []\n")
    assert run_shardprep("preview", str(dataset), "-n", "2").returncode == 0  # before the shard that is gone
    result = run_shardprep("preview", str(dataset), "-n", "100")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"split 'train' of {split_yaml} names shard 'gone/x.tar', which .info.json does not list." in (
        result.stderr
    )


def test_a_long_name_a_pax_record_holds_beside_an_abbreviated_ustar_name_is_shown(tmp_path):
    """bsdtar writes an abbreviated ustar name (shorter than the field) beside the PAX `path`."""
    root = tmp_path / "d"
    root.mkdir()
    long_name = "dir-" + "x" * 150 + "/k0.txt"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(long_name)
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    data = bytearray(buffer.getvalue())
    header = next(at for at in range(0, len(data), 512) if data[at + 156] == ord("0"))
    data[header : header + 100] = b"dir-xxx.../k0.txt".ljust(100, b"\0")
    data[header + 148 : header + 156] = b" " * 8
    data[header + 148 : header + 156] = b"%06o\0 " % sum(data[header : header + 512])
    (root / "a.tar").write_bytes(bytes(data))
    run_shardprep("prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0", "--crude", check=True)
    result = run_shardprep("preview", str(root))
    assert result.returncode == 0 and "-- txt (5 bytes): hello" in result.stdout, (
        result.stdout + result.stderr
    )


def test_a_sample_split_yaml_excludes_is_not_previewed_in_its_split(base, tmp_path):
    """energon's loader skips it, as info leaves it out of the split's counts."""
    import yaml

    from prep.index.dataset import PreparedDataset
    from prep.inspect.preview import first_samples

    dataset = writable_copy(prepared_dataset(base, "shardprep"), tmp_path / "d")
    with PreparedDataset(dataset) as prepared:
        shown = [sample.key for sample in first_samples(prepared, "train", 3)]
        shard = prepared.shards[next(iter(first_samples(prepared, "train", 1))).tar_file_id]
    split_yaml = dataset / ".nv-meta" / "split.yaml"
    splits = yaml.safe_load(split_yaml.read_text())
    splits["exclude"] = [f"{shard}/{shown[1]}"]
    split_yaml.write_text(yaml.dump(splits))
    with PreparedDataset(dataset) as prepared:
        assert [sample.key for sample in first_samples(prepared, "train", 2)] == [shown[0], shown[2]]
        assert shown[1] in [sample.key for sample in first_samples(prepared, None, 100)]


def test_a_damaged_page_among_the_samples_shown_is_named_with_what_to_do_not_a_traceback(tmp_path):
    # The samples were read through a lazily stepped cursor that raised sqlite's own error.
    dataset = dataset_with_damaged_index(tmp_path / "d", "samples")
    result = run_shardprep("preview", str(dataset), "-n", "1500", "--limit", "0")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(
        f"Error: {dataset / '.nv-meta' / 'index.sqlite'} cannot be read (database disk image is malformed)."
        " Re-run `shardprep prepare`"
    ), result.stderr
