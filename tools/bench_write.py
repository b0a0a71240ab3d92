"""Benchmark `shardprep write` against webdataset's ShardWriter followed by `energon prepare`, in one run.

Two inputs, generated once and cached under ``.cache/bench/``:

- ``text``: JSONL rows of about 300 bytes (seeded pseudo-text, ``tools.bench_datasets.text_record``);
- ``image``: a folder of ``NNNNNNNNN.jpg`` (real ~36 KB JPEGs) + ``NNNNNNNNN.txt`` captions.

For each input, four commands run as separate processes, measured by ``tools.measure`` (wall time, peak
RSS of the process tree): ``shardprep write``; webdataset's ShardWriter writing the same parts; then
``energon prepare`` on its shards; and as the floor a bare Python loop that reads the same input and
writes its bytes to one file. Both writers write the same bytes per part (the JSONL line as ``json``;
the files as they are), and both outputs load in energon. The input is read into the page cache before
each command that reads it (``energon prepare`` reads the shards ShardWriter has just written, as in use).

    python -m tools.bench_write                          # 1,000,000 rows and 50,000 images
    python -m tools.bench_write --rows 100000 --images 5000
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

from tools.bench_datasets import DEFAULT_ROOT, _vocabulary, noise_jpegs, text_record
from tools.bench_prepare import read_into_cache
from tools.measure import Measurement, measure

REPO = Path(__file__).resolve().parents[1]
MB = 1e6

WEBDATASET_TEXT = """
import sys, webdataset as wds
source, out, maxcount = sys.argv[1], sys.argv[2], int(sys.argv[3])
with wds.ShardWriter(out + "/shard-%06d.tar", maxcount=maxcount, verbose=0) as writer, open(source, "rb") as rows:
    for number, line in enumerate(rows):
        writer.write({"__key__": "%09d" % number, "json": line.rstrip(b"\\n")})
"""

WEBDATASET_FOLDER = """
import os, sys, webdataset as wds
source, out, maxcount = sys.argv[1], sys.argv[2], int(sys.argv[3])
samples = {}
for name in sorted(os.listdir(source)):
    key, _, part = name.partition(".")
    samples.setdefault(key, []).append((part, name))
with wds.ShardWriter(out + "/shard-%06d.tar", maxcount=maxcount, maxsize=3e9, verbose=0) as writer:
    for key, parts in samples.items():
        sample = {"__key__": key}
        for part, name in parts:
            with open(os.path.join(source, name), "rb") as file:
                sample[part] = file.read()
        writer.write(sample)
"""

FLOOR_TEXT = """
import sys
with open(sys.argv[1], "rb", buffering=1 << 20) as rows, open(sys.argv[2] + "/all.bin", "wb", buffering=1 << 20) as out:
    for line in rows:
        out.write(line)
"""

FLOOR_FOLDER = """
import os, sys
with open(sys.argv[2] + "/all.bin", "wb", buffering=1 << 20) as out:
    for name in sorted(os.listdir(sys.argv[1])):
        with open(os.path.join(sys.argv[1], name), "rb") as file:
            out.write(file.read())
