"""INT8 + 5% cache against the library's FP32 tables as the tables grow: the training step of
the two collections alone in a process, per table-size cap and optimizer.

    python benchmarks/embedding_table_size.py [--quick] [--caps 250000,2000000,full]
        [--batch 4096] --json OUT.json   (also OUT.png)

26 tables with Criteo-Kaggle cardinalities, each capped at the given row count (``full``: no
cap, 33.8M rows, 8.6 GB in FP32; about 12 GB of memory in all), D = 64, Zipf ids, one thread.
Each (cap, optimizer) runs in a fresh process with the protocol of benchmarks/embedding.py
(its malloc settings, a warm-up cycle of the 8 batches per kernel, rounds rotating the two
steps, a ratio = the median of per-round ratios, > 1: INT8 + 5% faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # `python benchmarks/embedding_table_size.py`: import the package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks._embedding_cases import (
    NUM_BATCHES,
    OPTIMIZERS,
    OURS,
    Cycle,
    counters,
    hit_rates,
    median_ratio,
    reexec_with_memory_env,
    timed_rounds,
)
from benchmarks._fresh_process import run_in_fresh_process
from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot

CAPS = "250000,2000000,full"
QUICK_CAPS = "50000"


def measure(cap: int | None, optimizer: str, batch: int, rounds: int) -> dict:
    """Run in a fresh process: both collections' steps at one cap, ``rounds`` rotated rounds."""
    import torch

    from benchmarks._embedding_cases import DIM, make_batch, ours_step
    from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES

    torch.set_num_threads(1)
    cards = [c if cap is None else min(c, cap) for c in CRITEO_KAGGLE_CARDINALITIES]
    start = time.perf_counter()
    built = {kind: ours_step(cards, OURS[kind](optimizer)) for kind in ("int8_cache5", "fp32")}
    build_s = time.perf_counter() - start
    batches = [make_batch(cards, batch, seed, "criteo") for seed in range(NUM_BATCHES)]
    cached = {"int8_cache5": built["int8_cache5"][1]}
    before = counters(cached)
    times = timed_rounds({k: Cycle(step, batches) for k, (step, _) in built.items()}, rounds)
    per_round = [f / q for f, q in zip(times["fp32"], times["int8_cache5"], strict=True)]
    return {
        "rows": sum(cards),
        "fp32_gb": sum(cards) * DIM * 4 / 1e9,
        "ms_per_step": {k: 1e3 * statistics.median(v) for k, v in times.items()},
        "int8_cache5_vs_fp32": median_ratio(times, "fp32", "int8_cache5"),
        "per_round_range": [min(per_round), max(per_round)],
        "hit_rate": hit_rates(cached, before)["int8_cache5"],
        "build_s": build_s,
    }


def run_child(cap: str, optimizer: str, batch: int, rounds: int) -> dict:
    """One (cap, optimizer) in a fresh process: each measures tables built for it alone."""
    return run_in_fresh_process(measure, None if cap == "full" else int(cap), optimizer, batch,
                                rounds)  # fmt: skip


def parse_caps(text: str) -> list[str]:
    """``250000,full`` -> ['250000', 'full'], each a positive row count or ``full``."""
    caps = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in caps if c != "full" and not (c.isdigit() and int(c) > 0)]
    if bad or not caps:
        raise argparse.ArgumentTypeError(
            f"{bad or '(empty)'}: give positive row counts or 'full', comma-separated"
        )
    return caps


def plot(result: dict) -> Figure:
    """Ratio against total rows, one line per optimizer, per-round range as error bars."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for opt in OPTIMIZERS:
        points = sorted((r["rows"], r) for r in result["runs"] if r["optimizer"] == opt)
        x = [p[0] for p in points]
        y = [p[1]["int8_cache5_vs_fp32"] for p in points]
        lo = [v - p[1]["per_round_range"][0] for v, p in zip(y, points, strict=True)]
        hi = [p[1]["per_round_range"][1] - v for v, p in zip(y, points, strict=True)]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, label=opt)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("rows in the 26 tables")
    ax.set_ylabel("INT8 + 5% speed / FP32")
    ax.set_title(f"training step, B = {result['config']['batch']}, one thread")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    """Every (cap, optimizer) in its own process; print, write the JSON and the PNG."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--caps", type=parse_caps, help=f"default {CAPS} ({QUICK_CAPS} quick)")
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--rounds", type=int, help="default 72 (8 with --quick)")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error(f"--batch {args.batch}: must be positive")
    rounds = args.rounds or (8 if args.quick else 72)
    reexec_with_memory_env(all_huge_pages=False)  # the children inherit the settings
    record = Recording(__file__)
    caps = args.caps or parse_caps(QUICK_CAPS if args.quick else CAPS)
    result: dict = {
        "config": {"caps": caps, "batch": args.batch, "rounds": rounds, "threads": 1},
        "runs": [],
    }
    for cap in caps:
        for opt in OPTIMIZERS:
            load = os.getloadavg()[0]
            run = {"cap": cap, "optimizer": opt, **run_child(cap, opt, args.batch, rounds)}
            run["load_average"] = [load, os.getloadavg()[0]]
            result["runs"].append(run)
            lo, hi = run["per_round_range"]
            print(
                f"cap {cap:>8} ({run['rows'] / 1e6:.1f}M rows) {opt:15s} INT8 + 5% / FP32 "
                f"{run['int8_cache5_vs_fp32']:.3f} (rounds {lo:.2f}-{hi:.2f}), ms "
                f"{run['ms_per_step']['int8_cache5']:.2f} / {run['ms_per_step']['fp32']:.2f}, "
                f"hit rate {run['hit_rate']:.2f}"
            )
    record.write(args.json, result, plot, threads=1)


if __name__ == "__main__":
    main()
