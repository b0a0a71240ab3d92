"""Shared-prefix rollout benchmark: speed of folding + packing, fill of the packed sequences against one
group per sequence, and the tokens saved by storing each prompt once.

10,000 seeded groups by default: a prompt of about 500 tokens (lognormal, median 500, sigma 0.2) and 8
completions of lognormal length (median 300, sigma 0.8, cut at 4,096 tokens as a generation limit
would), token ids random. Groups go through what `RolloutTaskEncoder` runs, a packing buffer at a
time (1,000 groups, as energon's `packing_buffer_size`): `fold_shared_prefix_rollouts` for every group,
`plan_rollout_packs` (best-fit decreasing) over the buffer, `concatenate_folded` for every sequence of
at most L = 16,384 tokens. Making the token arrays is outside the timing; groups folding to more than L
tokens are left out and counted.

    python -m tools.bench_rollouts
    python -m tools.bench_rollouts --groups 1000 --seq-length 8192 --completions 4
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from cookers.rollouts import (
    concatenate_folded,
    fold_shared_prefix_rollouts,
    plan_rollout_packs,
    unfolded_length,
)


def group_lengths(
    groups: int,
    completions: int,
    prompt_median: float,
    completion_median: float,
    completion_sigma: float,
    longest: int,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt lengths [G] and completion lengths [G, N], seeded."""
    rng = np.random.default_rng(seed)
    prompts = np.maximum(1, np.rint(rng.lognormal(math.log(prompt_median), 0.2, groups))).astype(np.int64)
    sampled = rng.lognormal(math.log(completion_median), completion_sigma, (groups, completions))
    return prompts, np.clip(np.rint(sampled), 1, longest).astype(np.int64)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench_rollouts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--completions", type=int, default=8, help="completions per group")
    parser.add_argument("--prompt-median", type=float, default=500.0)
    parser.add_argument("--completion-median", type=float, default=300.0)
    parser.add_argument("--completion-sigma", type=float, default=0.8)
    parser.add_argument("--longest", type=int, default=4096, help="cut completions at this many tokens")
    parser.add_argument("--seq-length", type=int, default=16384, help="L: tokens per packed sequence")
    parser.add_argument("--buffer", type=int, default=1000, help="groups per packing buffer")
    args = parser.parse_args(argv)

    prompts, completions = group_lengths(
        args.groups,
        args.completions,
        args.prompt_median,
        args.completion_median,
        args.completion_sigma,
        args.longest,
    )
    folded_lengths = prompts + completions.sum(axis=1)
    fits = folded_lengths <= args.seq_length
    print(
        f"{args.groups:,} groups: prompt median {np.median(prompts):.0f} tokens, {args.completions} completions "
        f"(median {np.median(completions):.0f}, mean {completions.mean():.0f}, max {completions.max()} tokens); "
        f"folded group median {np.median(folded_lengths):.0f}, max {folded_lengths.max()} tokens; "
        f"{int((~fits).sum())} groups fold to more than L = {args.seq_length} and are left out"
    )
    rng = np.random.default_rng(1)
    kept = np.flatnonzero(fits)
    seconds, folded_tokens, unfolded_tokens, packs, supervised = 0.0, 0, 0, 0, 0
    for lo in range(0, len(kept), args.buffer):
        members = kept[lo : lo + args.buffer]
        groups = [
            (
                rng.integers(0, 32000, int(prompts[g]), dtype=np.int32),
                [rng.integers(0, 32000, int(n), dtype=np.int32) for n in completions[g]],
            )
            for g in members
        ]
        started = time.perf_counter()
        folded = [fold_shared_prefix_rollouts(prompt, group) for prompt, group in groups]
        bins = plan_rollout_packs([f.num_tokens for f in folded], args.seq_length)
        sequences = [concatenate_folded([folded[i] for i in members_of_bin]) for members_of_bin in bins]
        seconds += time.perf_counter() - started
        packs += len(sequences)
        folded_tokens += sum(s.num_tokens for s in sequences)
        supervised += sum(int((s.labels != -100).sum()) for s in sequences)
        unfolded_tokens += sum(unfolded_length(len(p), [len(c) for c in group]) for p, group in groups)

    print(f"\n## Folding + packing, buffers of {args.buffer} groups, L = {args.seq_length}\n")
    print(
        f"{seconds:.2f} s: {folded_tokens / seconds / 1e6:.1f} M folded tokens/s, "
        f"{unfolded_tokens / seconds / 1e6:.1f} M unfolded tokens/s (the prompt counted once per completion), "
        f"{len(kept) / seconds:,.0f} groups/s"
    )
    print(f"\n## Fill of sequences of {args.seq_length} tokens\n")
    fill = folded_tokens / (packs * args.seq_length)
    alone = folded_tokens / (len(kept) * args.seq_length)
    offline = plan_rollout_packs(folded_lengths[kept], args.seq_length)
    print(f"packed (BFD per buffer):     {packs:>7,} sequences, fill {100 * fill:6.2f}%")
    print(
        f"packed (BFD, all at once):   {len(offline):>7,} sequences, fill "
        f"{100 * folded_tokens / (len(offline) * args.seq_length):6.2f}%"
    )
    print(
        f"one group per sequence:      {len(kept):>7,} sequences, fill {100 * alone:6.2f}%  "
        f"({len(kept) / packs:.2f}x the sequences of packing)"
    )
    lower_bound = math.ceil(folded_tokens / args.seq_length)
    print(f"lower bound ceil(tokens / L): {lower_bound:>6,} sequences")
    print("\n## Deduplicated prompts\n")
    saved = unfolded_tokens - folded_tokens
    print(
        f"unfolded (prompt before every completion) {unfolded_tokens:,} tokens, folded {folded_tokens:,}: "
        f"{saved:,} tokens saved ({100 * saved / unfolded_tokens:.1f}% of the unfolded layout); "
        f"{supervised:,} supervised targets either way"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
