"""`prepare --media-metadata-by-extension` against `energon prepare` with the same flag, in one run: wall
time, CPU, peak memory, ratios, and whether the media tables agree row for row. Every run starts with the
shards read into the page cache (as in `tools.bench_prepare`).

Two datasets (`--datasets`):

- image: the image dataset of `tools.bench_datasets` (real JPEGs, a caption and a JSON part each);
- audio: WAV (16-bit PCM, written by the standard library) and, when `soundfile` is installed, FLAC clips
  of 1 to 6 seconds at 16 kHz, with a caption each. energon decodes each clip with PyAV to count its
  samples; shardprep reads the WAV and FLAC headers. energon describes audio only with PyAV installed,
  so without PyAV this dataset is skipped.

    python -m tools.bench_media --image-samples 20000 --audio-samples 4000
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tarfile
import wave
from pathlib import Path

from tests.support.prepare import media_rows
from tools import bench_datasets
from tools.bench_datasets import Dataset
from tools.bench_prepare import PREPARE_FLAGS, default_num_workers, energon_executable, warm_cache
from tools.measure import measure

MEDIA_FLAG = "--media-metadata-by-extension"
REPO = Path(__file__).resolve().parents[1]
AUDIO_RATE = 16000


def audio_clips(seed: int) -> list[tuple[str, bytes]]:
    """Eight distinct clips (extension, bytes): WAV, and FLAC too when soundfile is installed."""
    rng = random.Random(seed)
    clips = []
    for index in range(8):
        frames = rng.randint(1, 6) * AUDIO_RATE + rng.randint(0, AUDIO_RATE - 1)
        pcm = rng.randbytes(2 * frames)
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(AUDIO_RATE)
            out.writeframes(pcm)
        clips.append(("wav", buffer.getvalue()))
        try:
            import numpy as np
            import soundfile
        except ImportError:
            continue
        if index % 2:
            samples = np.frombuffer(pcm, dtype="<i2")
            buffer = io.BytesIO()
            soundfile.write(buffer, samples, AUDIO_RATE, format="FLAC", subtype="PCM_16")
            clips[-1] = ("flac", buffer.getvalue())
    return clips


def ensure_audio_dataset(root: Path, samples: int, shards: int, seed: int = 0) -> Dataset:
    """The audio dataset: a clip and a caption per sample, `shards` shards (cached like the others)."""

    def build(folder: Path) -> int:
        clips = audio_clips(seed)
        per_shard = -(-samples // shards)
        for shard in range(shards):
            first, last = shard * per_shard, min(samples, (shard + 1) * per_shard)
            with tarfile.open(
                folder / (bench_datasets.SHARD_PATTERN % shard), "w", format=tarfile.USTAR_FORMAT
            ) as tar:
                for index in range(first, last):
                    extension, clip = clips[index % len(clips)]
                    for part, data in ((extension, clip), ("txt", f"clip {index}".encode())):
                        info = tarfile.TarInfo(f"{index:09d}.{part}")
                        info.size, info.mtime = len(data), 1_700_000_000
                        tar.addfile(info, io.BytesIO(data))
        return samples

    kinds = "wav+flac" if any(extension == "flac" for extension, _ in audio_clips(seed)) else "wav"
    params = {"kind": "audio", "samples": samples, "shards": shards, "clips": kinds, "seed": seed}
    name = f"audio-{samples}x{shards}-{kinds}-seed{seed}"
    return bench_datasets._cached(name, root, params, build, parts_per_sample=2)


def bench_media(dataset: Dataset, repeat: int, workers: int | None, what: str) -> dict:
    """energon, then shardprep, `repeat` times each on `dataset`; prints and returns the figures."""
    extra = ["--num-workers", str(workers)] if workers else []
    commands = {
        "energon": [energon_executable(), "prepare", str(dataset.path), *PREPARE_FLAGS, *extra, MEDIA_FLAG],
        "shardprep": [
            sys.executable,
            "-m",
            "prep",
            "prepare",
            str(dataset.path),
            *PREPARE_FLAGS,
            *extra,
            MEDIA_FLAG,
        ],
    }
    print(
        f"{dataset.name}: {dataset.samples} samples ({dataset.samples} {what} parts) in {dataset.shards} shards,"
        f" {dataset.total_bytes() / 1e9:.2f} GB"
    )
    if workers:
        print(f"--num-workers {workers} for both")
    else:
        print(
            "--num-workers: each tool's default, energon"
            f" {default_num_workers('megatron.energon.tools.prepare', 'command')}, shardprep"
            f" {default_num_workers('prep.prepare.cli', 'prepare_command')}"
        )
    figures: dict = {"dataset": dataset.name, "samples": dataset.samples}
    rows = {}
    for tool, command in commands.items():
        runs = []
        for _ in range(repeat):
            warm_cache(dataset)  # every run reads the parts from memory, not only the ones after the first
            measurement, stderr = measure(command, cwd=REPO)
            if measurement.returncode != 0:
                print(f"{tool} failed:\n{stderr.decode(errors='replace')[-2000:]}")
                figures["index_equal"] = False
                return figures
            runs.append(measurement)
        rows[tool] = media_rows(dataset.path)
        # Times are the median of the runs, memory the largest of them (as in tools.bench_prepare).
        figures[tool] = {
            "wall_seconds": statistics.median(run.wall_seconds for run in runs),
            "user_seconds": statistics.median(run.user_seconds for run in runs),
            "peak_tree_rss_mb": max(run.peak_tree_rss_mb for run in runs),
            "peak_tree_pss_mb": max(run.peak_tree_pss_mb for run in runs),
            "other_cores": statistics.median(run.other_cores for run in runs),
        }
        print(
            f"{tool:>9}: {figures[tool]['wall_seconds']:8.2f} s wall, {figures[tool]['user_seconds']:8.2f} s user,"
            f" peak tree RSS {figures[tool]['peak_tree_rss_mb']:7.1f} MB,"
            f" PSS {figures[tool]['peak_tree_pss_mb']:7.1f} MB, other load {figures[tool]['other_cores']:.2f} cores"
        )
    same = rows["energon"] == rows["shardprep"]
    figures["index_equal"] = same
    figures["rows"] = len(rows["shardprep"])
    ratio = figures["energon"]["wall_seconds"] / figures["shardprep"]["wall_seconds"]
    memory = figures["energon"]["peak_tree_pss_mb"] / figures["shardprep"]["peak_tree_pss_mb"]
    figures["speedup"], figures["memory_ratio"] = ratio, memory
    print(f"media tables equal: {same} ({len(rows['shardprep'])} rows)")
    print(
        f"shardprep is {ratio:.1f}x faster than energon (wall); energon uses {memory:.1f}x the memory (PSS)"
    )
    return figures


def run(
    root: Path,
    datasets: list[str],
    *,
    image_samples: int,
    image_shards: int,
    audio_samples: int,
    audio_shards: int,
    repeat: int = 1,
    workers: int | None = None,
) -> list[dict]:
    """The media benchmark on each named dataset ("image", "audio"); the figures of each."""
    results = []
    for name in datasets:
        if name == "image":
            dataset = bench_datasets.ensure_image_dataset(root, image_samples, image_shards)
            results.append(bench_media(dataset, repeat, workers, "JPEG"))
        elif name == "audio":
            try:
                import av  # noqa: F401  (energon describes audio only with PyAV)
            except ImportError:
                print("audio: skipped, PyAV is not installed (energon would write no audio rows)")
                continue
            dataset = ensure_audio_dataset(root, audio_samples, audio_shards)
            results.append(bench_media(dataset, repeat, workers, "WAV/FLAC"))
        else:
            raise SystemExit(f"unknown media dataset {name!r} (image, audio)")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_media", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=bench_datasets.DEFAULT_ROOT, help="dataset cache folder")
    parser.add_argument("--datasets", default="image,audio", help="comma list of image,audio")
    parser.add_argument("--image-samples", type=int, default=100_000)
    parser.add_argument("--image-shards", type=int, default=20)
    parser.add_argument("--audio-samples", type=int, default=4000)
    parser.add_argument("--audio-shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool; the median wall is reported")
    parser.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="for both tools [default: each tool's own, printed: energon's is not the CPU count]",
    )
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    results = run(
        args.out,
        [name.strip() for name in args.datasets.split(",") if name.strip()],
        image_samples=args.image_samples,
        image_shards=args.image_shards,
        audio_samples=args.audio_samples,
        audio_shards=args.audio_shards,
        repeat=args.repeat,
        workers=args.num_workers,
    )
    return 0 if all(result.get("index_equal") for result in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
