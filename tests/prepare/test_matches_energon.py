"""`shardprep prepare` writes what `energon prepare` 7.4.1 writes, on shards from several writers."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from tests.support.prepare import assert_same_index, run_energon_prepare, run_shardprep, twin
from tests.support.shards import (
    sample_members,
    tricky_members,
    without_end_marker,
    write_gnu_tar,
    write_tarfile,
    write_webdataset,
)

FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--no-progress"]


def prepare_both(
    dataset: Path, *flags: str, energon_flags: tuple[str, ...] | None = None
) -> tuple[Path, Path]:
    theirs = twin(dataset, dataset.name + "-energon")
    ours = dataset
    result = run_shardprep("prepare", str(ours), *flags)
    assert result.returncode == 0, result.stderr
    run_energon_prepare(str(theirs), *(energon_flags if energon_flags is not None else flags))
    return ours, theirs


def test_python_tarfile_formats_index_like_energon(tmp_path: Path) -> None:
    dataset = tmp_path / "tarfile"
    write_tarfile(
        dataset / "pax" / "shard-000.tar", tricky_members("p/") + sample_members("pax-", 30), non_regular=True
    )
    write_tarfile(
        dataset / "gnu" / "shard-000.tar",
        tricky_members("g/") + sample_members("gnu-", 30),
        tarfile.GNU_FORMAT,
    )
    ustar = [(name, data) for name, data in tricky_members("u/") if name.isascii() and len(name) < 200]
    write_tarfile(
        dataset / "ustar" / "shard-000.tar", ustar + sample_members("ustar-", 30), tarfile.USTAR_FORMAT
    )
    # A global PAX header in front of everything (tarfile writes one when given pax_headers).
    write_tarfile(
        dataset / "global.tar", sample_members("glob-", 12), pax_headers={"comment": "global header"}
    )
    ours, theirs = prepare_both(dataset, *FLAGS, "--sample-type", "CrudeWebdataset")
    assert_same_index(ours, theirs)


def test_a_shard_name_of_240_bytes_indexes_like_energon_and_one_of_252_is_refused(tmp_path: Path) -> None:
    """A shard's `.tar.idx` is its name and four bytes: energon writes it up to the filesystem's 255 bytes
    (our staged names, longer still, are cut to fit); past that no index file can be written."""
    dataset = tmp_path / "long"
    write_tarfile(dataset / ("é" * 118 + ".tar"), sample_members("long-", 12))  # 240 bytes in UTF-8
    ours, theirs = prepare_both(dataset, *FLAGS, "--sample-type", "CrudeWebdataset")
    assert_same_index(ours, theirs)
    write_tarfile(dataset / ("x" * 248 + ".tar"), sample_members("longer-", 3))
    before = sorted(path.name for path in dataset.iterdir())
    result = run_shardprep(
        "prepare", str(dataset), *FLAGS, "--sample-type", "CrudeWebdataset", "--force-overwrite"
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{'x' * 248}.tar: the name of its index file" in result.stderr
    assert sorted(path.name for path in dataset.iterdir()) == before


def test_webdataset_tarwriter_shards_index_like_energon(tmp_path: Path) -> None:
    dataset = tmp_path / "wds"
    for shard in range(5):
        samples = [
            {
                "__key__": f"s{shard}/{i:06d}",
                "json": {"shard": shard, "i": i},
                "txt": f"caption {i}",
                "cls": i % 3,
            }
            for i in range(40)
        ]
        samples.append({"__key__": f"s{shard}/empty", "txt": ""})
        write_webdataset(dataset / f"shards-{shard:04d}.tar", samples)
    ours, theirs = prepare_both(dataset, *FLAGS, "--sample-type", "CrudeWebdataset", "--shuffle-tars")
    assert_same_index(ours, theirs)


@pytest.mark.parametrize("fmt", ["gnu", "pax", "ustar"])
def test_gnu_tar_shards_index_like_energon(tmp_path: Path, fmt: str) -> None:
    dataset = tmp_path / f"gnutar-{fmt}"
    tricky = tricky_members("t/")
    if fmt == "ustar":
        tricky = [(name, data) for name, data in tricky if name.isascii() and len(name) < 200]
    write_gnu_tar(dataset / "a" / "part-0.tar", tricky + sample_members("a-", 25), fmt)
    write_gnu_tar(dataset / "a-b.tar", sample_members("ab-", 10), fmt)
    write_gnu_tar(dataset / "a" / "b.tar", sample_members("b-", 10), fmt)
    ours, theirs = prepare_both(
        dataset, *FLAGS, "--sample-type", "TextSample", "--field-map", '{"text": "txt"}'
    )
    assert_same_index(ours, theirs)


def test_split_parts_and_exclude_match_energon(tmp_path: Path) -> None:
    dataset = tmp_path / "parts"
    for split, count in (("train", 6), ("val", 2), ("test", 2)):
        for n in range(count):
            write_tarfile(dataset / split / f"{n:03d}.tar", sample_members(f"{split}{n}-", 5))
    write_tarfile(dataset / "broken" / "skip-me.tar", sample_members("bad-", 2))
    flags = [
        "--non-interactive",
        "--no-progress",
        "--split-parts",
        "train:train/{000..004}.tar",
        "--split-parts",
        "val:val/.*",
        "--split-parts",
        "test:(test|train/005)",
        "--exclude",
        "broken/",
        "--skip-dataset-yaml",
    ]
    ours, theirs = prepare_both(dataset, *flags)
    assert_same_index(ours, theirs, dataset_yaml=None)
    assert not (ours / ".nv-meta" / "dataset.yaml").exists()
    assert not (ours / "broken" / "skip-me.tar.idx").exists()


def test_a_dataset_yaml_in_a_sub_folder_of_nv_meta_is_written_like_energon(tmp_path: Path) -> None:
    """`--dataset-yaml-name configs/text.yaml` (what a metadataset's `dataset_config` names): the folder is
    made, as energon makes it."""
    dataset = tmp_path / "configs"
    write_tarfile(dataset / "a.tar", sample_members("a-", 4))
    flags = [*FLAGS, "--sample-type", "TextSample", "--field-map", '{"text": "txt"}']
    ours, theirs = prepare_both(dataset, *flags, "--dataset-yaml-name", "configs/text.yaml")
    assert_same_index(ours, theirs, dataset_yaml="configs/text.yaml")
    assert not (ours / ".nv-meta" / "dataset.yaml").exists()


def test_a_second_prepare_keeps_the_users_folders_and_links_in_nv_meta_as_energon_does(
    tmp_path: Path,
) -> None:
    """energon writes its own files into .nv-meta and leaves the rest; so does a prepare over an index."""
    dataset = tmp_path / "kept"
    write_tarfile(dataset / "a.tar", sample_members("a-", 4))
    run_shardprep("prepare", str(dataset), *FLAGS, "--crude", check=True)
    meta = dataset / ".nv-meta"
    (meta / "configs" / "deep").mkdir(parents=True)
    (meta / "configs" / "deep" / "text.yaml").write_text("field_map: {text: txt}\n")
    (meta / "linked.yaml").symlink_to("configs/deep/text.yaml")
    for flags in (("--force-overwrite",), ("--tar-index-only",)):
        run_shardprep("prepare", str(dataset), *FLAGS, "--crude", *flags, check=True)
        assert (meta / "configs" / "deep" / "text.yaml").read_text() == "field_map: {text: txt}\n"
        assert os.readlink(meta / "linked.yaml") == "configs/deep/text.yaml"


def test_a_prepare_writes_no_file_through_a_link_in_nv_meta(tmp_path: Path) -> None:
    """A dataset.yaml linked to a file outside the dataset: the prepare that writes a new one replaces the
    link in its staged index. Written through, the shared file changed before the run was done (and stayed
    changed had the run failed); energon writes through it."""
    dataset = tmp_path / "linked"
    write_tarfile(dataset / "a.tar", sample_members("a-", 4))
    run_shardprep("prepare", str(dataset), *FLAGS, "--crude", check=True)
    shared = tmp_path / "shared.yaml"
    shared.write_text("sample_type: {__module__: x, __class__: Shared}\n")
    (dataset / ".nv-meta" / "dataset.yaml").unlink()
    (dataset / ".nv-meta" / "dataset.yaml").symlink_to(shared)
    run_shardprep("prepare", str(dataset), *FLAGS, "--crude", "--force-overwrite", check=True)
    assert shared.read_text() == "sample_type: {__module__: x, __class__: Shared}\n"
    written = dataset / ".nv-meta" / "dataset.yaml"
    assert not written.is_symlink() and "CrudeWebdataset" in written.read_text()


def test_tar_index_only_rebuilds_indexes_like_energon(tmp_path: Path) -> None:
    dataset = tmp_path / "reindex"
    for n in range(3):
        write_tarfile(dataset / f"{n:03d}.tar", sample_members(f"r{n}-", 7))
    ours, theirs = prepare_both(dataset, *FLAGS, "--sample-type", "CrudeWebdataset")
    for root in (ours, theirs):
        (root / "001.tar.idx").unlink()
        (root / ".nv-meta" / "index.sqlite").unlink()
    old_uuid = (ours / ".nv-meta" / "index.uuid").read_text()
    result = run_shardprep("prepare", str(ours), "--tar-index-only", "--no-progress")
    assert result.returncode == 0, result.stderr
    run_energon_prepare(str(theirs), "--tar-index-only", "--no-progress")
    assert_same_index(ours, theirs)
    assert (ours / ".nv-meta" / "index.uuid").read_text() != old_uuid


def test_shards_without_end_marker_index_like_energon_with_one_warning(tmp_path: Path) -> None:
    dataset = tmp_path / "no-end"
    without_end_marker(write_tarfile(dataset / "a.tar", sample_members("a-", 5)))
    write_tarfile(dataset / "b.tar", sample_members("b-", 5))
    without_end_marker(write_gnu_tar(dataset / "c.tar", sample_members("c-", 4)))
    ours, theirs = prepare_both(dataset, *FLAGS, "--sample-type", "CrudeWebdataset")
    assert_same_index(ours, theirs)
    assert json.loads((ours / ".nv-meta" / ".info.json").read_text())["shard_counts"] == {
        "a.tar": 5,
        "b.tar": 5,
        "c.tar": 4,
    }
    result = run_shardprep("prepare", str(ours), *FLAGS, "--crude", "--force-overwrite", check=True)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "2 shard(s) end without the end-of-archive marker" in warnings[0]
    assert "a.tar, c.tar." in warnings[0] and "b.tar" not in warnings[0]


def test_archives_joined_end_to_end_index_like_energon_with_a_warning_and_strict_refuses(
    tmp_path: Path,
) -> None:
    """`cat a.tar b.tar`: every reader stops at a.tar's end-of-archive marker, so b.tar's samples are
    not indexed (by energon either); prepare names the shard and where the unread data starts."""
    dataset = tmp_path / "joined"
    first = write_gnu_tar(tmp_path / "parts" / "a.tar", sample_members("a-", 3))
    second = write_gnu_tar(tmp_path / "parts" / "b.tar", sample_members("b-", 3))
    dataset.mkdir()
    (dataset / "ab.tar").write_bytes(first.read_bytes() + second.read_bytes())
    write_tarfile(dataset / "c.tar", sample_members("c-", 4))
    ours, theirs = prepare_both(dataset, *FLAGS, "--sample-type", "CrudeWebdataset")
    assert_same_index(ours, theirs)
    result = run_shardprep("prepare", str(ours), *FLAGS, "--crude", "--force-overwrite", check=True)
    (warning,) = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert "1 shard(s) hold data after their end-of-archive marker" in warning
    assert f"ab.tar (at byte {first.stat().st_size:,})" in warning and "c.tar" not in warning
    strict = run_shardprep("prepare", str(ours), *FLAGS, "--crude", "--force-overwrite", "--strict")
    assert strict.returncode == 1 and f"ab.tar at byte {first.stat().st_size}" in strict.stderr
