"""Record assembly benchmark: Safe Synthesizer's three modes over 1,000,000 records (~20 tokens each) in
20,000 groups at L = 2048, one core each.

Every case runs in a child process pinned to one core (tokenizers single-threaded), measured by
`tools.measure` (wall time, peak RSS of the process tree). Records are generated on the fly, group after
group (as `shardprep write --group-contiguous` lays them out), and the time spent making them is left out.
For each case it prints:

- records/s with tokenization (serialise, tokenize, check, plan, lay out), without it (the tokenizer's time
  left out as well), and of the tokenizer alone (`tokenizers`, byte-level BPE, one thread);
- examples produced, and fill: record tokens / (examples x L);
- peak RSS, at the full size and at a tenth of it: the load-time path (`assemble_stream`, a window at a
  time, what the energon task encoder runs) keeps it flat; the whole-dataset pass (`assemble_records`,
  the reference's shuffled pass) holds every record's tokens and all examples;
- next-fit (the reference) against best-fit in the tabular and grouped modes.

NeMo Safe Synthesizer itself cannot run here (its assemblers need `datasets`, `transformers`, `pandas` and
scikit-learn, and the package pins vllm and torch builds); the figures are set against the issue's target
of 200,000 records/s per core after tokenization, with memory flat in the number of records.

    python -m tools.bench_records                                   # 1,000,000 records, every case
    python -m tools.bench_records --records 100000 --groups 2000    # smaller
    python -m tools.bench_records --cases stream-tabular stream-grouped
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "bench"
SEQ_LENGTH = 2048
CATEGORIES = ("grocery", "coffee", "electronics", "clothing", "fuel", "travel", "pharmacy", "books")
#: name -> (entry point, mode, settings); windows are records (tabular) or groups (grouped).
CASES: dict[str, tuple[str, str, dict]] = {
    "stream-tabular": ("stream", "tabular", {"window": 10_000}),
    "stream-tabular-nocap": ("stream", "tabular", {"window": 10_000, "max_sequences_per_example": None}),
    "stream-tabular-bestfit": (
        "stream",
        "tabular",
        {"window": 10_000, "max_sequences_per_example": None, "packing": "best_fit"},
    ),
    "stream-grouped": ("stream", "grouped", {"window": 500}),
    "stream-grouped-bestfit": ("stream", "grouped", {"window": 500, "packing": "best_fit"}),
    "stream-grouped-exact": ("stream", "grouped", {"window": 500, "exact_budget": True}),
    "stream-sequential": ("stream", "sequential", {}),
    "whole-tabular": ("whole", "tabular", {}),
    "whole-grouped": ("whole", "grouped", {}),
    "whole-sequential": ("whole", "sequential", {}),
}
#: Cases also run at a tenth of the size, to show how memory grows with the number of records.
FLATNESS_CASES = ("stream-tabular", "stream-grouped", "stream-sequential", "whole-tabular")


def group_sizes(records: int, groups: int, seed: int = 0) -> np.ndarray:
    """Sizes of `groups` groups that add up to `records`, spread between 2/5 and 8/5 of the mean."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(20, 81, size=groups).astype(np.float64)
    bounds = np.round(np.cumsum(weights) / weights.sum() * records).astype(np.int64)
    return np.diff(np.concatenate(([0], bounds)))


class Timed:
    """Seconds spent making records, counted apart from the assembly that takes them."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def records(self, sizes: np.ndarray, seed: int = 1, chunk: int = 4096) -> Iterator[dict]:
        """Transactions of customer after customer (about 20 tokens each), made `chunk` at a time."""
        rng = np.random.default_rng(seed)
        customers = np.repeat(np.arange(len(sizes)), sizes)
        for lo in range(0, len(customers), chunk):
            started = time.perf_counter()
            ids = customers[lo : lo + chunk].tolist()
            n = len(ids)
            days = rng.integers(1, 366, n).tolist()
            dimes = rng.integers(10, 4_000, n).tolist()
            kinds = rng.integers(0, len(CATEGORIES), n).tolist()
            batch = [
                {"customer": f"C{c}", "day": d, "amount": a / 10, "category": CATEGORIES[k]}
                for c, d, a, k in zip(ids, days, dimes, kinds, strict=True)
            ]
            self.seconds += time.perf_counter() - started
            yield from batch


def bench_tokenizer():  # noqa: ANN201 - a TokenizerAdapter that times its own encoding
    """A byte-level BPE trained once on generated records (cached), with BOS/EOS, timing its encode_batch."""
    from cookers.tokenizer import TokenizerAdapter, load_tokenizer
    from tools.train_tokenizer import train_tokenizer

    path = CACHE / "records-tokenizer.json"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        sample = Timed().records(group_sizes(20_000, 400, seed=5), seed=6)
        texts = [json.dumps(r, separators=(",", ":")) + "\n" for r in sample]
        train_tokenizer(texts, vocab_size=2000).save(str(path))

    class TimedTokenizer(TokenizerAdapter):
        seconds = [0.0]

        def encode_batch(self, texts):  # noqa: ANN001, ANN201
            started = time.perf_counter()
            out = super().encode_batch(texts)
            self.seconds[0] += time.perf_counter() - started
            return out

    base = load_tokenizer(path, bos_token="<s>", eos_token="</s>")
    return TimedTokenizer(base.backend, base.bos_id, base.eos_id, base.pad_id, False, False)


def run_case(name: str, records: int, groups: int) -> dict:
    """One case in this process; returns its figures."""
    from cookers.records import assemble_records, assemble_stream
    from cookers.records_options import AssemblyOptions

    entry, mode, settings = CASES[name]
    settings = dict(settings)
    window = settings.pop("window", None)
    tokenizer = bench_tokenizer()
    timer = Timed()
    rows = timer.records(group_sizes(records, groups))
    grouping = {"group_by": "customer", "order_by": "day"} if mode != "tabular" else {}
    started = time.perf_counter()
    examples = slots = record_tokens = 0
    if entry == "stream":
        options = AssemblyOptions(mode=mode, max_seq_length=SEQ_LENGTH, **grouping, **settings)
        stream = assemble_stream(rows, tokenizer, options, window=window)
    else:
        stream = iter(
            assemble_records(rows, tokenizer, mode, max_seq_length=SEQ_LENGTH, **grouping, **settings).train
        )
    for example in stream:
        examples += 1
        framing = example.num_prompt_tokens + 2 * max(1, len(example.groups) if mode == "grouped" else 1)
        record_tokens += len(example) - framing
        slots += SEQ_LENGTH
    seconds = time.perf_counter() - started - timer.seconds
    return {
        "case": name,
        "records": records,
        "seconds": seconds,
        "tokenize_seconds": tokenizer.seconds[0],
        "examples": examples,
        "fill": record_tokens / slots if slots else 0.0,
        "tokens_per_record": record_tokens / records,
    }


def _one_core() -> None:
    """Pin this process to one core and keep the tokenizer on it."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        pass


