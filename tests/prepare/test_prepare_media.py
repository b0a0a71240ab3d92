"""`shardprep prepare-media` writes what `energon prepare-media` 7.4.1 writes, on a folder dataset and on a
prepared WebDataset, and leaves the old index as it was when it fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from prep.prepare import prepare_dataset
from tests.prepare.test_media_matches_energon import FLAGS, av_dataset, media_dataset
from tests.support.damaged_index import dataset_with_damaged_index, described_by_extension, zero_leaf_pages
from tests.support.media import assert_same_media_index, audio_video, images, without_created_at
from tests.support.prepare import (
    media_rows,
    run_energon,
    run_energon_prepare,
    run_shardprep,
    snapshot,
    sqlite_contents,
    twin,
)
from tests.support.shards import sample_members, write_tarfile

IMAGES = images()


def run_energon_prepare_media(*args: str) -> subprocess.CompletedProcess:
    return run_energon("prepare-media", "--no-progress", "--num-workers", "2", *args, timeout=120)


def folder_dataset(root: Path) -> Path:
    """Images in the folder, a sub-folder, a hidden folder and a folder reached by a symbolic link."""
    for number, (name, data) in enumerate(sorted(IMAGES.items())):
        folder = root / ("", "sub", ".hidden", "outside")[number % 4]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    (root / "notes.txt").write_text("not media")
    (root / "sub" / "clip.wav").write_bytes(b"RIFF\0\0\0\0WAVEfmt ")
    shutil.move(root / "outside", root.parent / f"{root.name}-linked")
    os.symlink(root.parent / f"{root.name}-linked", root / "linked")
    return root


def same_media_tables(ours: Path, theirs: Path) -> None:
    tables = []
    for root in (ours, theirs):
        copy = root.parent / f"{root.name}-compared"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(root / ".nv-meta", copy / ".nv-meta")
        without_created_at(copy)
        tables.append(sqlite_contents(copy / ".nv-meta" / "index.sqlite"))
    assert tables[0] == tables[1]
    assert (
        sorted(os.listdir(ours / ".nv-meta")) == sorted(os.listdir(theirs / ".nv-meta")) == ["index.sqlite"]
    )


def test_a_folder_dataset_gets_energons_media_tables_also_when_run_again(tmp_path: Path) -> None:
    ours, theirs = folder_dataset(tmp_path / "ours"), folder_dataset(tmp_path / "theirs")
    for _ in range(2):  # the second run keeps the rows and records the filter once
        run_shardprep(
            "prepare-media", str(ours), "--media-metadata-by-extension", "--no-progress", check=True
        )
        run_energon_prepare_media(str(theirs), "--media-metadata-by-extension")
    keys = [row[0] for row in media_rows(ours)]
    assert "sub/clip.wav" not in keys and any(key.startswith("linked/") for key in keys)
    assert any(key.startswith(".hidden/") for key in keys)
    same_media_tables(ours, theirs)


def test_a_prepared_webdataset_gets_the_rows_energons_prepare_media_adds(tmp_path: Path) -> None:
    ours = media_dataset(tmp_path / "ours", shards=2)
    theirs = twin(ours, "theirs")
    run_shardprep("prepare", str(ours), *FLAGS, check=True)
    run_energon_prepare(str(theirs), *FLAGS)
    uuid = (ours / ".nv-meta" / "index.uuid").read_text()
    run_shardprep("prepare-media", str(ours), "--media-metadata-by-extension", "--no-progress", check=True)
    run_energon_prepare_media(str(theirs), "--media-metadata-by-extension")
    assert media_rows(ours) and (ours / ".nv-meta" / "index.uuid").read_text() == uuid
    assert_same_media_index(ours, theirs)


def prepare_and_describe(ours: Path, theirs: Path) -> None:
    """`ours` prepared and its media described by extension with shardprep, `theirs` with energon."""
    run_shardprep("prepare", str(ours), *FLAGS, check=True)
    run_energon_prepare(str(theirs), *FLAGS)
    run_shardprep("prepare-media", str(ours), "--media-metadata-by-extension", "--no-progress", check=True)
    run_energon_prepare_media(str(theirs), "--media-metadata-by-extension")


def test_preparing_again_keeps_the_media_tables_as_energon_does(tmp_path: Path) -> None:
    # Our prepare rebuilt index.sqlite and dropped the media tables without a word; energon's drops and
    # rebuilds only `samples` and `sample_parts`.
    ours = media_dataset(tmp_path / "ours", shards=1)
    theirs = twin(ours, "theirs")
    prepare_and_describe(ours, theirs)
    described = sqlite_contents(ours / ".nv-meta" / "index.sqlite")
    again = run_shardprep("prepare", str(ours), *FLAGS, "--force-overwrite", check=True)
    run_energon_prepare(str(theirs), *FLAGS, "--force-overwrite")
    kept = sqlite_contents(ours / ".nv-meta" / "index.sqlite")
    assert kept["media_filters"] == described["media_filters"] and kept["media_metadata"]["rows"]
    assert "media" not in again.stderr
    assert_same_media_index(ours, theirs)


def test_audio_and_video_in_a_folder_and_in_shards_get_energons_rows(tmp_path: Path) -> None:
    pytest.importorskip("av", reason="energon describes audio/video only with PyAV installed")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for root in (ours, theirs):
        for number, (name, data) in enumerate(sorted(audio_video().items())):
            folder = root / ("", "clips")[number % 2]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
    run_shardprep("prepare-media", str(ours), "--media-metadata-by-extension", "--no-progress", check=True)
    run_energon_prepare_media(str(theirs), "--media-metadata-by-extension")
    assert any(key.startswith("clips/") for key, _, _ in media_rows(ours))
    same_media_tables(ours, theirs)

    shards = av_dataset(tmp_path / "shards", shards=2)
    shards_theirs = twin(shards, "shards-theirs")
    prepare_and_describe(shards, shards_theirs)
    assert media_rows(shards)
    assert_same_media_index(shards, shards_theirs)


def test_a_folder_by_header_finds_media_under_any_name(tmp_path: Path) -> None:
    # energon 7.4.1 fails here: it hands its path object to `filetype`, which refuses it.
    root = tmp_path / "d"
    root.mkdir()
    (root / "picture.bin").write_bytes(IMAGES["rgb33.png"])
    (root / "notes.txt").write_text("plain text")
    run_shardprep("prepare-media", str(root), "--media-metadata-by-header", "--no-progress", check=True)
    assert media_rows(root) == [
        ("picture.bin", "image", '{"width":33,"height":17,"format":"PNG","mode":"RGB"}')
    ]


def test_no_media_or_a_broken_header_is_a_clear_error_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "d"
    root.mkdir()
    (root / "notes.txt").write_text("plain text")
    empty = run_shardprep("prepare-media", str(root), "--media-metadata-by-extension")
    assert empty.returncode == 1 and "No media files found" in empty.stderr
    assert not (root / ".nv-meta").exists()
    (root / "good.png").write_bytes(IMAGES["rgb1.png"])
    run_shardprep("prepare-media", str(root), "--media-metadata-by-extension", check=True)
    before = snapshot(root)
    (root / "cut.gif").write_bytes(IMAGES["p33.gif"][:11])
    broken = run_shardprep("prepare-media", str(root), "--media-metadata-by-extension")
    assert broken.returncode == 1
    assert f"{root / 'cut.gif'} at byte 11" in broken.stderr and "logical screen" in broken.stderr
    (root / "cut.gif").unlink()
    assert snapshot(root) == before


@pytest.mark.parametrize("damage", ["samples", "sample_parts", "not a database"])
def test_a_damaged_index_is_named_with_what_to_do_and_left_as_it_was(tmp_path: Path, damage: str) -> None:
    # The copy prepare-media writes to met the damage, and sqlite's traceback was all it said.
    root = dataset_with_damaged_index(tmp_path / "d", "samples" if damage == "not a database" else damage)
    index = root / ".nv-meta" / "index.sqlite"
    if damage == "not a database":
        index.write_bytes(b"not sqlite" * 100)
    before = snapshot(root)
    result = run_shardprep("prepare-media", str(root), "--media-metadata-by-extension", "--no-progress")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    reason = "file is not a database" if damage == "not a database" else "database disk image is malformed"
    assert result.stderr == (
        f"Error: {index} cannot be read ({reason}). Re-run `shardprep prepare` (or `energon prepare`) on the"
        " dataset folder.\n"
    )
    assert snapshot(root) == before  # the index byte for byte, and nothing staged left behind


def test_a_damaged_index_with_media_says_to_describe_the_media_again(tmp_path: Path) -> None:
    # The advice was only to prepare again, which (as energon's) makes no media metadata.
    root = dataset_with_damaged_index(tmp_path / "d", "samples")
    index = root / ".nv-meta" / "index.sqlite"
    described_by_extension(index)
    result = run_shardprep("prepare-media", str(root), "--media-metadata-by-extension", "--no-progress")
    assert result.returncode == 1, result.stderr
    assert result.stderr.endswith(
        "Re-run `shardprep prepare` (or `energon prepare`) on the dataset folder. Then run"
        f" `shardprep prepare-media {root} --media-metadata-by-extension` for its media metadata.\n"
    ), result.stderr


def test_preparing_over_unreadable_media_tables_says_they_are_gone_and_how_to_remake_them(
    tmp_path: Path,
) -> None:
    root = tmp_path / "d"
    write_tarfile(root / "shard-000.tar", sample_members("sample-", 10))
    prepare_dataset(root, sample_type="CrudeWebdataset")
    index = root / ".nv-meta" / "index.sqlite"
    described_by_extension(index)
    zero_leaf_pages(index, "media_metadata")
    result = run_shardprep("prepare", str(root), *FLAGS, "--force-overwrite", check=True)
    assert result.stderr == (
        "Warning: the media metadata of the old index could not be read (database disk image is malformed)"
        f" and is gone: run `shardprep prepare-media {root} --media-metadata-by-extension` to describe the"
        " media again.\n"
    )
    assert "media_metadata" not in sqlite_contents(index)


def test_a_folder_datasets_damaged_index_is_named_with_what_to_do_and_left_as_it_was(tmp_path: Path) -> None:
    root = tmp_path / "d"
    (root / ".nv-meta").mkdir(parents=True)
    (root / "good.png").write_bytes(IMAGES["rgb1.png"])
    index = root / ".nv-meta" / "index.sqlite"
    index.write_bytes(b"not sqlite" * 100)
    before = snapshot(root)
    result = run_shardprep("prepare-media", str(root), "--media-metadata-by-extension", "--no-progress")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"Error: {index} cannot be read (file is not a database). "), (
        result.stderr
    )
    assert "remove it and run `shardprep prepare-media` again" in result.stderr, result.stderr
    assert snapshot(root) == before


def test_energons_file_stores_read_our_media_metadata(tmp_path: Path) -> None:
    from megatron.energon.cache.file_store import SystemFileStore, WebdatasetFileStore
    from megatron.energon.epathlib import EPath
    from megatron.energon.media import ImageMetadata

    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.webp").write_bytes(IMAGES["lossless33.webp"])
    run_shardprep("prepare-media", str(folder), "--media-metadata-by-extension", check=True)
    found = SystemFileStore(EPath(folder)).get_media_metadata("a.webp")
    assert found == ImageMetadata(width=33, height=17, format="WEBP", mode="RGBA")

    shards = media_dataset(tmp_path / "shards", shards=1)
    run_shardprep("prepare", str(shards), *FLAGS, "--media-metadata-by-extension", check=True)
    key, _, text = media_rows(shards)[0]
    found = WebdatasetFileStore(EPath(shards)).get_media_metadata(key)
    assert isinstance(found, ImageMetadata) and found.to_dict() == json.loads(text)
