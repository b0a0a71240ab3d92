"""Bad shards get one clear message naming the shard (and byte offset), a non-zero exit, and leave the
previous index exactly as it was; tars are never modified."""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from prep.errors import ShardError
from prep.prepare import prepare_dataset
from tests.support.prepare import run_shardprep, snapshot
from tests.support.shards import sample_members, write_gnu_tar, write_tarfile

FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--no-progress", "--crude", "--force-overwrite"]


@pytest.fixture
def prepared(tmp_path: Path) -> Path:
    """A dataset of three good shards, already prepared by shardprep."""
    root = tmp_path / "dataset"
    for n in range(3):
        write_tarfile(root / f"shard-{n:03d}.tar", sample_members(f"s{n}-", 8))
    result = run_shardprep("prepare", str(root), *FLAGS)
    assert result.returncode == 0, result.stderr
    return root


def fails_cleanly(root: Path, *expected: str, flags: tuple[str, ...] = ()) -> str:
    """Run prepare again; it must fail with a message containing `expected` and change nothing on disk."""
    before = snapshot(root)
    result = run_shardprep("prepare", str(root), *FLAGS, *flags)
    assert result.returncode != 0
    message = result.stderr
    assert "Traceback" not in message, message
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"
    assert snapshot(root) == before, "a failed run changed files"
    return message


def test_truncated_inside_member_data_names_shard_and_offset(prepared: Path) -> None:
    shard = prepared / "shard-001.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[: 512 * 7 + 100])  # inside the data of a member
    fails_cleanly(prepared, "shard-001.tar at byte", "cut short inside the member's data")


def test_truncated_inside_header_is_refused_not_partially_indexed(prepared: Path) -> None:
    shard = prepared / "shard-002.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[: 512 * 8 + 200])  # energon's tarfile stops here silently
    fails_cleanly(prepared, "shard-002.tar at byte 4096", "ends inside a header")


def test_without_end_marker_is_refused_with_strict(prepared: Path) -> None:
    shard = prepared / "shard-002.tar"
    shard.write_bytes(shard.read_bytes()[: 512 * 8])  # two whole samples, then nothing
    message = fails_cleanly(
        prepared, "shard-002.tar at byte 4096", "end-of-archive marker", flags=("--strict",)
    )
    assert "without --strict it is indexed" in message


def test_extended_header_at_the_very_end_is_refused(prepared: Path) -> None:
    shard = prepared / "shard-001.tar"
    long_name = write_tarfile(prepared.parent / "long.tar", [("k" * 120 + ".txt", b"x")], tarfile.GNU_FORMAT)
    shard.write_bytes(long_name.read_bytes()[: 512 * 2])  # a GNU long-name header and its name, no member
    fails_cleanly(prepared, "shard-001.tar at byte 0", "extended header is followed by the end of the shard")


def test_without_end_marker_warns_through_the_python_api(tmp_path: Path) -> None:
    root = tmp_path / "d"
    shard = write_tarfile(root / "a.tar", sample_members("a-", 3))
    shard.write_bytes(shard.read_bytes()[: 512 * 12])
    with pytest.warns(UserWarning, match=r"1 shard\(s\) end without the end-of-archive marker .*: a.tar\."):
        counts = prepare_dataset(root)
    assert counts == {"a.tar": 3}
    with pytest.raises(ShardError, match="a.tar at byte 6144"):
        prepare_dataset(root, strict=True)


def test_file_named_tar_that_is_not_a_tar(prepared: Path) -> None:
    (prepared / "notes.tar").write_text("these are my notes, not a tar archive\n" * 40)
    fails_cleanly(prepared, "notes.tar", "is not a tar archive")


def test_zero_byte_file_named_tar(prepared: Path) -> None:
    (prepared / "zero.tar").write_bytes(b"")
    fails_cleanly(prepared, "zero.tar", "empty file")


def test_gzip_compressed_shard_is_refused(prepared: Path) -> None:
    plain = (prepared / "shard-000.tar").read_bytes()
    (prepared / "packed.tgz").write_bytes(gzip.compress(plain))
    fails_cleanly(prepared, "packed.tgz", "gzip-compressed", "Decompress")


def test_duplicate_key_across_shards_names_both(prepared: Path) -> None:
    write_tarfile(prepared / "shard-003.tar", sample_members("s1-", 2))
    fails_cleanly(prepared, "'s1-00000'", "shard-001.tar at byte 0", "shard-003.tar at byte 0", "unique")


def test_non_contiguous_key_within_shard(prepared: Path) -> None:
    members = [("k1.json", b"1"), ("k2.json", b"2"), ("k1.txt", b"again")]
    write_tarfile(prepared / "shard-003.tar", members)
    fails_cleanly(prepared, "shard-003.tar at byte 2048", "'k1' appears again")


def test_flipped_header_byte_is_reported_as_corrupt(prepared: Path) -> None:
    shard = prepared / "shard-000.tar"
    data = bytearray(shard.read_bytes())
    data[512 * 4 + 3] ^= 0x20  # inside the name of a later member's header
    shard.write_bytes(bytes(data))
    fails_cleanly(prepared, "shard-000.tar at byte 2048", "corrupt")


def test_every_bad_shard_is_listed_in_one_report(prepared: Path) -> None:
    (prepared / "a-notes.tar").write_text("x" * 1000)
    (prepared / "b-zero.tar").write_bytes(b"")
    message = fails_cleanly(prepared, "2 problems", "a-notes.tar", "b-zero.tar")
    assert message.count("\n  - ") == 2


def test_an_exclude_that_is_not_a_regex_is_named_not_a_traceback(prepared: Path) -> None:
    fails_cleanly(
        prepared, "Invalid --exclude regex '('", "unterminated subpattern", flags=("--exclude", "(")
    )


