"""`prepare --media-metadata-by-extension` against `energon prepare` with the same flag, on the image dataset
(real JPEGs, `tools.bench_datasets`), in one run: wall time, CPU, peak memory, ratios, and whether the
media tables agree row for row.

    python -m tools.bench_media --image-samples 20000
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
from pathlib import Path

from tools import bench_datasets
from tools.bench_prepare import PREPARE_FLAGS, energon_executable
from tools.measure import measure

MEDIA_FLAG = "--media-metadata-by-extension"


def media_rows(dataset: Path) -> list[tuple]:
    db = sqlite3.connect(dataset / ".nv-meta" / "index.sqlite")
    try:
        return sorted(db.execute("SELECT * FROM media_metadata"))
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=bench_datasets.DEFAULT_ROOT, help="dataset cache folder")
    parser.add_argument("--image-samples", type=int, default=100_000)
    parser.add_argument("--image-shards", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=1, help="runs per tool; the median wall is reported")
    parser.add_argument("--num-workers", type=int, default=None, help="for both tools [default: CPU count]")
    args = parser.parse_args(argv)

    dataset = bench_datasets.ensure_image_dataset(args.out, args.image_samples, args.image_shards)
    workers = ["--num-workers", str(args.num_workers)] if args.num_workers else []
    commands = {
        "energon": [energon_executable(), "prepare", str(dataset.path), *PREPARE_FLAGS, *workers, MEDIA_FLAG],
        "shardprep": [
            sys.executable,
            "-m",
            "prep",
            "prepare",
            str(dataset.path),
            *PREPARE_FLAGS,
            *workers,
            MEDIA_FLAG,
        ],
    }
    print(
        f"{dataset.samples} samples ({dataset.samples} JPEG parts) in {dataset.shards} shards, {dataset.total_bytes() / 1e9:.2f} GB"
    )
    results, rows = {}, {}
    for tool, command in commands.items():
        walls, measurement = [], None
        for _ in range(args.repeat):
            measurement, stderr = measure(command, cwd=Path(__file__).resolve().parents[1])
            if measurement.returncode != 0:
                print(f"{tool} failed:\n{stderr.decode(errors='replace')[-2000:]}")
                return 1
            walls.append(measurement.wall_seconds)
        results[tool] = (statistics.median(walls), measurement)
        rows[tool] = media_rows(dataset.path)
        print(
            f"{tool:>9}: {results[tool][0]:8.2f} s wall, {measurement.user_seconds:8.2f} s user,"
            f" peak tree RSS {measurement.peak_tree_rss_mb:7.1f} MB, PSS {measurement.peak_tree_pss_mb:7.1f} MB"
        )
    same = rows["energon"] == rows["shardprep"]
    print(f"media tables equal: {same} ({len(rows['shardprep'])} rows)")
    ratio = results["energon"][0] / results["shardprep"][0]
    memory = results["energon"][1].peak_tree_pss_mb / results["shardprep"][1].peak_tree_pss_mb
    print(
        f"shardprep is {ratio:.1f}x faster than energon (wall); energon uses {memory:.1f}x the memory (PSS)"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
