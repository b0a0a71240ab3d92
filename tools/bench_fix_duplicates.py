"""Benchmark `prepare --fix-duplicates`: energon 7.4.1 against shardprep, in one run, on one dataset.

Every shard holds the same keys (so every key is a duplicate and every member is renamed). The dataset is
written once (cached under --out), then copied afresh for each measured run, since a run renames it in
place; the copies are synced to disk before the runs. Two figures per tool, each the wall time and peak memory of its whole process tree
(`tools.measure`):

- the rename alone: energon's `TarPatcher.dataset_scan` + `dataset_apply_prefix` (what its prepare calls)
  against shardprep's `fix_duplicates`, each in a fresh Python process;
- the whole `prepare --fix-duplicates --non-interactive --split-ratio 1,0,0`.

After the runs the renamed shards of the two tools are compared byte for byte.

    python -m tools.bench_fix_duplicates --shards 200 --samples 5000
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import sys
from pathlib import Path

from prep.tar.fields import ZERO_BLOCK, block_ceil
from prep.tar.write import HeaderMaker
from tools.bench_datasets import DEFAULT_ROOT
from tools.bench_prepare import energon_executable
from tools.measure import measure

REPO = Path(__file__).resolve().parents[1]
PREPARE_FLAGS = ["--non-interactive", "--split-ratio", "1,0,0", "--no-progress"]
ENERGON_RENAME = """
import sys
from megatron.energon.epathlib import EPath
from megatron.energon.flavors.webdataset.tar_patcher import TarPatcher
root, workers = sys.argv[1], int(sys.argv[2])
shards = sorted(p for p in __import__("os").listdir(root) if p.endswith(".tar"))
patcher = TarPatcher(show_progress=False)
found = patcher.dataset_scan(shards, parent_path=EPath(root), num_workers=workers)
assert found.has_duplicates and found.compatible
patcher.dataset_apply_prefix(shards, parent_path=EPath(root), num_workers=workers)
"""
OURS_RENAME = """
import os, sys
from pathlib import Path
from prep.prepare.fix_duplicates import fix_duplicates
root, workers = Path(sys.argv[1]), int(sys.argv[2])
shards = sorted(p for p in os.listdir(root) if p.endswith(".tar"))
summary = fix_duplicates(root, shards, workers, lambda line: None)
assert len(summary.renamed) == len(shards)
"""


def write_dataset(folder: Path, shards: int, samples: int) -> None:
    """`shards` shards of `samples` samples each (a `txt` and a `json` part), the same keys in each."""
    folder.mkdir(parents=True, exist_ok=True)
    maker = HeaderMaker(mtime=1_700_000_000)
    chunks = []
    for i in range(samples):
        for part, data in (("txt", b"some text of sample %d " % i * 4), ("json", b'{"sample": %d}' % i)):
            chunks += [
                maker.member(f"{i:08d}.{part}", len(data)),
                data,
                bytes(block_ceil(len(data)) - len(data)),
            ]
    body = b"".join(chunks) + ZERO_BLOCK * 2
    for shard in range(shards):
        (folder / f"shard-{shard:05d}.tar").write_bytes(body)


def cached_dataset(out: Path, shards: int, samples: int) -> Path:
    folder = out / f"fix-duplicates-{shards}x{samples}"
    done = folder / ".complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        write_dataset(folder, shards, samples)
        done.write_text(json.dumps({"shards": shards, "samples": samples}))
    return folder


def fresh_copies(pristine: Path) -> tuple[Path, Path]:
    """A copy of the dataset for energon and one for shardprep, on disk before either runs: the copies'
    pages are written out here, not during the first run (as writeback beside it) or by shardprep's
    fsync of each renamed shard (which had written out the whole copied shard)."""
    copies = []
    for name in ("energon", "shardprep"):
        copy = pristine.parent / f"{pristine.name}-{name}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(pristine, copy, ignore=shutil.ignore_patterns(".complete"))
        copies.append(copy)
    os.sync()
    return copies[0], copies[1]


def run(label: str, argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    measured, stderr = measure(argv, cwd=REPO, env=env)
    if measured.returncode != 0:
        raise SystemExit(
            f"{label} failed ({measured.returncode}):\n{stderr.decode(errors='replace')[-3000:]}"
        )
    print(
        f"{label:<44} {measured.wall_seconds:8.2f} s  cpu {measured.user_seconds + measured.system_seconds:7.2f} s"
        f"  peak tree RSS {measured.peak_tree_rss_mb:8.1f} MB",
        flush=True,
    )
    return measured.wall_seconds


def same_shards(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.tar"))
    return names == sorted(p.name for p in b.glob("*.tar")) and all(
        filecmp.cmp(a / name, b / name, shallow=False) for name in names
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_ROOT, help="dataset cache folder")
    parser.add_argument("--shards", type=int, default=200)
    parser.add_argument("--samples", type=int, default=5000, help="samples per shard (2 members each)")
    parser.add_argument("--num-workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--skip-prepare", action="store_true", help="measure the rename alone")
    args = parser.parse_args(argv)
    pristine = cached_dataset(args.out, args.shards, args.samples)
    size = sum(p.stat().st_size for p in pristine.glob("*.tar"))
    members = args.shards * args.samples * 2
    print(
        f"{args.shards} shards x {args.samples} samples ({members} members, {size / 2**30:.2f} GiB), "
        f"{args.num_workers} workers, {os.cpu_count()} CPUs"
    )
    workers = str(args.num_workers)
    theirs, ours = fresh_copies(pristine)
    energon = run(
        "energon TarPatcher scan + apply", [sys.executable, "-c", ENERGON_RENAME, str(theirs), workers]
    )
    shardprep = run("shardprep fix_duplicates", [sys.executable, "-c", OURS_RENAME, str(ours), workers])
    print(
        f"rename alone: shardprep {energon / shardprep:.1f}x energon; same bytes: {same_shards(theirs, ours)}"
    )
    if not args.skip_prepare:
        theirs, ours = fresh_copies(pristine)
        energon = run(
            "energon prepare --fix-duplicates",
            [
                energon_executable(),
                "prepare",
                str(theirs),
                *PREPARE_FLAGS,
                "--num-workers",
                workers,
                "--fix-duplicates",
            ],
        )
        shardprep = run(
            "shardprep prepare --fix-duplicates",
            [
                sys.executable,
                "-m",
                "prep",
                "prepare",
                str(ours),
                *PREPARE_FLAGS,
                "--num-workers",
                workers,
                "--fix-duplicates",
            ],
        )
        print(
            f"whole prepare: shardprep {energon / shardprep:.1f}x energon; same bytes: {same_shards(theirs, ours)}"
        )
    for copy in (theirs, ours):
        shutil.rmtree(copy, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
