"""Token packing benchmark: utilisation of the packing algorithms, speed against TRL, and the cost of
packing inside energon's loader.

Three parts, each measured in this run (nothing is copied from earlier runs):

1. utilisation: real tokens / (bins x L) at L = 2048, 4096, 8192 on seeded lognormal lengths (median 300,
   sigma 1.0 and median 1200, sigma 0.8), for per-sample padding, next-fit, FFD and BFD with packing
   buffers of 256, 1000, 10000 documents and offline; the offline bin count against ceil(total / L).
   Over-long documents are chunked (no token is lost). Writes a PNG of utilisation against buffer size.
2. speed: 1,000,000 lognormal lengths (median 300, sigma 1.0) as real int32 token arrays, packed by
   `cookers.packed_tokens.pack_token_arrays` and by TRL's `pack_dataset` (bfd with its default 1,000-row
   map batches and offline; wrapped against our concat) with truncation, in the same process; prints
   times, fills and ratios. Skipped with a message when `trl`/`datasets` are not installed.
3. loader: the 200,000-sample text dataset of `tools.bench_datasets` through energon's loader with the
   packing task encoder, and the same pipeline without packing; packed tokens/s and the overhead.

    python -m tools.bench_pack                      # all three
    python -m tools.bench_pack --parts utilisation --docs 20000
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from cookers.packing import plan_packs_in_windows

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "bench"
DISTRIBUTIONS = ((300, 1.0), (1200, 0.8))
SEQ_LENGTHS = (2048, 4096, 8192)
BUFFERS: tuple[int | None, ...] = (256, 1000, 10000, None)
ALGORITHMS = ("padding", "next_fit", "ffd", "bfd")


def lognormal_lengths(count: int, median: float, sigma: float, seed: int = 0) -> np.ndarray:
    """Seeded lognormal document lengths (at least 1 token)."""
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(math.log(median), sigma, count)).astype(np.int64)


def utilisation(
    lengths: np.ndarray, seq_length: int, algorithm: str, buffer: int | None
) -> tuple[float, int]:
    """(real tokens / (bins x L), bins) for one configuration; over-long documents are chunked."""
    if algorithm == "padding":
        pieces = np.maximum(1, -(-lengths // seq_length))
        bins = int(pieces.sum())
        return float(lengths.sum()) / (bins * seq_length), bins
    plan = plan_packs_in_windows(lengths, seq_length, buffer, algorithm, overlong="chunk")
    return plan.utilisation(), plan.num_bins


def run_utilisation(docs: int, plot_path: Path) -> None:
    print(
        f"\n## Utilisation (real tokens / (bins x L)), {docs} documents per distribution, over-long chunked\n"
    )
    header = (
        f"{'L':>5} {'lengths':>16} {'algorithm':>9} "
        + " ".join(f"{'offline' if b is None else f'buf {b}':>10}" for b in BUFFERS)
        + f" {'bins off':>9} {'ceil(T/L)':>9} {'excess':>7}"
    )
    print(header)
    curves: dict[str, list[float]] = {}
    for seq_length in SEQ_LENGTHS:
        for median, sigma in DISTRIBUTIONS:
            lengths = lognormal_lengths(docs, median, sigma)
            bound = math.ceil(int(lengths.sum()) / seq_length)
            for algorithm in ALGORITHMS:
                row, bins = [], 0
                for buffer in BUFFERS:
                    fill, bins = utilisation(lengths, seq_length, algorithm, buffer)
                    row.append(fill)
                if seq_length == 4096 and median == 300:
                    curves[algorithm] = row
                excess = (bins - bound) / bound * 100
                print(
                    f"{seq_length:>5} {f'median {median} s{sigma}':>16} {algorithm:>9} "
                    + " ".join(f"{100 * f:>9.3f}%" for f in row)
                    + f" {bins:>9} {bound:>9} {excess:>6.2f}%"
                )
    _plot(curves, plot_path, docs)


def _plot(curves: dict[str, list[float]], path: Path, docs: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written")
        return
    positions = list(range(len(BUFFERS)))
    labels = ["offline" if b is None else str(b) for b in BUFFERS]
    figure, axes = plt.subplots(figsize=(6, 4))
    for algorithm, row in curves.items():
        axes.plot(positions, [100 * f for f in row], marker="o", label=algorithm)
    axes.set_xticks(positions, labels)
    axes.set_xlabel("packing buffer (documents)")
    axes.set_ylabel("utilisation (%)")
    axes.set_title(f"L = 4096, lognormal median 300 sigma 1.0, {docs} docs")
    axes.grid(alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"\nplot written to {path}")


def _timed(fn):  # noqa: ANN202 - returns (result, seconds)
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def run_speed(docs: int, seq_length: int) -> None:
    print(f"\n## Speed: {docs} lognormal documents (median 300, sigma 1.0), L = {seq_length}, truncate\n")
    from cookers.packed_tokens import pack_token_arrays

    lengths = lognormal_lengths(docs, 300, 1.0)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    tokens = np.random.default_rng(1).integers(0, 32000, size=int(offsets[-1]), dtype=np.int32)
    print(f"{int(offsets[-1]):,} tokens")
    truncated_total = int(np.minimum(lengths, seq_length).sum())

    def ours(algorithm: str, window: int | None) -> tuple[float, float, int]:
        rows, seconds = _timed(
            lambda: pack_token_arrays(tokens, offsets, seq_length, algorithm, "truncate", window)
        )
        assert len(rows.tokens) == (truncated_total if algorithm != "concat" else int(offsets[-1]))
        return seconds, len(rows.tokens) / (rows.num_rows * seq_length), rows.num_rows

    try:
        import datasets
        import pyarrow as pa
        from trl import pack_dataset
    except ImportError:
        trl = None
        print("trl/datasets are not installed: TRL comparison skipped (pip install trl datasets)")
    else:
        trl = pack_dataset
        datasets.disable_progress_bars()
        column = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(tokens))
        dataset = datasets.Dataset(pa.table({"input_ids": column}))

    def theirs(strategy: str, batch_size: int | None) -> tuple[float, float, int]:
        kwargs = {"batch_size": batch_size} if batch_size is not None else {"batch_size": None}
        packed, seconds = _timed(lambda: trl(dataset, seq_length, strategy=strategy, map_kwargs=kwargs))
        table = packed.with_format("arrow")[:]
        real = int(table.column("input_ids").combine_chunks().value_lengths().to_numpy().sum())
        return seconds, real / (len(packed) * seq_length), len(packed)

    cases = (
        ("bfd, 1000-document windows", ("bfd", 1000), ("bfd", 1000)),
        ("bfd, offline", ("bfd", None), ("bfd", None)),
        ("concat vs wrapped, 1000-doc windows", ("concat", 1000), ("wrapped", 1000)),
    )
    print(f"{'case':<36} {'ours s':>8} {'ours fill':>10} {'TRL s':>8} {'TRL fill':>10} {'TRL/ours':>9}")
    for name, our_args, trl_args in cases:
        our_s, our_fill, _ = ours(*our_args)
        if trl is None:
            print(f"{name:<36} {our_s:>8.2f} {100 * our_fill:>9.3f}%")
            continue
        trl_s, trl_fill, _ = theirs(*trl_args)
        print(
            f"{name:<36} {our_s:>8.2f} {100 * our_fill:>9.3f}% {trl_s:>8.2f} {100 * trl_fill:>9.3f}% "
            f"{trl_s / our_s:>8.2f}x"
        )


def _packing_dataset(samples: int) -> Path:
    """The bench text dataset, hard-linked into a folder of our own and prepared as a crude dataset."""
    from tools.bench_datasets import ensure_text_dataset, prepare_crude

    source = ensure_text_dataset(samples=samples)
    folder = CACHE / f"text-packing-{samples}"
    if not (folder / ".nv-meta" / "dataset.yaml").exists():
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for shard in source.shard_paths():
            os.link(shard, folder / shard.name)
        prepare_crude(folder)
    return folder


def run_loader(samples: int, seq_length: int, buffer: int) -> None:
    import warnings

    from megatron.energon import WorkerConfig, get_loader, get_train_dataset

    from cookers.energon_packing import PackingTaskEncoder, TokenizedDocument
    from cookers.packed_layout import flatten_packs, layout_pack
    from cookers.tokenizer import load_tokenizer
    from tools.text_corpus import documents
    from tools.train_tokenizer import train_tokenizer

    warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true")
    print(f"\n## energon loader: {samples} text samples, L = {seq_length}, packing buffer {buffer}\n")
    folder = _packing_dataset(samples)
    tokenizer_path = CACHE / "packing-tokenizer.json"
    if not tokenizer_path.exists():
        train_tokenizer(documents(5000), vocab_size=4000).save(str(tokenizer_path))
    tokenizer = load_tokenizer(tokenizer_path)

    class UnpackedTaskEncoder(PackingTaskEncoder):
        """The same tokenization and batch layout, each document alone (no packing)."""

        def before_batching(self, dataset, **settings):  # noqa: ANN001, ANN201
            return dataset, None  # no packing buffer, and none asked for

        def batch(self, samples: list[TokenizedDocument]):  # noqa: ANN201
            flat = flatten_packs([layout_pack([s.input_ids]) for s in samples])
            return flat

    def measure(encoder, packing_buffer: int | None, batch_size: int) -> tuple[float, int, int]:
        config = WorkerConfig(rank=0, world_size=1, num_workers=1)
        dataset = get_train_dataset(
            folder,
            worker_config=config,
            batch_size=batch_size,
            shuffle_buffer_size=None,
            max_samples_per_sequence=None,
            packing_buffer_size=packing_buffer,
            task_encoder=encoder,
            repeat=False,
        )
        tokens, slots = 0, 0
        started = time.perf_counter()
        for batch in get_loader(dataset):
            tokens += batch.num_tokens
            if packing_buffer is not None:
                slots += batch.num_packs * seq_length
        return time.perf_counter() - started, tokens, slots

    packed = PackingTaskEncoder(tokenizer, seq_length, algorithm="bfd", overlong="chunk")
    packed_s, packed_tokens, slots = measure(packed, buffer, batch_size=1)
    plain_s, plain_tokens, _ = measure(UnpackedTaskEncoder(tokenizer, seq_length, overlong="chunk"), None, 32)
    assert packed_tokens == plain_tokens, "packing lost or duplicated tokens"
    print(f"{'pipeline':<22} {'seconds':>8} {'tokens/s':>12}")
    print(
        f"{'packed (bfd)':<22} {packed_s:>8.2f} {packed_tokens / packed_s:>12,.0f}   fill {100 * packed_tokens / slots:.2f}%"
    )
    print(f"{'unpacked':<22} {plain_s:>8.2f} {plain_tokens / plain_s:>12,.0f}")
    print(f"packing overhead: {100 * (packed_s - plain_s) / plain_s:+.1f}%")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("utilisation", "speed", "loader"),
        default=["utilisation", "speed", "loader"],
    )
    parser.add_argument("--docs", type=int, default=100_000, help="documents per utilisation distribution")
    parser.add_argument("--speed-docs", type=int, default=1_000_000, help="documents in the speed comparison")
    parser.add_argument("--loader-samples", type=int, default=200_000, help="samples of the loader dataset")
    parser.add_argument("--loader-seq-length", type=int, default=2048)
    parser.add_argument("--loader-buffer", type=int, default=1000)
    parser.add_argument("--plot", type=Path, default=CACHE / "pack_utilisation.png")
    args = parser.parse_args(argv)
    if "utilisation" in args.parts:
        run_utilisation(args.docs, args.plot)
    if "speed" in args.parts:
        run_speed(args.speed_docs, 4096)
    if "loader" in args.parts:
        run_loader(args.loader_samples, args.loader_seq_length, args.loader_buffer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
