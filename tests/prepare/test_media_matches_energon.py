"""`shardprep prepare --media-metadata-by-*` writes the media tables `energon prepare` 7.4.1 writes, row for
row, on shards of real JPEG, PNG, GIF, WebP (and other) images and of real WAV, FLAC, MP4, MOV, MKV, WebM,
MP3, OGG and M4A clips, and changes nothing else it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.media import assert_same_media_index, audio_video, images
from tests.support.prepare import media_rows, run_energon_prepare, run_shardprep, snapshot, twin
from tests.support.shards import write_tarfile

FLAGS = ["--non-interactive", "--split-ratio", "8,1,1", "--no-progress", "--sample-type", "CrudeWebdataset"]
IMAGES = images()


def media_dataset(root: Path, shards: int = 3) -> Path:
    """Shards whose samples hold images under their own names, text parts and audio-like parts."""
    names = sorted(IMAGES)
    for shard in range(shards):
        members = []
        for sample in range(8):
            key = f"s{shard}/{sample:05d}"
            members += [(f"{key}.txt", b"caption"), (f"{key}.json", b'{"a": 1}')]
            for name in names[(shard * 8 + sample) % len(names) :][:4]:
                members.append((f"{key}.{name}", IMAGES[name]))
            if sample == 3:
                members += [
                    (f"{key}.wav", b"RIFF\0\0\0\0WAVEfmt "),
                    (f"{key}.clip.mp4", b"\0\0\0\x18ftypmp42"),
                ]
        write_tarfile(root / f"shard-{shard:03d}.tar", members)
    return root


def av_dataset(root: Path, shards: int = 3) -> Path:
    """Shards whose samples hold audio and video clips under their own names (every clip at least once,
    some in two shards), with a text part each."""
    clips = audio_video()
    names = sorted(clips)
    for shard in range(shards):
        members = []
        for sample in range(len(names) // shards + 2):
            key = f"a{shard}/{sample:05d}"
            members.append((f"{key}.txt", b"caption"))
            name = names[(shard * (len(names) // shards) + sample) % len(names)]
            members.append((f"{key}.{name}", clips[name]))
        write_tarfile(root / f"shard-{shard:03d}.tar", members)
    return root


@pytest.mark.parametrize("flag", ["--media-metadata-by-extension", "--media-metadata-by-header"])
def test_media_tables_equal_energons_row_for_row(tmp_path: Path, flag: str) -> None:
    ours = media_dataset(tmp_path / "ours")
    theirs = twin(ours, "theirs")
    run_shardprep("prepare", str(ours), *FLAGS, flag, check=True)
    run_energon_prepare(str(theirs), *FLAGS, flag)
    rows = media_rows(ours)
    assert {row[1] for row in rows} == {"image"} and len(rows) > len(IMAGES) // 2
    assert_same_media_index(ours, theirs)


@pytest.mark.parametrize("flag", ["--media-metadata-by-extension", "--media-metadata-by-header"])
def test_audio_and_video_rows_equal_energons_row_for_row(tmp_path: Path, flag: str) -> None:
    pytest.importorskip("av", reason="energon describes audio/video only with PyAV installed")
    ours = av_dataset(tmp_path / "ours")
    theirs = twin(ours, "theirs")
    run_shardprep("prepare", str(ours), *FLAGS, flag, check=True)
    run_energon_prepare(str(theirs), *FLAGS, flag)
    rows = media_rows(ours)
    assert {row[1] for row in rows} == {"av"}
    assert any('"video_width"' in row[2] for row in rows) and any(row[0].endswith(".flac") for row in rows)
    assert_same_media_index(ours, theirs)


def test_a_glob_that_selects_nothing_records_its_patterns_as_energon_does(tmp_path: Path) -> None:
    ours = media_dataset(tmp_path / "ours", shards=1)
    theirs = twin(ours, "theirs")
    run_shardprep("prepare", str(ours), *FLAGS, "--media-metadata-by-glob", "*.tif,*.heic", check=True)
    run_energon_prepare(str(theirs), *FLAGS, "--media-metadata-by-glob", "*.tif,*.heic")
    assert media_rows(ours) == []
    assert_same_media_index(ours, theirs)


def test_a_glob_selects_by_name_then_reads_the_header(tmp_path: Path) -> None:
    # energon 7.4.1 stops with an AssertionError on any part a glob selects; shardprep describes it.
    ours = media_dataset(tmp_path / "ours", shards=1)
    run_shardprep("prepare", str(ours), *FLAGS, "--media-metadata-by-glob", "*.png,*.jpg", check=True)
    keys = [row[0] for row in media_rows(ours)]
    assert keys and all(key.endswith((".png", ".jpg")) for key in keys)
    assert not any(key.endswith(".JPG") for key in keys)


def test_a_broken_image_header_names_shard_part_and_offset_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "broken"
    cut = IMAGES["rgb33.png"][:20]
    write_tarfile(root / "a.tar", [("k1.txt", b"x"), ("k1.png", IMAGES["rgb1.png"]), ("k2.png", cut)])
    before = snapshot(root)
    result = run_shardprep("prepare", str(root), *FLAGS, "--media-metadata-by-extension")
    assert result.returncode == 1
    assert "a.tar at byte" in result.stderr and "'k2.png'" in result.stderr and "IHDR" in result.stderr
    offset = int(result.stderr.split("a.tar at byte ")[1].split(":")[0])
    data = (root / "a.tar").read_bytes()
    assert data[offset - 20 : offset] == cut
    assert snapshot(root) == before


def test_media_options_refuse_tar_index_only_and_two_filters(tmp_path: Path) -> None:
    root = media_dataset(tmp_path / "d", shards=1)
    both = run_shardprep(
        "prepare", str(root), *FLAGS, "--media-metadata-by-header", "--media-metadata-by-extension"
    )
    assert both.returncode == 1 and "exactly one" in both.stderr
    index_only = run_shardprep("prepare", str(root), "--tar-index-only", "--media-metadata-by-header")
    assert index_only.returncode == 1 and "--tar-index-only" in index_only.stderr
