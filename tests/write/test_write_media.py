"""`write --media-metadata-by-*` stores in one pass the media tables `energon prepare-media` 7.4.1 adds to
the same dataset written without them: the primary shards, an auxiliary tar dataset, an auxiliary folder."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from prep.write.polylithic import AUX_FOLDER
from prep.write.run import write_dataset
from tests.support.media import images, without_created_at
from tests.support.prepare import run_energon, run_shardprep, sqlite_contents

pytest.importorskip("PIL")

IMAGES = images()


def run_energon_prepare_media(path: Path) -> subprocess.CompletedProcess:
    return run_energon(
        "prepare-media", "--no-progress", "--num-workers", "2", "--media-metadata-by-extension", str(path),
        timeout=120,
    )  # fmt: skip


def media_tables(root: Path) -> dict:
    """The media tables of `root`'s index, without energon's clock column."""
    copy = root.parent / f"{root.name}-compared"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root / ".nv-meta", copy / ".nv-meta")
    without_created_at(copy)
    tables = sqlite_contents(copy / ".nv-meta" / "index.sqlite")
    shutil.rmtree(copy)
    return {name: rows for name, rows in tables.items() if name.startswith("media")}


def image_folder(folder: Path) -> Path:
    """One sample per test image (the image and a caption), as files named by the sample key."""
    folder.mkdir()
    for number, (name, data) in enumerate(sorted(IMAGES.items())):
        (folder / f"{number:04d}.{name.rsplit('.', 1)[1].lower()}").write_bytes(data)
        (folder / f"{number:04d}.txt").write_text(f"picture {name}")
    return folder


def write_records(records: list[dict], out: Path, **options: object) -> None:
    write_dataset(records, out, maxcount=5, **options)


def image_records() -> list[dict]:
    return [
        {"__key__": f"{number:04d}", "txt": f"picture {name}", name.rsplit(".", 1)[1].lower(): data}
        for number, (name, data) in enumerate(sorted(IMAGES.items()))
    ]


def test_primary_shards_get_energons_media_tables(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    write_records(image_records(), ours, media_metadata_by_extension=True)
    write_records(image_records(), theirs)
    assert run_energon_prepare_media(theirs).returncode == 0
    tables = media_tables(ours)
    assert tables["media_metadata"]["rows"], "no media rows written"
    assert tables == media_tables(theirs)
    # the rest of the index is what a write without the flag gives
    for name in ("index.uuid", "index.sqlite"):
        (ours / ".nv-meta" / name).unlink(), (theirs / ".nv-meta" / name).unlink()
    assert sorted(p.name for p in (ours / ".nv-meta").iterdir()) == sorted(
        p.name for p in (theirs / ".nv-meta").iterdir()
    )


@pytest.mark.parametrize("aux_format", ["tar", "folder"])
def test_the_auxiliary_dataset_gets_energons_media_tables(tmp_path: Path, aux_format: str) -> None:
    records = [
        {"__key__": f"{number:04d}", "txt": f"picture {name}", "image": data}
        for number, (name, data) in enumerate(sorted(IMAGES.items()))
        if name.lower().endswith((".jpg", ".png", ".gif", ".webp"))
    ]
    media = ["image=" + "jpg"]  # one extension for all: energon judges by name, then reads the header
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    options = {"media_columns": media, "aux_format": aux_format}
    write_records(records, ours, media_metadata_by_extension=True, **options)
    write_records(records, theirs, **options)
    assert run_energon_prepare_media(theirs / AUX_FOLDER).returncode == 0
    ours_tables = media_tables(ours / AUX_FOLDER)
    assert len(ours_tables["media_metadata"]["rows"]) > len(records) // 2
    assert ours_tables == media_tables(theirs / AUX_FOLDER)
    if aux_format == "folder":  # the folder's index holds only the media tables, as prepare-media makes it
        assert sorted(p.name for p in (ours / AUX_FOLDER / ".nv-meta").iterdir()) == ["index.sqlite"]


def test_the_cli_reports_media_rows_and_a_broken_image_leaves_nothing(tmp_path: Path) -> None:
    source = image_folder(tmp_path / "pictures")
    out = tmp_path / "out"
    result = run_shardprep("write", str(source), str(out), "--media-metadata-by-extension")
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(out / ".nv-meta" / "index.sqlite") as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM media_metadata").fetchone()
    assert rows > 0
    assert f"Media metadata of {rows:,} parts stored in index.sqlite." in result.stdout

    jpeg = next(data for name, data in sorted(IMAGES.items()) if name.endswith(".jpg"))
    (source / "bad.jpg").write_bytes(jpeg[:4] + b"\xff\xc0\x00")
    (source / "bad.txt").write_text("cut")
    out = tmp_path / "broken-out"
    result = run_shardprep("write", str(source), str(out), "--media-metadata-by-extension")
    assert result.returncode != 0
    assert "bad.jpg" in result.stderr and "byte" in result.stderr, result.stderr
    assert not out.exists()


def test_two_media_filters_are_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="media"):
        write_records(
            image_records(), tmp_path / "out", media_metadata_by_extension=True, media_metadata_by_header=True
        )
