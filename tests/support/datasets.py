"""Small prepared datasets for the mount/info/verify/preview tests, built once per test run.

Shards are written with webdataset's TarWriter and with Python's tarfile (long names, a key with a
folder, a name that tries to climb out with `..`), then prepared by `energon prepare` and by
`shardprep prepare`. Expected bytes always come from Python's tarfile, never from our own reader.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

from prep.index.group import key_and_part
from prep.mount.tree import escape_name
from tests.support.prepare import run_energon_prepare, run_shardprep

PREPARERS = ("energon", "shardprep")
BIG_PART_BYTES = 3 * 1024 * 1024 + 12345
LONG_KEY = "long_" + "x" * 120  # past ustar's 100-character name field: PAX/GNU long-name headers

_cache: dict[tuple[str, str], Path] = {}


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (6 + seed % 5, 9, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _npy(seed: int) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(seed + 3, dtype=np.float32).reshape(-1, 1))
    return buffer.getvalue()


def write_shards(folder: Path) -> None:
    """Five shards: four from TarWriter (json, txt, png, npy parts; one big part), one from tarfile."""
    folder.mkdir(parents=True)
    for shard in range(4):
        with wds.TarWriter(str(folder / f"shard-{shard:03d}.tar")) as writer:
            for index in range(6):
                seed = shard * 10 + index
                sample = {
                    "__key__": f"s{shard}_{index:03d}",
                    "json": json.dumps({"shard": shard, "index": index, "text": "ü" * index}).encode(),
                    "txt": f"sample {seed}\n".encode(),
                    "png": _png(seed),
                    "npy": _npy(seed),
                }
                if shard == 1 and index == 2:
                    sample["bin"] = np.random.default_rng(7).bytes(BIG_PART_BYTES)
                writer.write(sample)
    members = [
        (f"{LONG_KEY}.txt", b"a long name\n"),
        (f"{LONG_KEY}.json", b'{"long": true}'),
        ("folder.d/inner.seg.0.json", b'{"seg": 0}'),
        ("folder.d/inner.txt", b"inside a folder\n"),
        ("../escape.txt", b"must stay inside the mount\n"),
        ("plain.txt", b"plain\n"),
    ]
    with tarfile.open(folder / "shard-004.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def prepare(folder: Path, preparer: str, *, field_map: bool = False) -> None:
    """Run a real prepare over `folder` (split 8,1,1, crude unless `field_map`)."""
    flags = ["--non-interactive", "--split-ratio", "8,1,1"]
    if field_map:
        flags += ["--sample-type", "CaptioningSample", "--field-map", '{"image": "png", "caption": "txt"}']
    else:
        flags += ["--sample-type", "CrudeWebdataset"]
    if preparer == "energon":
        run_energon_prepare(str(folder), *flags)
    else:
        run_shardprep("prepare", str(folder), *flags, check=True)


def prepared_dataset(base: Path, preparer: str, *, field_map: bool = False) -> Path:
    """A prepared copy of the test shards, built once per run and preparer; callers must not modify it."""
    variant = f"{preparer}-{'fieldmap' if field_map else 'crude'}"
    cache_key = (str(base), variant)
    if cache_key not in _cache:
        folder = base / variant
        write_shards(folder)
        prepare(folder, preparer, field_map=field_map)
        _cache[cache_key] = folder
    return _cache[cache_key]


def writable_copy(dataset: Path, destination: Path) -> Path:
    """A copy of a prepared dataset that a test may damage."""
    shutil.copytree(dataset, destination)
    return destination


def tar_members(dataset: Path) -> dict[str, dict[str, bytes]]:
    """Shard name -> {member name: bytes} for every regular member, read with Python's tarfile."""
    members: dict[str, dict[str, bytes]] = {}
    info = json.loads((dataset / ".nv-meta" / ".info.json").read_text())
    for shard in info["shard_counts"]:
        with tarfile.open(dataset / shard) as tar:
            members[shard] = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    return members


def expected_files(dataset: Path, view: str, split_shards: set[str] | None = None) -> dict[str, bytes]:
    """Relative mount path -> bytes, from Python's tarfile and energon's key rule."""
    files = {}
    for shard, members in tar_members(dataset).items():
        if split_shards is not None and shard not in split_shards:
            continue
        for name, data in members.items():
            key, part = key_and_part(name)
            if view == "flat":
                path = escape_name(f"{key}.{part}")
            elif view == "sample":
                path = f"{escape_name(key)}/{escape_name(part)}"
            else:
                path = f"{shard}/{escape_name(key)}/{escape_name(part)}"
            files[path] = data
    return files
