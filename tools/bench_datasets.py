"""Benchmark datasets, generated once and cached under ``.cache/bench/`` (git-ignored).

Three kinds, each a folder of WebDataset shards:

- ``text``: JSON samples of about 300 bytes of varied, seeded content, written by webdataset's ShardWriter.
- ``image``: samples of a ~36 KB JPEG + a txt caption + a json record, written by webdataset's ShardWriter.
  The JPEG bytes are real JPEGs: a handful of random-noise images encoded by Pillow at a size chosen to land
  near the target, reused round-robin (prepare reads only tar headers, so repeating content costs nothing).
- ``scale``: many tiny samples (one ``.txt`` part of a few bytes each, 1 KiB of tar per sample) written by
  a plain ustar writer of our own (``struct``-built headers, no PAX), shards in parallel, because ShardWriter
  would take a very long time at ten million samples. A smaller ``scale`` dataset for memory comparisons
  is made of hard links to the first shards of the big one.

Each dataset's folder is named for its sizes (``text-200000x10-seed0``), so sizes live side by side, and a
lock file lets concurrent benchmarks share one. A dataset counts as made only once its marker file
``.complete.json`` exists and records the same parameters; a half-made one is removed and made again (it is
built in ``NAME.partial`` and renamed when complete). Prepare runs leave ``.nv-meta`` and
``*.tar.idx`` files next to the shards; they are not part of the dataset and do not invalidate it.

    python -m tools.bench_datasets text image
    python -m tools.bench_datasets scale --scale-samples 1000000 --scale-shards 10
"""

from __future__ import annotations

import argparse
import fcntl
import io
import json
import os
import random
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOT = REPO / ".cache" / "bench"
MARKER = ".complete.json"
SHARD_PATTERN = "shard-%06d.tar"
BLOCK = 512


@dataclass(frozen=True)
class Dataset:
    """A generated dataset: where it is and what is in it."""

    name: str
    path: Path
    samples: int
    shards: int
    parts_per_sample: int

    def shard_paths(self) -> list[Path]:
        """The shard files, sorted by name (energon's and shardprep's order)."""
        return sorted(self.path.glob("*.tar"))

    def total_bytes(self) -> int:
        """Bytes of tar on disk."""
        return sum(path.stat().st_size for path in self.shard_paths())


def _cached(
    name: str, root: Path, params: dict, build: Callable[[Path], int], parts_per_sample: int
) -> Dataset:
    """Return the dataset at ``root/name`` if its marker matches ``params``; otherwise build it afresh.

    Names carry the sizes, so datasets of different sizes live side by side in one cache folder.

    ``build(folder)`` writes the shards into an empty folder and returns the number of samples written.
    """
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        # Benchmarks may run side by side; one makes a dataset while the others wait for it.
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _cached_locked(name, root, params, build, parts_per_sample)


def _cached_locked(
    name: str, root: Path, params: dict, build: Callable[[Path], int], parts_per_sample: int
) -> Dataset:
    path = root / name
    marker = path / MARKER
    if marker.exists():
        recorded = json.loads(marker.read_text())
        if recorded.get("params") == params:
            return Dataset(name, path, recorded["samples"], recorded["shards"], parts_per_sample)
    partial = root / f"{name}.partial"
    for stale in (partial, path):
        if stale.exists():
            shutil.rmtree(stale)
    partial.mkdir(parents=True)
    started = time.perf_counter()
    print(f"generating {name} dataset in {path} ...", file=sys.stderr, flush=True)
    samples = build(partial)
    shards = len(list(partial.glob("*.tar")))
    (partial / MARKER).write_text(
        json.dumps({"params": params, "samples": samples, "shards": shards}, indent=1)
    )
    partial.rename(path)
    print(f"  {samples} samples in {shards} shards, {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return Dataset(name, path, samples, shards, parts_per_sample)


def _vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    """Pronounceable pseudo-words, so the text varies like text without shipping a corpus."""
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    words = []
    for _ in range(size):
        syllables = rng.randint(1, 4)
        words.append("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(syllables)))
    return words


def text_record(index: int, rng: random.Random, words: list[str]) -> dict:
    """One ~300-byte JSON record of seeded, varied content."""
    return {
        "id": index,
        "title": " ".join(rng.choices(words, k=rng.randint(2, 6))).capitalize(),
        "text": " ".join(rng.choices(words, k=rng.randint(22, 42))) + ".",
        "lang": rng.choice(["en", "de", "fr", "es", "it", "nl", "sv", "pl"]),
        "score": round(rng.random(), 4),
        "tags": rng.sample(words[:50], k=rng.randint(0, 3)),
    }


def ensure_text_dataset(
    root: Path = DEFAULT_ROOT, samples: int = 200_000, shards: int = 10, seed: int = 0
) -> Dataset:
    """The text dataset: ``samples`` JSON samples in ``shards`` shards, via webdataset's ShardWriter."""

    def build(folder: Path) -> int:
        import webdataset as wds

        rng = random.Random(seed)
        words = _vocabulary(rng)
        per_shard = -(-samples // shards)
        with wds.ShardWriter(str(folder / SHARD_PATTERN), maxcount=per_shard, verbose=0) as writer:
            for index in range(samples):
                writer.write({"__key__": f"{index:09d}", "json": text_record(index, rng, words)})
        return samples

    params = {"kind": "text", "samples": samples, "shards": shards, "seed": seed}
    return _cached(f"text-{samples}x{shards}-seed{seed}", root, params, build, parts_per_sample=1)


def noise_jpegs(target_bytes: int, count: int, seed: int) -> list[bytes]:
    """``count`` distinct random-noise JPEGs, each close to ``target_bytes``, encoded by Pillow."""
    from PIL import Image

    rng = random.Random(seed)

    def encode(side: int) -> bytes:
        image = Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3))
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=85)
        return out.getvalue()

    # Noise compresses about equally at every size, so bytes grow with the pixel count: pick the side once.
    side = 128
    probe = len(encode(side))
    side = max(8, round(side * (target_bytes / probe) ** 0.5))
    return [encode(side) for _ in range(count)]