"""


def ensure_jsonl(root: Path, rows: int, seed: int = 0) -> Path:
    """`rows` JSONL lines of ~300 bytes, made once."""
    path = root / f"write-text-{rows}-seed{seed}.jsonl"
    if not path.exists():
        rng = random.Random(seed)
        words = _vocabulary(rng)
        partial = path.with_suffix(".partial")
        with open(partial, "w", buffering=1 << 20) as out:
            for index in range(rows):
                out.write(json.dumps(text_record(index, rng, words)) + "\n")
        partial.rename(path)
    return path


def ensure_image_folder(root: Path, images: int, jpeg_bytes: int = 36_000, seed: int = 0) -> Path:
    """A folder of `images` jpg + txt pairs, made once."""
    path = root / f"write-image-{images}x{jpeg_bytes}b-seed{seed}"
    if not path.exists():
        rng = random.Random(seed)
        words = _vocabulary(rng)
        jpegs = noise_jpegs(jpeg_bytes, 8, seed)
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for index in range(images):
            (partial / f"{index:09d}.jpg").write_bytes(jpegs[index % len(jpegs)])
            (partial / f"{index:09d}.txt").write_text(" ".join(rng.choices(words, k=rng.randint(5, 15))))
        partial.rename(path)
    return path


def input_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir())


def output_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(argv: list[str], label: str, source: Path | None = None) -> Measurement:
    """`argv` measured; with `source`, after reading it into the page cache."""
    if source is not None:  # every command starts from the input in memory, not only those after the first
        read_into_cache(sorted(source.iterdir()) if source.is_dir() else [source])
    measurement, errors = measure(argv, cwd=REPO)
    if measurement.returncode != 0:
        sys.exit(f"{label} failed ({measurement.returncode}):\n{errors.decode(errors='replace')}")
    return measurement


def bench(name: str, source: Path, samples: int, work: Path, maxcount: int) -> None:
    python = sys.executable
    folder = source.is_dir()
    outs = {label: work / f"{name}-{label}" for label in ("shardprep", "webdataset", "floor")}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)
    outs["webdataset"].mkdir(parents=True)
    outs["floor"].mkdir(parents=True)
    ours = run(
        [
            python,
            "-m",
            "prep",
            "write",
            str(source),
            str(outs["shardprep"]),
            "--no-progress",
            "--maxcount",
            str(maxcount),
        ],
        "shardprep write",
        source,
    )
    writer = run(
        [
            python,
            "-c",
            WEBDATASET_FOLDER if folder else WEBDATASET_TEXT,
            str(source),
            str(outs["webdataset"]),
            str(maxcount),
        ],
        "webdataset ShardWriter",
        source,
    )
    energon = shutil.which("energon", path=str(Path(python).parent)) or "energon"
    prepare = run(
        [
            energon,
            "prepare",
            str(outs["webdataset"]),
            "--non-interactive",
            "--split-ratio",
            "1,0,0",
            "--sample-type",
            "CrudeWebdataset",
            "--no-progress",
        ],
        "energon prepare",
    )
    floor = run(
        [python, "-c", FLOOR_FOLDER if folder else FLOOR_TEXT, str(source), str(outs["floor"])],
        "floor",
        source,
    )
    size = input_bytes(source)
    their_wall = writer.wall_seconds + prepare.wall_seconds
    rows = [
        ("shardprep write", ours.wall_seconds, output_bytes(outs["shardprep"]), ours.peak_tree_rss_mb),
        ("webdataset ShardWriter", writer.wall_seconds, None, writer.peak_tree_rss_mb),
        ("energon prepare", prepare.wall_seconds, None, prepare.peak_tree_rss_mb),
        (
            "ShardWriter + energon prepare",
            their_wall,
            output_bytes(outs["webdataset"]),
            max(writer.peak_tree_rss_mb, prepare.peak_tree_rss_mb),
        ),
        (
            "floor: read + write bytes",
            floor.wall_seconds,
            output_bytes(outs["floor"]),
            floor.peak_tree_rss_mb,
        ),
    ]
    print(f"\n{name}: {samples:,} samples, {size / MB:,.1f} MB of input ({source})")
    print(f"{'':32} {'wall s':>8} {'samples/s':>11} {'MB/s':>8} {'output MB':>10} {'peak RSS MB':>12}")
    for label, wall, nbytes, rss in rows:
        output = f"{nbytes / MB:10,.1f}" if nbytes is not None else f"{'':10}"
        print(f"{label:32} {wall:8.2f} {samples / wall:11,.0f} {size / MB / wall:8.1f} {output} {rss:12.1f}")
    print(
        f"ratio: shardprep write is {their_wall / ours.wall_seconds:.1f}x faster than ShardWriter + energon prepare;"
        f" {ours.wall_seconds / floor.wall_seconds:.1f}x the floor's time; output"
        f" {output_bytes(outs['shardprep']) / output_bytes(outs['webdataset']):.2f}x the size of ShardWriter's"
    )
    other = max(m.other_cores for m in (ours, writer, prepare, floor))
    if other > 0.3:
        print(f"note: up to {other:.1f} cores were busy with other work during the runs; figures are noisy")
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_write", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="JSONL rows (0 to skip)")
    parser.add_argument("--images", type=int, default=50_000, help="image records (0 to skip)")
    parser.add_argument("--maxcount", type=int, default=10_000, help="samples per shard for both writers")
    parser.add_argument("--cache", type=Path, default=DEFAULT_ROOT, help="where inputs are cached")
    parser.add_argument(
        "--work", type=Path, default=None, help="where outputs go (default: CACHE/write-work)"
    )
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    work = args.work or args.cache / "write-work"
    work.mkdir(parents=True, exist_ok=True)
    if args.rows:
        bench("text", ensure_jsonl(args.cache, args.rows), args.rows, work, args.maxcount)
    if args.images:
        bench("image", ensure_image_folder(args.cache, args.images), args.images, work, args.maxcount)
    return 0


if __name__ == "__main__":
    sys.exit(main())