def measure_case(name: str, records: int, groups: int) -> tuple[dict, float]:
    """Run a case in a child process; (its figures, peak RSS of its process tree in MB)."""
    import subprocess

    from tools.measure import measure

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    command = [
        sys.executable,
        "-m",
        "tools.bench_records",
        "--run-case",
        name,
        "--records",
        str(records),
        "--groups",
        str(groups),
    ]
    with open(CACHE / f"records-{name}-{records}.json", "w+b") as out:
        measurement, errors = measure(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.PIPE)
        out.seek(0)
        text = out.read().decode()
    if measurement.returncode != 0:
        raise SystemExit(f"case {name} failed:\n{errors.decode()[-3000:]}")
    return json.loads(text.strip().splitlines()[-1]), measurement.peak_tree_rss_mb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000, help="records at the full size")
    parser.add_argument("--groups", type=int, default=20_000, help="groups at the full size")
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--no-flatness", action="store_true", help="skip the runs at a tenth of the size")
    parser.add_argument("--run-case", choices=sorted(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_case:
        _one_core()
        print(json.dumps(run_case(args.run_case, args.records, args.groups)))
        return 0

    CACHE.mkdir(parents=True, exist_ok=True)
    bench_tokenizer()  # trained once, before any case is timed
    print(
        f"## Record assembly: {args.records:,} records in {args.groups:,} groups, L = {SEQ_LENGTH}, one core each"
    )
    print("   (stream: assemble_stream, the load-time path; whole: assemble_records, the reference's pass)\n")
    header = (
        f"{'case':<24} {'records':>9} {'rec/s':>9} {'w/o tok':>9} {'tokenizer':>9} {'examples':>9} "
        f"{'fill':>7} {'tok/rec':>7} {'peak RSS':>9}"
    )
    print(header)
    results: dict[tuple[str, int], dict] = {}
    sizes = [(args.records, args.groups)]
    if not args.no_flatness:
        sizes.append((max(1, args.records // 10), max(1, args.groups // 10)))
    for name in args.cases:
        for records, groups in sizes:
            if records != args.records and name not in FLATNESS_CASES:
                continue
            figures, rss = measure_case(name, records, groups)
            figures["rss_mb"] = rss
            results[(name, records)] = figures
            plain = figures["seconds"] - figures["tokenize_seconds"]
            print(
                f"{name:<24} {records:>9,} {records / figures['seconds']:>9,.0f} {records / plain:>9,.0f} "
                f"{records / figures['tokenize_seconds']:>9,.0f} {figures['examples']:>9,} {100 * figures['fill']:>6.2f}% {figures['tokens_per_record']:>7.1f} "
                f"{rss:>7.0f} MB",
                flush=True,
            )

    print("\n## Best-fit against next-fit (same records, same window)\n")
    for base, best in (
        ("stream-tabular-nocap", "stream-tabular-bestfit"),
        ("stream-grouped", "stream-grouped-bestfit"),
        ("stream-grouped", "stream-grouped-exact"),
    ):
        a, b = results.get((base, args.records)), results.get((best, args.records))
        if a and b:
            fewer = a["examples"] - b["examples"]
            print(
                f"{best:<24} {b['examples']:>9,} examples against {a['examples']:,} ({base}): {fewer:,} fewer"
                f" ({100 * fewer / a['examples']:.1f}%), fill {100 * a['fill']:.2f}% -> {100 * b['fill']:.2f}%"
            )

    print("\n## Memory against the number of records\n")
    for name in FLATNESS_CASES:
        small, large = results.get((name, max(1, args.records // 10))), results.get((name, args.records))
        if small and large:
            print(
                f"{name:<24} {small['rss_mb']:>7.0f} MB at {small['records']:,} records, "
                f"{large['rss_mb']:>7.0f} MB at {large['records']:,}"
            )
    target = 200_000
    print(
        f"\nTarget (issue 12): {target:,} records/s per core after tokenization, memory flat in the number of"
        " records. NeMo Safe Synthesizer is not installed here (it needs datasets, transformers, pandas,"
        " scikit-learn and pinned vllm/torch builds), so it is not run alongside."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
