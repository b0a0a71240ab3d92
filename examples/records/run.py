"""Safe Synthesizer's three example layouts, assembled at load time inside energon from prepared shards.

    python examples/records/run.py                    # work folder in a temporary directory
    python examples/records/run.py --keep out/        # keep the shards and the tokenizer in out/

1. `shardprep write` turns transactions.csv and sensors.csv into shards, one record per sample, with
   `--group-by COL --group-contiguous`: each customer's (device's) records whole and in order in one shard;
2. a small byte-level BPE tokenizer is trained on the rows (`tools/train_tokenizer.py`, no download);
3. energon's loader runs `RecordAssemblyTaskEncoder` in each mode: tabular and grouped over the
   transactions, sequential over the sensor readings; the first example of each is printed, prompt masked;
4. every mode is checked against `cookers.records.assemble_stream` over the same records in the loader's order;
5. on the guide's sizing data (200 records in 12 groups, ~20 tokens a record, a ~100-token prompt), the
   number of grouped examples with the reference's arithmetic, with `exact_budget=True` and with best-fit.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
warnings.filterwarnings("ignore", message=".*pin_memory.*")

from megatron.energon import Cooker, DefaultTaskEncoder, WorkerConfig, get_loader, get_train_dataset  # noqa: E402

from cookers.energon_records import RecordAssemblyTaskEncoder, cook_record  # noqa: E402
from cookers.records import assemble_records, assemble_stream  # noqa: E402
from cookers.records_options import AssemblyOptions  # noqa: E402
from cookers.tokenizer import TokenizerAdapter, load_tokenizer  # noqa: E402
from tools.train_tokenizer import train_tokenizer  # noqa: E402

#: mode -> (CSV, settings, packing buffer); the buffer counts records (tabular) or groups (grouped). Tabular
#: mode also lets energon's shuffle buffer shuffle the records; the other two must keep groups whole.
MODES = {
    "tabular": ("transactions", {"max_seq_length": 256, "column_types": {"amount": float}}, 64),
    "grouped": (
        "transactions",
        {
            "max_seq_length": 512,
            "group_by": "customer_id",
            "order_by": "date",
            "column_types": {"amount": float},
        },
        8,
    ),
    "sequential": (
        "sensors",
        {
            "max_seq_length": 256,
            "group_by": "device_id",
            "order_by": "timestamp",
            "column_types": {"temp": float},
        },
        None,
    ),
}


class RecordOrder(DefaultTaskEncoder):
    """The cooked records one by one, in the order the loader reads them (for the check in step 4)."""

    cookers = (Cooker(cook_record),)


def shardprep_write(csv_path: Path, out: Path, group_by: str) -> None:
    command = [
        sys.executable,
        "-m",
        "prep",
        "write",
        str(csv_path),
        str(out),
        "--group-by",
        group_by,
        "--group-contiguous",
        "--maxcount",
        "16",
        "--no-progress",
    ]
    print("   $ shardprep write " + shlex.join(command[4:]))
    subprocess.run(command, check=True, cwd=REPO, capture_output=True, text=True)


def load(
    path: Path, encoder: object, buffer: int | None, shuffle: int | None, batch_size: int | None = 4
) -> list:
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    return list(
        get_loader(
            get_train_dataset(
                path,
                worker_config=config,
                batch_size=batch_size,
                shuffle_buffer_size=shuffle,
                max_samples_per_sequence=None,
                parallel_shard_iters=1,
                packing_buffer_size=buffer,
                task_encoder=encoder,
                repeat=False,
            )
        )
    )


def show_first(batch: object, tokenizer: TokenizerAdapter) -> None:
    """The first example of a batch, as text: the masked prompt, then what the model learns to write."""
    ids, labels = batch.input_ids[0, : batch.lengths[0]], batch.labels[0, : batch.lengths[0]]
    prompt = int((labels == -100).sum())
    text = tokenizer.backend.decode(ids.tolist(), skip_special_tokens=False)
    head = tokenizer.backend.decode(ids[:prompt].tolist(), skip_special_tokens=False)
    print(f"   prompt (masked, {prompt} tokens): {head!r}")
    for line in text[len(head) :].replace("<s>", "<s>\n").splitlines():
        print(f"      {line}")


def run_modes(work: Path, tokenizer: TokenizerAdapter) -> None:
    for mode, (name, settings, buffer) in MODES.items():
        settings = dict(settings)
        types = settings.pop("column_types")
        shuffle = 32 if mode == "tabular" else None
        print(f"\n{mode}: {name}.csv, packing buffer {buffer}, shuffle buffer {shuffle}")
        encoder = RecordAssemblyTaskEncoder(tokenizer, mode, column_types=types, **settings)
        batches = load(work / name, encoder, buffer, shuffle)
        examples = sum(len(b.lengths) for b in batches)
        records = sum(sum(b.num_records) for b in batches)
        tokens = sum(sum(b.lengths) for b in batches)
        show_first(batches[0], tokenizer)
        print(
            f"   {examples} examples, {records} records, {tokens} tokens"
            f" ({100 * tokens / (examples * settings['max_seq_length']):.1f}% of {examples} x max_seq_length)"
        )
        order = load(work / name, RecordOrder(), None, shuffle, batch_size=None)
        rows = [{k: types[k](v) if k in types else v for k, v in s.record.items()} for s in order]
        expected = [
            e.input_ids.tolist()
            for e in assemble_stream(rows, tokenizer, AssemblyOptions(mode=mode, **settings), window=buffer)
        ]
        got = [b.input_ids[i, :n].tolist() for b in batches for i, n in enumerate(b.lengths)]
        print(f"   the same examples as assemble_stream over the loader's records: {got == expected}")
        assert got == expected


def char_tokenizer() -> TokenizerAdapter:
    """One token per character (id = code point; BOS 2, EOS 3), so a record of n characters is n tokens."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({chr(i): i for i in range(128)}, unk_token="\x00"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    return TokenizerAdapter(backend, bos_id=2, eos_id=3)


