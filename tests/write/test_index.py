"""The index `write` records as it writes equals what `shardprep prepare` and `energon prepare` find in the tars."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.tar.write import HeaderMaker
from prep.write import BadInputError, open_sources, write_dataset
from prep.write.build import DatasetBuild
from prep.write.shards import ShardLimits
from tests.support.prepare import assert_same_index, run_energon_prepare, run_shardprep, twin
from tests.support.write import tar_samples


def varied_samples(count: int) -> list[dict]:
    """Samples whose names and sizes exercise every header path: plain, ustar prefix, PAX path, empty parts."""
    samples = []
    for i in range(count):
        key = f"s{i:04d}"
        if i % 7 == 3:
            key = "deep/" + "folder-" * 16 + f"/{i:04d}"  # > 100 bytes: ustar prefix
        if i % 11 == 5:
            key = f"ключ-{i}"  # non-ASCII: PAX path
        if i % 13 == 6:
            key = "x" * 120 + f"{i}"  # long with no slash to split at: PAX path
        samples.append({"__key__": key, "txt": "t" * (i * 37 % 1500), "json": {"i": i}, "empty.bin": b""})
    return samples


def prepare_twin(out: Path, *flags: str) -> Path:
    copy = twin(out, out.name + "-prepared")
    result = run_shardprep("prepare", str(copy), "--non-interactive", "--no-progress", "--crude", *flags)
    assert result.returncode == 0, result.stderr
    return copy


def test_index_equals_shardprep_prepare_on_the_same_tars(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_dataset(varied_samples(60), out, maxcount=9)
    assert_same_index(out, prepare_twin(out, "--split-ratio", "1,0,0"))


def test_split_subfolders_index_equals_prepare_with_split_parts(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rows = [{"__key__": f"k{i:03d}", "txt": f"row {i}", "user": f"u{i % 9}"} for i in range(120)]
    write_dataset(rows, out, maxcount=8, split_ratio="6,2,2", group_by="user", group_contiguous=True, seed=3)
    flags = [flag for name in ("train", "val", "test") for flag in ("--split-parts", f"{name}:{name}/.*")]
    assert_same_index(out, prepare_twin(out, *flags))


def test_index_equals_energon_prepare(tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_dataset(varied_samples(40), out, maxcount=15)
    theirs = twin(out, "energon")
    run_energon_prepare(
        str(theirs),
        "--non-interactive",
        "--split-ratio",
        "1,0,0",
        "--sample-type",
        "CrudeWebdataset",
        "--no-progress",
    )
    assert_same_index(out, theirs)


def test_a_key_in_two_shards_is_refused_naming_both_places(tmp_path: Path) -> None:
    with pytest.raises(PrepError) as refused:
        with DatasetBuild(
            tmp_path / "out", limits=ShardLimits(maxcount=10), pattern="shard-%06d.tar"
        ) as build:
            build.writer("train", "train").write("a", [("txt", b"first")])
            build.writer("val", "val").write("b", [("txt", b"other")])
            build.writer("val", "val").write("a", [("txt", b"again")])
            build.finish(["train", "val"], None)
    message = str(refused.value)
    assert "'a' appears in train/shard-000000.tar at byte 0" in message
    assert "again in val/shard-000000.tar at byte 1024" in message  # after b's header and padded content
    assert "unique across the dataset" in message and "Give the samples distinct keys" in message
    assert "--exclude" not in message and "--fix-duplicates" not in message  # prepare's advice, not write's
    assert not (tmp_path / "out" / "train").exists() and not list((tmp_path / "out").rglob("*.tar"))


def test_a_key_twice_in_one_shard_is_refused_naming_the_key_and_both_offsets(tmp_path: Path) -> None:
    with pytest.raises(
        PrepError,
        match=r"shard-000000.tar: a sample key is not unique: 'a' appears at byte 0"
        r" and again at byte 2048\. energon needs every sample key to be unique",
    ):
        with DatasetBuild(tmp_path / "out", limits=ShardLimits(), pattern="shard-%06d.tar") as build:
            for key in ("a", "b", "a"):
                build.writer("train").write(key, [("txt", b"x")])
            build.finish(["train"], None)


def test_a_given_key_equal_to_a_generated_one_is_refused_where_it_is_made(tmp_path: Path) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "000000000.txt").write_text("hi")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"a": 1}\n{"a": 2}\n')
    with pytest.raises(
        BadInputError, match=f"{rows}:1: the generated sample key '000000000' is already the key"
    ):
        write_dataset(open_sources([tmp_path / "folder", rows]), tmp_path / "out", maxcount=1)
    with pytest.raises(
        BadInputError, match=r"folder/000000000\.\*: sample key '000000000' is already the generated"
    ):
        write_dataset(open_sources([rows, tmp_path / "folder"]), tmp_path / "out")
    summary = write_dataset(open_sources([tmp_path / "folder", rows]), tmp_path / "out", on_error="skip")
    assert summary.samples == 2 and summary.rejects == 1


def test_gnu_tar_and_tarfile_read_the_shards_unchanged(tmp_path: Path) -> None:
    samples = varied_samples(30)
    write_dataset(samples, tmp_path / "out", maxcount=100)
    shard = tmp_path / "out" / "shard-000000.tar"
    listing = subprocess.run(["tar", "-tf", str(shard)], capture_output=True, text=True, check=True)
    names = [f"{s['__key__']}.{part}" for s in samples for part in ("txt", "json", "empty.bin")]
    assert listing.stdout.splitlines() == names
    assert [key for key, _ in tar_samples(shard)] == [s["__key__"] for s in samples]
    assert [parts["txt"] for _, parts in tar_samples(shard)] == [s["txt"].encode() for s in samples]


def test_small_samples_take_plain_ustar_framing_only(tmp_path: Path) -> None:
    """A 300-byte part costs one header block and one data block, no PAX header (webdataset adds one each)."""
    rows = [{"__key__": f"{i:09d}", "json": b"x" * 300} for i in range(50)]
    write_dataset(rows, tmp_path / "out")
    shard = tmp_path / "out" / "shard-000000.tar"
    assert shard.stat().st_size == 50 * 1024 + 1024
    with tarfile.open(shard) as tar:
        assert all(member.pax_headers == {} for member in tar)


def test_header_checksums_match_tarfile(tmp_path: Path) -> None:
    header = HeaderMaker(mtime=1_700_000_000).member("abc/0001.jpg", 123456)
    info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
    assert (info.name, info.size, info.mtime, info.type) == (
        "abc/0001.jpg",
        123456,
        1_700_000_000,
        tarfile.REGTYPE,
    )
