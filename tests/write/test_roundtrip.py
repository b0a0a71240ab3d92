"""Every source kind: each input row comes back out of energon's loader with the exact bytes of each part."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from prep.write import open_sources, write_dataset
from prep.write.sources.csv import CsvSource
from prep.write.sources.folder import FolderSource
from prep.write.sources.jsonl import JsonlSource
from prep.write.sources.parallel_text import ParallelTextSource
from prep.write.sources.parquet import ParquetSource
from tests.support.prepare import run_shardprep
from tests.support.write import DecodedTaskEncoder, load_parts, written

ROWS = [
    {"id": i, "text": f"line {i} — ünïcode", "label": i % 3, "tags": ["a", "b"][: i % 3]} for i in range(23)
]


def test_jsonl_lines_come_back_byte_for_byte_as_json_parts(tmp_path: Path) -> None:
    lines = [json.dumps(row, ensure_ascii=i % 2 == 0) for i, row in enumerate(ROWS)]
    (tmp_path / "rows.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = run_shardprep("write", str(tmp_path / "rows.jsonl"), str(tmp_path / "out"), "--maxcount", "5")
    assert result.returncode == 0, result.stderr
    assert "Wrote 23 samples" in result.stdout
    loaded = load_parts(tmp_path / "out")
    assert list(loaded.values()) == [{"json": line.encode()} for line in lines]
    assert list(loaded) == sorted(loaded), "generated keys sort in input order"


def test_jsonl_fields_map_to_parts_by_extension(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    write_dataset(
        JsonlSource(tmp_path / "rows.jsonl"),
        tmp_path / "out",
        parts=["text=txt", "label=cls", "tags=meta.json", "tags=tags.mp"],
        key_column="id",
    )
    import msgpack

    loaded = load_parts(tmp_path / "out")
    assert loaded == {
        str(row["id"]): {
            "txt": row["text"].encode(),
            "cls": str(row["label"]).encode(),
            "meta.json": json.dumps(row["tags"]).encode(),
            "tags.mp": msgpack.packb(row["tags"]),
        }
        for row in ROWS
    }


def test_csv_rows_come_back_as_json_and_mapped_parts(tmp_path: Path) -> None:
    with open(tmp_path / "rows.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["key", "caption", "score"])
        for i in range(11):
            writer.writerow([f"r{i}", f'a caption, with "quotes" {i}', f"{i / 3:.3f}"])
    write_dataset(CsvSource(tmp_path / "rows.csv"), tmp_path / "json")
    write_dataset(
        CsvSource(tmp_path / "rows.csv"), tmp_path / "mapped", parts=["caption=txt"], key_column="key"
    )
    with open(tmp_path / "rows.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(load_parts(tmp_path / "json").values()) == [
        {"json": json.dumps(row, ensure_ascii=False).encode()} for row in rows
    ]
    assert load_parts(tmp_path / "mapped") == {row["key"]: {"txt": row["caption"].encode()} for row in rows}


def test_parquet_is_streamed_by_row_group_with_binary_and_array_parts(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import io

    import pyarrow.parquet as pq

    images = [bytes([i]) * (50 + i) for i in range(30)]
    table = pa.table(
        {
            "name": [f"p{i:02d}" for i in range(30)],
            "image": images,
            "vector": [[float(i), float(i) / 2] for i in range(30)],
        }
    )
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=7)
    write_dataset(
        ParquetSource(tmp_path / "rows.parquet"),
        tmp_path / "out",
        parts=["image=png", "vector=npy", "name=txt"],
        key_column="name",
    )
    loaded = load_parts(tmp_path / "out")
    assert len(loaded) == 30
    for i in range(30):
        parts = loaded[f"p{i:02d}"]
        assert parts["png"] == images[i]
        assert parts["txt"] == f"p{i:02d}".encode()
        expected = io.BytesIO()
        np.save(expected, np.asarray([float(i), float(i) / 2]))
        assert parts["npy"] == expected.getvalue()


def test_folder_files_grouped_by_stem_keep_their_bytes(tmp_path: Path) -> None:
    source = tmp_path / "images"
    expected = {}
    for i in range(9):
        folder = source / ("a" if i < 5 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        parts = {"jpg": bytes(range(i, i + 40)) * 30, "txt": f"caption {i}".encode()}
        if i % 2:
            parts["meta.json"] = json.dumps({"i": i}).encode()
        for part, data in parts.items():
            (folder / f"{i:04d}.{part}").write_bytes(data)
        expected[f"{folder.name}/{i:04d}"] = parts
    (source / ".hidden.txt").write_text("not a sample")
    write_dataset(FolderSource(source), tmp_path / "out", maxcount=4)
    assert load_parts(tmp_path / "out") == expected


def test_folder_samples_behind_a_link_are_written_and_a_link_back_up_ends_the_walk(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "batch2"
    elsewhere.mkdir(parents=True)
    (elsewhere / "0002.txt").write_text("behind a link")
    (elsewhere / "loop").symlink_to(elsewhere)  # a link back up: its files are read already
    source = tmp_path / "images"
    (source / "batch1").mkdir(parents=True)
    (source / "batch1" / "0001.txt").write_text("in place")
    (source / "batch2").symlink_to(elsewhere)
    write_dataset(FolderSource(source), tmp_path / "out")
    assert load_parts(tmp_path / "out") == {
        "batch1/0001": {"txt": b"in place"},
        "batch2/0002": {"txt": b"behind a link"},
    }


def test_encoded_files_in_a_folder_are_written_as_they_are_and_energon_decodes_them(tmp_path: Path) -> None:
    """A folder's files are already encoded: an .npy, .msgpack or .cls file goes into the shard byte for
    byte (as webdataset's writer does with bytes), so energon's decoder gives back the array and the
    object, not a wrapped copy of the file."""
    import io

    import msgpack
    import numpy as np

    source = tmp_path / "arrays"
    source.mkdir()
    files = {}
    for i in range(3):
        array = io.BytesIO()
        np.save(array, np.arange(i, i + 5, dtype=np.int32).reshape(1, 5))
        files[f"{i:04d}"] = {
            "npy": array.getvalue(),
            "msgpack": msgpack.packb({"i": i}),
            "cls": b"%d" % (i * 7),
        }
        for part, data in files[f"{i:04d}"].items():
            (source / f"{i:04d}.{part}").write_bytes(data)
    write_dataset(FolderSource(source), tmp_path / "out")
    assert load_parts(tmp_path / "out") == files
    decoded = load_parts(tmp_path / "out", task_encoder=DecodedTaskEncoder())
    for i in range(3):
        sample = decoded[f"{i:04d}"]
        assert np.array_equal(sample["npy"], np.arange(i, i + 5, dtype=np.int32).reshape(1, 5))
        assert msgpack.unpackb(sample["msgpack"]) == {"i": i} and sample["cls"] == i * 7


def test_parallel_text_with_alignments_becomes_src_tgt_align_parts(tmp_path: Path) -> None:
    sources = ["ein kleiner Test", "zwei", "drei Wörter hier"]
    targets = ["a small test", "two", "three words here"]
    alignments = ["0-0 1-1 2-2", "0-0", "0-0 1-1 2-2"]
    for name, lines in (("src.de", sources), ("tgt.en", targets), ("align.txt", alignments)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    source = ParallelTextSource(tmp_path / "src.de", tmp_path / "tgt.en", tmp_path / "align.txt")
    write_dataset(source, tmp_path / "out")
    loaded = list(load_parts(tmp_path / "out").values())
    assert loaded == [
        {"src.txt": s.encode(), "tgt.txt": t.encode(), "align.txt": a.encode()}
        for s, t, a in zip(sources, targets, alignments, strict=True)
    ]


def test_any_iterable_of_dicts_is_a_source(tmp_path: Path) -> None:
    samples = ({"__key__": f"s{i}", "txt": f"t{i}", "cls": i, "json": {"i": i}} for i in range(12))
    write_dataset(samples, tmp_path / "out", maxcount=5)
    assert load_parts(tmp_path / "out") == {
        f"s{i}": {"txt": f"t{i}".encode(), "cls": str(i).encode(), "json": json.dumps({"i": i}).encode()}
        for i in range(12)
    }


def test_field_map_dataset_yaml_loads_a_typed_sample(tmp_path: Path) -> None:
    from megatron.energon import WorkerConfig, get_loader, get_val_dataset

    write_dataset(
        [{"__key__": f"k{i}", "txt": f"text {i}"} for i in range(4)],
        tmp_path / "out",
        sample_type="TextSample",
        field_map='{"text": "txt"}',
    )
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(
        tmp_path / "out", split_part="train", worker_config=worker_config, batch_size=None
    )
    assert [(s.__key__, s.text) for s in get_loader(dataset)] == [(f"k{i}", f"text {i}") for i in range(4)]


@pytest.mark.parametrize(
    "how",
    [
        {"maxsize": 4096},
        {"maxsize": 4096, "resume": True},
        {"maxsize": 8000, "group_by": "g", "group_contiguous": True},
    ],
)
def test_maxsize_holds_when_long_keys_need_pax_headers(tmp_path: Path, how: dict) -> None:
    """A key over 100 bytes takes a PAX header block and its record (2,048 bytes a sample here, where a
    plain header would take 1,024): --maxsize counts them, in one pass, in blocks and for groups."""
    rows = tmp_path / "long.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"id": f"{'k' * 150}{n:03d}", "t": "x" * 300, "g": n // 2}) + "\n" for n in range(12)
        )
    )
    options = {"key_column": "id", "parts": ["t=txt"], **how}
    summary = write_dataset(open_sources([rows]), tmp_path / "out", **options)
    sizes = [path.stat().st_size for path in (tmp_path / "out").glob("*.tar")]
    assert summary.samples == 12 and len(sizes) == summary.shards > 1
    assert max(sizes) <= how["maxsize"], sizes
    if "resume" in how:
        write_dataset(open_sources([rows]), tmp_path / "one", key_column="id", parts=["t=txt"], maxsize=4096)
        assert written(tmp_path / "out") == written(tmp_path / "one")