def ensure_image_dataset(
    root: Path = DEFAULT_ROOT,
    samples: int = 100_000,
    shards: int = 20,
    jpeg_bytes: int = 36_000,
    seed: int = 0,
) -> Dataset:
    """The image dataset: jpg + txt + json samples in ``shards`` shards, via webdataset's ShardWriter."""

    def build(folder: Path) -> int:
        import webdataset as wds

        rng = random.Random(seed)
        words = _vocabulary(rng)
        jpegs = noise_jpegs(jpeg_bytes, 8, seed)
        per_shard = -(-samples // shards)
        with wds.ShardWriter(
            str(folder / SHARD_PATTERN), maxcount=per_shard, maxsize=1e12, verbose=0
        ) as writer:
            for index in range(samples):
                jpeg = jpegs[index % len(jpegs)]
                writer.write(
                    {
                        "__key__": f"{index:09d}",
                        "jpg": jpeg,
                        "txt": " ".join(rng.choices(words, k=rng.randint(5, 15))),
                        "json": {"id": index, "bytes": len(jpeg), "aesthetic": round(rng.random(), 3)},
                    }
                )
        return samples

    params = {"kind": "image", "samples": samples, "shards": shards, "jpeg_bytes": jpeg_bytes, "seed": seed}
    name = f"image-{samples}x{shards}-{jpeg_bytes}b-seed{seed}"
    return _cached(name, root, params, build, parts_per_sample=3)


# ustar header: the format as data. Fields in order, with the checksum computed over the whole block.
USTAR = struct.Struct("100s8s8s8s12s12s8sc100s6s2s32s32s8s8s155s12s")


def ustar_header(name: bytes, size: int, mtime: int = 1_700_000_000) -> bytes:
    """A plain ustar header block for a regular file (name under 100 bytes, size under 8 GiB)."""
    fields = [
        name,
        b"0000644\0",
        b"0001750\0",
        b"0001750\0",
        b"%011o\0" % size,
        b"%011o\0" % mtime,
        b" " * 8,
        b"0",
        b"",
        b"ustar\0",
        b"00",
        b"bench",
        b"bench",
        b"",
        b"",
        b"",
        b"",
    ]
    block = bytearray(USTAR.pack(*fields))
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def tiny_shard_members(first_index: int, count: int) -> Iterator[bytes]:
    """The tar blocks of ``count`` one-part samples with keys from ``first_index`` on, then the end marker."""
    for index in range(first_index, first_index + count):
        content = b"%d\n" % index
        yield ustar_header(b"%09d.txt" % index, len(content))
        yield content.ljust(BLOCK, b"\0")
    yield b"\0" * (2 * BLOCK)


def write_tiny_shard(path: Path, first_index: int, count: int) -> None:
    """Write one shard of tiny samples with our own ustar writer."""
    with open(path, "wb", buffering=1 << 20) as shard:
        batch: list[bytes] = []
        for block in tiny_shard_members(first_index, count):
            batch.append(block)
            if len(batch) >= 4096:
                shard.write(b"".join(batch))
                batch.clear()
        shard.write(b"".join(batch))


def _shard_sizes(samples: int, shards: int) -> list[int]:
    base, extra = divmod(samples, shards)
    return [base + (1 if shard < extra else 0) for shard in range(shards)]


def ensure_scale_dataset(
    root: Path = DEFAULT_ROOT, samples: int = 10_000_000, shards: int = 100, workers: int | None = None
) -> Dataset:
    """The scale dataset: ``samples`` tiny samples in ``shards`` shards, written in parallel."""

    def build(folder: Path) -> int:
        sizes = _shard_sizes(samples, shards)
        starts = [sum(sizes[:shard]) for shard in range(shards)]
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count()) as pool:
            jobs = [
                pool.submit(write_tiny_shard, folder / (SHARD_PATTERN % shard), starts[shard], sizes[shard])
                for shard in range(shards)
            ]
            for job in jobs:
                job.result()
        return samples

    params = {"kind": "scale", "samples": samples, "shards": shards}
    return _cached(f"scale-{samples}x{shards}", root, params, build, parts_per_sample=1)


