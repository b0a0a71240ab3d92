"""energon's own loader reads datasets that shardprep prepared and yields exactly the samples of the tars."""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.prepare import run_shardprep
from tests.support.shards import write_gnu_tar, write_tarfile, write_webdataset

energon = pytest.importorskip("megatron.energon")


def tar_texts(root: Path, shards: list[str]) -> list[tuple[str, str]]:
    """(key, txt) for every sample, read with Python's tarfile in shard order: the ground truth."""
    samples = []
    for shard in shards:
        with tarfile.open(root / shard) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(".txt"):
                    samples.append((member.name[: -len(".txt")], tar.extractfile(member).read().decode()))
    return samples


def make_text_dataset(root: Path) -> list[str]:
    write_tarfile(root / "a" / "000.tar", [(f"a{i:03d}.txt", f"alpha {i}".encode()) for i in range(7)])
    write_webdataset(root / "a" / "001.tar", [{"__key__": f"w{i:03d}", "txt": f"web {i}"} for i in range(5)])
    write_gnu_tar(root / "b.tar", [(f"g/{i:03d}.txt", f"gnu {i}".encode()) for i in range(6)], "pax")
    return ["a/000.tar", "a/001.tar", "b.tar"]


def load_all(root: Path, **kwargs: object) -> list:
    """Every sample of the 'train' split, once, in order (energon's validation-style iteration)."""
    worker_config = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = energon.get_val_dataset(
        root, split_part="train", worker_config=worker_config, batch_size=None, **kwargs
    )
    return list(energon.get_loader(dataset))


def prepare(root: Path, *flags: str) -> None:
    result = run_shardprep(
        "prepare", str(root), "--non-interactive", "--no-progress", "--split-ratio", "1,0,0", *flags
    )
    assert result.returncode == 0, result.stderr


def test_field_map_dataset_loads_every_sample(tmp_path: Path) -> None:
    shards = make_text_dataset(tmp_path)
    prepare(tmp_path, "--sample-type", "TextSample", "--field-map", '{"text": "txt"}')
    loaded = [(sample.__key__, sample.text) for sample in load_all(tmp_path)]
    assert loaded == tar_texts(tmp_path, shards)


def test_shards_named_with_braces_and_backslashes_load_under_their_own_names(tmp_path: Path) -> None:
    """energon reads split.yaml through braceexpand: a shard named `y{1..2}.tar` must come back as itself
    (energon's own prepare expands such names and fails), not as y1.tar and y2.tar."""
    names = ["x{a}.tar", "y{1..2}.tar", "y{1..2}-0.tar", "y{1..2}-1.tar", "z}.tar", "back\\slash.tar"]
    for number, name in enumerate(names):
        write_tarfile(tmp_path / name, [(f"s{number}-{i}.txt", f"{name} {i}".encode()) for i in range(3)])
    prepare(tmp_path, "--sample-type", "TextSample", "--field-map", '{"text": "txt"}')
    shards = sorted(names)  # energon's order for names of one folder
    loaded = [(sample.__key__, sample.text) for sample in load_all(tmp_path)]
    assert loaded == tar_texts(tmp_path, shards)


def test_training_loader_reads_our_tar_idx(tmp_path: Path) -> None:
    """get_train_dataset reads the `.tar.idx` files (not sqlite): one epoch holds every sample exactly once."""
    shards = make_text_dataset(tmp_path)
    prepare(tmp_path, "--sample-type", "TextSample", "--field-map", '{"text": "txt"}')
    worker_config = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = energon.get_train_dataset(
        tmp_path,
        split_part="train",
        worker_config=worker_config,
        batch_size=None,
        shuffle_buffer_size=None,
        max_samples_per_sequence=None,
    )
    expected = tar_texts(tmp_path, shards)
    loader = iter(energon.get_loader(dataset))
    epoch = [next(loader) for _ in range(len(expected))]
    assert sorted((s.__key__, s.text) for s in epoch) == sorted(expected)


@dataclass
class Caption(energon.Sample):
    caption: str
    length: int


@energon.stateless
def cook_caption(raw: dict) -> Caption:
    text = raw["txt"]  # energon decodes txt parts to str
    return Caption(**energon.basic_sample_keys(raw), caption=text, length=len(text))


class CaptionEncoder(energon.DefaultTaskEncoder):
    cookers = [energon.Cooker(cook_caption)]


def test_crude_dataset_cooks_every_sample(tmp_path: Path) -> None:
    shards = make_text_dataset(tmp_path)
    prepare(tmp_path, "--crude")
    assert "CrudeWebdataset" in (tmp_path / ".nv-meta" / "dataset.yaml").read_text()
    loaded = [(s.__key__, s.caption) for s in load_all(tmp_path, task_encoder=CaptionEncoder())]
    assert loaded == tar_texts(tmp_path, shards)


def test_sample_loader_template_is_valid_python_energon_loads(tmp_path: Path) -> None:
    shards = make_text_dataset(tmp_path)
    prepare(tmp_path, "--sample-type", "TextSample")
    loader_file = tmp_path / ".nv-meta" / "sample_loader.py"
    template = loader_file.read_text()
    module: dict = {}
    exec(compile(template, str(loader_file), "exec"), module)  # as written, it imports cleanly
    assert module["part_filter"]("txt") and not module["part_filter"]("jpg")
    with pytest.raises(KeyError, match="TODO"):  # and tells the user what is left to fill in
        module["sample_loader"]({"txt": "x"})
    loader_file.write_text(template.replace('raw["TODO"]', 'raw["txt"]'))
    loaded = [(s.__key__, s.text) for s in load_all(tmp_path)]
    assert loaded == tar_texts(tmp_path, shards)


def test_dataset_with_an_empty_shard_loads(tmp_path: Path) -> None:
    """An empty tar is indexed with a count of 0 (energon prepare stops on it); energon's loader copes."""
    shards = make_text_dataset(tmp_path)
    write_tarfile(tmp_path / "a" / "002-empty.tar", [])
    prepare(tmp_path, "--sample-type", "TextSample", "--field-map", '{"text": "txt"}')
    loaded = [(sample.__key__, sample.text) for sample in load_all(tmp_path)]
    assert loaded == tar_texts(tmp_path, shards)