def test_split_parts_with_unbalanced_braces_or_a_bad_regex_are_named_not_a_traceback(prepared: Path) -> None:
    fails_cleanly(
        prepared,
        "Invalid --split-parts regex 'shard-{000' for split 'train'",
        "Unbalanced braces",
        flags=("--split-parts", "train:shard-{000"),
    )
    fails_cleanly(
        prepared, "Invalid --split-parts regex '(' for split 'val'", flags=("--split-parts", "val:(")
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../shard-001.tar", "must be a file name inside .nv-meta"),  # energon writes the YAML over the shard
        ("/tmp/elsewhere.yaml", "must be a file name inside .nv-meta"),
        ("", "must be a file name inside .nv-meta"),
        ("index.sqlite", "names a file of the index itself (.nv-meta/index.sqlite)"),
        ("split.yaml", "names a file of the index itself (.nv-meta/split.yaml)"),
    ],
)
def test_a_dataset_yaml_name_outside_nv_meta_or_over_an_index_file_is_refused(
    prepared: Path, name: str, expected: str
) -> None:
    fails_cleanly(prepared, f"--dataset-yaml-name {name!r}", expected, flags=("--dataset-yaml-name", name))


def test_a_tar_and_a_tgz_of_one_name_are_refused_not_indexed_into_one_index_file(prepared: Path) -> None:
    """Both would have shard-001.tar.idx, and energon's loader reads a shard's samples at the offsets in it:
    energon writes the file twice and one shard reads the other's offsets."""
    write_tarfile(prepared / "shard-001.tgz", sample_members("plain-tgz-", 3))  # an uncompressed tar
    fails_cleanly(
        prepared, "shard-001.tar and shard-001.tgz would both have their index in shard-001.tar.idx"
    )


def test_folder_without_shards(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("no shards here")
    result = run_shardprep("prepare", str(tmp_path / "empty"), *FLAGS)
    assert result.returncode != 0
    assert "No shards found under" in result.stderr and "*.tar" in result.stderr
    assert not (tmp_path / "empty" / ".nv-meta").exists()


def test_missing_folder(tmp_path: Path) -> None:
    result = run_shardprep("prepare", str(tmp_path / "nowhere"), *FLAGS)
    assert result.returncode != 0 and "does not exist" in result.stderr


def test_unreadable_shard(prepared: Path) -> None:
    (prepared / "shard-001.tar").chmod(0o200)
    before = snapshot(prepared)
    result = run_shardprep("prepare", str(prepared), *FLAGS, honour_permissions=True)
    assert result.returncode != 0
    assert "shard-001.tar" in result.stderr and "permission denied" in result.stderr, result.stderr
    assert snapshot(prepared) == before


def test_empty_tar_is_indexed_with_no_samples(prepared: Path) -> None:
    write_tarfile(prepared / "shard-003.tar", [])
    result = run_shardprep("prepare", str(prepared), *FLAGS)
    assert result.returncode == 0, result.stderr
    info = (prepared / ".nv-meta" / ".info.json").read_text()
    assert '"shard-003.tar": 0' in info
    assert "shard-003.tar holds no samples" in result.stderr
    assert (prepared / "shard-003.tar.idx").stat().st_size == 8


def test_gnu_tar_without_trailing_record_padding_still_indexes(tmp_path: Path) -> None:
    root = tmp_path / "d"
    write_gnu_tar(root / "x.tar", sample_members("x-", 3))
    result = run_shardprep("prepare", str(root), *FLAGS)
    assert result.returncode == 0, result.stderr


def test_interrupted_run_leaves_no_staging_files(prepared: Path) -> None:
    """A failed run removes its staged `.tar.idx` and `.nv-meta` copies (checked by the snapshot too)."""
    (prepared / "zz.tar").write_text("not a tar" * 100)
    fails_cleanly(prepared, "zz.tar")
    leftovers = [p.name for p in prepared.rglob("*shardprep*")]
    assert leftovers == []
    shutil.rmtree(prepared / ".nv-meta")


def test_member_named_like_a_compression_magic_is_still_a_tar(tmp_path: Path) -> None:
    root = tmp_path / "magic"
    write_tarfile(root / "a.tar", [("BZh91AY.txt", b"not bzip2"), ("BZh91AY.json", b"{}")])
    result = run_shardprep("prepare", str(root), *FLAGS)
    assert result.returncode == 0, result.stderr


def test_a_fifo_named_like_a_shard_is_named_not_waited_on(prepared: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: prepare must not hang on one."""
    os.mkfifo(prepared / "shard-003.tar")
    fails_cleanly(prepared, "shard-003.tar: is not a regular file (a FIFO, socket or device)")


def test_a_folder_where_a_tar_idx_goes_is_named_before_any_work(prepared: Path) -> None:
    (prepared / "shard-001.tar.idx").unlink()
    (prepared / "shard-001.tar.idx").mkdir()
    fails_cleanly(
        prepared, f"{prepared / 'shard-001.tar.idx'} is a folder, where prepare writes the index file"
    )


def test_a_shard_cut_inside_an_extended_headers_records_is_named_as_cut_short(prepared: Path) -> None:
    """A PAX header's records run past the end of a cut shard: the message says so at the header, with
    no offset past the end of the file."""
    shard = prepared / "shard-003.tar"
    write_tarfile(shard, [("k" * 120 + "/0.txt", b"x")], tarfile.PAX_FORMAT)
    shard.write_bytes(shard.read_bytes()[:700])  # the PAX header block, and part of its records
    message = fails_cleanly(prepared, "shard-003.tar at byte 0", "cut short")
    assert "-" not in message.split("of its 512 bytes")[0][-6:], message
