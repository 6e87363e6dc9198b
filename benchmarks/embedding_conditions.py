"""Why a training-step ratio against FBGEMM TBE moves between runs: the FP32 steps of this
library and of TBE (exact SGD, exact row-wise Adagrad) timed under one changed condition
at a time, each in its own process.

    python benchmarks/embedding_conditions.py [--quick] [--rounds 9] --json OUT.json

Conditions: the protocol of benchmarks/embedding.py (``protocol``); no warm-up, the first
cycle of batches timed (``cold``); glibc's default malloc settings (``glibc_default``); two
threads, alone and beside a busy process (``two_threads``, ``two_threads_busy``); one thread
beside a busy process (``one_thread_busy``); FBGEMM without its JIT kernels
(``fbgemm_no_jit``, ``FBGEMM_NO_ASMJIT=1``: TBE's slower configuration). Tables capped at
250k rows (``--quick``: 50k rows, 3 rounds). Writes the JSON and a PNG of the ratios beside it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # `python benchmarks/embedding_conditions.py`: import the package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks._embedding_cases import MALLOC_ENV, Cycle, median_ratio
from benchmarks._fresh_process import run_in_fresh_process
from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot

CONDITIONS = {
    "protocol": {},
    "cold": {"warmup": 0},
    "glibc_default": {"malloc": False},
    "two_threads": {"threads": 2},
    "two_threads_busy": {"threads": 2, "busy": True},
    "one_thread_busy": {"busy": True},
    "fbgemm_no_jit": {"env": {"FBGEMM_NO_ASMJIT": "1"}},
}


def measure(condition: dict, rounds: int, cap: int) -> dict:
    """Run in a fresh process: time the four FP32 steps under ``condition``."""
    import torch

    from benchmarks._embedding_cases import fbgemm_modules, make_batch, ours_step, tbe_step
    from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
    from ssl_rec.hardware import TableSpec

    torch.set_num_threads(condition.get("threads", 1))
    cards = [min(c, cap) for c in CRITEO_KAGGLE_CARDINALITIES]
    fb = fbgemm_modules(cards)
    batches = [make_batch(cards, 4096, seed, "criteo") for seed in range(8)]
    fns = {
        f"tbe_{o}": Cycle(tbe_step(fb[f"train_{o}"]), batches) for o in ("sgd", "rowwise_adagrad")
    }
    for opt in ("sgd", "rowwise_adagrad"):
        fns[f"ours_{opt}"] = Cycle(ours_step(cards, TableSpec("fp32", optimizer=opt))[0], batches)
    warmup = condition.get("warmup", 9)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names, times = list(fns), {k: [] for k in fns}
    for r in range(rounds):
        for name in names[r % 4 :] + names[: r % 4]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {
        "ms_per_step": {k: 1e3 * statistics.median(v) for k, v in times.items()},
        "ours_vs_tbe_sgd": median_ratio(times, "tbe_sgd", "ours_sgd"),
        "ours_vs_tbe_rowwise_adagrad": median_ratio(
            times, "tbe_rowwise_adagrad", "ours_rowwise_adagrad"
        ),
        "tbe_rowwise_adagrad_vs_sgd": median_ratio(times, "tbe_sgd", "tbe_rowwise_adagrad"),
    }


def run_child(name: str, rounds: int, cap: int) -> dict:
    """One condition in a fresh process (malloc settings are read at start-up)."""
    cond = CONDITIONS[name]
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    if cond.get("malloc", True):
        env.update(MALLOC_ENV)
    env.update(cond.get("env", {}))
    busy = None
    if cond.get("busy"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        return run_in_fresh_process(measure, cond, rounds, cap, env=env)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def plot(result: dict) -> Figure:
    """This library's FP32 step speed over TBE's, per condition and optimizer."""
    plt = pyplot()
    names = list(result)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for shift, opt in ((-0.2, "sgd"), (0.2, "rowwise_adagrad")):
        values = [result[n][f"ours_vs_tbe_{opt}"] for n in names]
        ax.bar([i + shift for i in range(len(names))], values, width=0.4, label=opt)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("FP32 step speed, ssl_rec / TBE")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    """Run every condition, print and write the JSON and the PNG."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="default 9 (3 with --quick)")
    args = parser.parse_args()
    record = Recording(__file__)
    rounds = args.rounds or (3 if args.quick else 9)
    cap = 50_000 if args.quick else 250_000
    result = {}
    for name in CONDITIONS:
        load = os.getloadavg()[0]
        result[name] = {**run_child(name, rounds, cap), "load_average": load}
        r = result[name]
        ratios = {k: round(v, 2) for k, v in r.items() if k.startswith(("ours", "tbe"))}
        print(f"{name:18s} {ratios} ms {r['ms_per_step']} load {load:.1f}")
    record.write(args.json, result, plot, threads=None)  # conditions differ in threads


if __name__ == "__main__":
    main()
