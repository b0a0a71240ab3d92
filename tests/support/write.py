"""Shared by the write tests: load a written dataset through energon's own loader, parts as raw bytes."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import yaml
from megatron.energon import (
    Cooker,
    DefaultTaskEncoder,
    Sample,
    WorkerConfig,
    edataclass,
    get_loader,
    get_val_dataset,
    stateless,
)
from megatron.energon.task_encoder.cooking import basic_sample_keys


@edataclass
class RawSample(Sample):
    parts: dict


@stateless
def cook_raw(sample: dict) -> RawSample:
    return RawSample(
        **basic_sample_keys(sample), parts={k: v for k, v in sample.items() if not k.startswith("__")}
    )


class RawTaskEncoder(DefaultTaskEncoder):
    """Crude samples as {part: bytes}, undecoded."""

    cookers = [Cooker(cook_raw)]
    decoder = None


class DecodedTaskEncoder(DefaultTaskEncoder):
    """Crude samples as {part: value}, decoded by energon's default decoder (by extension)."""

    cookers = [Cooker(cook_raw)]


def load_parts(path: Path, split: str = "train", task_encoder: object = None) -> dict[str, dict[str, bytes]]:
    """key -> {part: bytes} for every sample of a split, read by energon's loader."""
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(
        path,
        split_part=split,
        worker_config=worker_config,
        batch_size=None,
        task_encoder=task_encoder or RawTaskEncoder(),
    )
    loaded = {}
    for sample in get_loader(dataset):
        assert sample.__key__ not in loaded
        loaded[sample.__key__] = sample.parts
    return loaded


def split_shards(root: Path) -> dict[str, list[str]]:
    """split -> shard names, from split.yaml (brace ranges expanded)."""
    import braceexpand

    document = yaml.safe_load((root / ".nv-meta" / "split.yaml").read_text())
    return {
        name: [shard for pattern in patterns for shard in braceexpand.braceexpand(pattern)]
        for name, patterns in document["split_parts"].items()
    }


def tar_samples(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    """(key, {part: bytes}) in shard order, read with Python's tarfile: the ground truth of a shard."""
    samples: list[tuple[str, dict[str, bytes]]] = []
    with tarfile.open(path) as tar:
        for member in tar:
            key, _, part = member.name.partition(".")
            data = tar.extractfile(member).read()
            if samples and samples[-1][0] == key:
                samples[-1][1][part] = data
            else:
                samples.append((key, {part: data}))
    return samples


def rows_file(path: Path, count: int, text: str = "word") -> Path:
    """`count` JSONL rows `{"n": ..., "text": ...}` of varied lengths at `path`."""
    with open(path, "w") as file:
        for number in range(count):
            file.write(json.dumps({"n": number, "text": f"{text} " * (number % 11)}) + "\n")
    return path


def written(out: Path) -> dict[str, bytes]:
    """Every file of the dataset but the random index.uuid, by path."""
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in sorted(out.rglob("*"))
        if path.is_file() and path.name != "index.uuid"
    }