def ensure_scale_subset(big: Dataset, shards: int, root: Path = DEFAULT_ROOT) -> Dataset:
    """A smaller scale dataset made of hard links to the first ``shards`` shards of ``big`` (copies if needed)."""
    chosen = big.shard_paths()[:shards]
    sizes = json.loads((big.path / MARKER).read_text())["params"]
    per_shard = _shard_sizes(sizes["samples"], sizes["shards"])[:shards]

    def build(folder: Path) -> int:
        for shard in chosen:
            try:
                os.link(shard, folder / shard.name)
            except OSError:
                shutil.copyfile(shard, folder / shard.name)
        return sum(per_shard)

    params = {"kind": "scale-subset", "of": big.name, "shards": shards}
    return _cached(f"{big.name}-first{shards}", root, params, build, parts_per_sample=1)


def prepare_crude(folder: Path) -> None:
    """`shardprep prepare FOLDER` as a crude dataset in one split, quietly (a benchmark's own set-up, not
    a measured run); its output in the error if it fails."""
    import subprocess

    command = [sys.executable, "-m", "prep", "prepare", str(folder), "--non-interactive", "--no-progress"]
    command += ["--split-ratio", "1,0,0", "--crude"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"preparing {folder} failed:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")


def describe(dataset: Dataset) -> str:
    """One line: name, samples, shards, size, place."""
    return (
        f"{dataset.name}: {dataset.samples} samples x {dataset.parts_per_sample} parts in {dataset.shards} shards, "
        f"{dataset.total_bytes() / 1e6:.0f} MB, {dataset.path}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_datasets",
        description="Generate (once, cached) the benchmark datasets and print where they are.",
    )
    parser.add_argument(
        "datasets",
        nargs="*",
        default=["text", "image"],
        choices=["text", "image", "scale", "scale-small"],
        help="which datasets to make (default: text image)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_ROOT, help=f"cache folder (default {DEFAULT_ROOT})"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--text-samples", type=int, default=200_000)
    parser.add_argument("--text-shards", type=int, default=10)
    parser.add_argument("--image-samples", type=int, default=100_000)
    parser.add_argument("--image-shards", type=int, default=20)
    parser.add_argument("--jpeg-bytes", type=int, default=36_000, help="target size of each JPEG")
    parser.add_argument("--scale-samples", type=int, default=10_000_000)
    parser.add_argument("--scale-shards", type=int, default=100)
    parser.add_argument(
        "--scale-small-shards",
        type=int,
        default=None,
        help="shards of the big scale dataset linked into the small one (default: a tenth)",
    )
    args = parser.parse_args(argv)
    made = []
    for name in dict.fromkeys(args.datasets):
        if name == "text":
            made.append(ensure_text_dataset(args.out, args.text_samples, args.text_shards, args.seed))
        elif name == "image":
            made.append(
                ensure_image_dataset(
                    args.out, args.image_samples, args.image_shards, args.jpeg_bytes, args.seed
                )
            )
        else:
            big = ensure_scale_dataset(args.out, args.scale_samples, args.scale_shards)
            if name == "scale":
                made.append(big)
            else:
                made.append(
                    ensure_scale_subset(big, args.scale_small_shards or max(1, big.shards // 10), args.out)
                )
    for dataset in made:
        print(describe(dataset))
        print("  " + json.dumps(asdict(dataset), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
