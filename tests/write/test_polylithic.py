"""Polylithic writes: media go to an auxiliary dataset, energon loads the metadataset and the cooker joins them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cookers.energon_aux_media import AuxMediaTaskEncoder
from prep.write import write_dataset
from prep.write.sources.jsonl import JsonlSource
from tests.support.prepare import run_shardprep
from tests.support.write import load_parts


def image_caption_folder(root: Path, count: int) -> dict[str, bytes]:
    images = {}
    for i in range(count):
        images[f"{i:04d}"] = bytes([i % 251]) * (200 + 13 * i)
        (root / f"{i:04d}.jpg").parent.mkdir(parents=True, exist_ok=True)
        (root / f"{i:04d}.jpg").write_bytes(images[f"{i:04d}"])
        (root / f"{i:04d}.txt").write_text(f"caption {i}")
    return images


def load_joined(metadataset: Path, split: str = "train") -> dict:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(
        metadataset,
        split_part=split,
        worker_config=worker_config,
        batch_size=None,
        task_encoder=AuxMediaTaskEncoder(decoder=None),
    )
    return {sample.__key__: sample for sample in get_loader(dataset)}


@pytest.mark.parametrize("aux_format", ["folder", "tar"])
def test_cooker_returns_each_samples_own_media(tmp_path: Path, aux_format: str) -> None:
    images = image_caption_folder(tmp_path / "images", 17)
    result = run_shardprep(
        "write",
        str(tmp_path / "images"),
        str(tmp_path / "out"),
        "--media-column",
        "jpg",
        "--aux-format",
        aux_format,
        "--maxcount",
        "5",
    )
    assert result.returncode == 0, result.stderr
    assert "auxiliary dataset" in result.stdout
    joined = load_joined(tmp_path / "out" / "metadataset.yaml")
    assert sorted(joined) == sorted(images)
    for key, sample in joined.items():
        assert sample.media == {"jpg": images[key]}
        assert sample.parts == {"txt": f"caption {int(key)}".encode()}


def test_primary_keeps_only_the_media_file_names(tmp_path: Path) -> None:
    images = image_caption_folder(tmp_path / "images", 6)
    write_dataset_args = dict(media_columns=["jpg"], aux_format="tar")
    from prep.write.sources.folder import FolderSource

    write_dataset(FolderSource(tmp_path / "images"), tmp_path / "out", **write_dataset_args)
    primary = load_parts(tmp_path / "out" / "primary")
    assert {key: json.loads(parts["aux.json"]) for key, parts in primary.items()} == {
        key: {"jpg": f"{key}.jpg"} for key in images
    }
    assert all(set(parts) == {"txt", "aux.json"} for parts in primary.values())
    document = yaml.safe_load((tmp_path / "out" / "metadataset.yaml").read_text())
    assert document["__class__"] == "MetadatasetV2"
    assert document["splits"]["train"] == {"path": "primary", "aux": {"media": "media"}}


def test_jsonl_media_paths_with_splits_load_per_split(tmp_path: Path) -> None:
    rows = []
    for i in range(30):
        path = tmp_path / "src" / "img" / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"png" + bytes([i]) * i)
        rows.append({"image": f"img/{i}.png", "caption": f"c{i}"})
    (tmp_path / "src" / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    summary = write_dataset(
        JsonlSource(tmp_path / "src" / "rows.jsonl"),
        tmp_path / "out",
        media_columns=["image"],
        split_ratio="2,1,0",
    )
    seen = 0
    for split in ("train", "val"):
        for sample in load_joined(tmp_path / "out" / "metadataset.yaml", split).values():
            caption = json.loads(sample.parts["json"])["caption"]
            i = int(caption[1:])
            assert sample.media == {"image": b"png" + bytes([i]) * i}
            assert "image" not in json.loads(sample.parts["json"])
            seen += 1
    assert seen == 30 == summary.samples