def guide_sizing() -> None:
    """The guide's grouped sizing example: 200 records in 12 groups, ~20 tokens a record, ~100-token prompt."""
    import numpy as np

    weights = np.random.default_rng(0).integers(9, 26, 12)
    bounds = np.round(np.cumsum(weights) / weights.sum() * 200).astype(int)
    group_of = np.searchsorted(bounds, np.arange(200), side="right")
    # '{"id":"g00","n":00}\n' is 20 characters: 20 tokens for the character tokenizer.
    records = [{"id": f"g{g:02d}", "n": int(i % 100)} for i, g in enumerate(group_of)]
    worst = [{"id": f"g{i // 80:02d}", "n": i % 80} for i in range(12 * 80)]  # the guide's 80-record groups
    tokenizer = char_tokenizer()
    print("\nexact_budget and best_fit on the guide's sizing data (grouped mode, groups shuffled, seed 0):")
    print(f"   {'data':<24} {'L':>6} {'max/ex':>6} {'reference':>9} {'exact':>6} {'best-fit':>8}")
    for label, rows in (("200 records, 12 groups", records), ("12 groups of 80 records", worst)):
        for length in (12_288, 4_096):
            for cap in (5, None):
                counts = []
                for extra in ({}, {"exact_budget": True}, {"packing": "best_fit"}):
                    result = assemble_records(
                        rows,
                        tokenizer,
                        "grouped",
                        max_seq_length=length,
                        max_sequences_per_example=cap,
                        group_by="id",
                        prompt_template="[INST] {instruction} {schema} [/INST]{prefill}",
                        instruction="Generate a JSONL dataset with the following columns and values: ",
                        **extra,
                    )
                    counts.append(len(result.train))
                prompt = result.layout.prompt_tokens
                print(
                    f"   {label:<24} {length:>6} {cap or '-':>6} {counts[0]:>9} {counts[1]:>6} {counts[2]:>8}"
                    + (f"   (prompt {prompt} tokens)" if length == 12_288 and cap == 5 else "")
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.keep is None:
        with tempfile.TemporaryDirectory(prefix="shardprep-records-") as folder:
            return run(Path(folder))
    args.keep.mkdir(parents=True, exist_ok=True)
    status = run(args.keep)
    print(f"\noutputs in {args.keep}")
    return status


def run(work: Path) -> int:
    """The whole example in `work`."""

    print("1. the CSVs to prepared shards, each group whole in one shard")
    shardprep_write(HERE / "transactions.csv", work / "transactions", "customer_id")
    shardprep_write(HERE / "sensors.csv", work / "sensors", "device_id")

    print("2. a small byte-level BPE tokenizer trained on the rows")
    texts = []
    for name in ("transactions", "sensors"):
        with open(HERE / f"{name}.csv", newline="") as file:
            texts += [str(row) for row in csv.DictReader(file)]
    train_tokenizer(texts * 4, vocab_size=500).save(str(work / "tokenizer.json"))
    tokenizer = load_tokenizer(work / "tokenizer.json", bos_token="<s>", eos_token="</s>")

    print("3./4. each mode through energon's loader, checked against assemble_stream")
    run_modes(work, tokenizer)
    guide_sizing()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
