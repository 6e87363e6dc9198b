"""Why a training-step ratio against FBGEMM TBE moves between runs: the FP32 steps of this
library and of TBE (exact SGD, exact row-wise Adagrad) timed under one changed condition
at a time, each in its own process.

    python benchmarks/embedding_conditions.py --json OUT.json

Conditions: the protocol of benchmarks/embedding.py (``protocol``); no warm-up, the first
cycle of batches timed (``cold``); glibc's default malloc settings (``glibc_default``); two
threads, alone and beside a busy process (``two_threads``, ``two_threads_busy``); one thread
beside a busy process (``one_thread_busy``); FBGEMM without its JIT kernels
(``fbgemm_no_jit``, ``FBGEMM_NO_ASMJIT=1``: TBE's slower configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONDITIONS = {
    "protocol": {},
    "cold": {"warmup": 0},
    "glibc_default": {"malloc": False},
    "two_threads": {"threads": 2},
    "two_threads_busy": {"threads": 2, "busy": True},
    "one_thread_busy": {"busy": True},
    "fbgemm_no_jit": {"env": {"FBGEMM_NO_ASMJIT": "1"}},
}


def measure(condition: dict, rounds: int) -> dict:
    """Run inside the child: time the four FP32 steps under ``condition``."""
    import torch
    from _embedding_cases import fbgemm_modules, make_batch, ours_step, tbe_step
    from embedding import Cycle, median_ratio

    from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
    from ssl_rec.hardware import TableSpec

    torch.set_num_threads(condition.get("threads", 1))
    cards = [min(c, 250_000) for c in CRITEO_KAGGLE_CARDINALITIES]
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


def run_child(name: str, rounds: int) -> dict:
    """One condition in a fresh process (malloc settings are read at start-up)."""
    from embedding import MALLOC_ENV

    cond = CONDITIONS[name]
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_ENV}
    if cond.get("malloc", True):
        env.update(MALLOC_ENV)
    env.update(cond.get("env", {}))
    busy = None
    if cond.get("busy"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        cmd = [sys.executable, __file__, "--child", name, "--rounds", str(rounds)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run every condition, print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="output JSON path")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(CONDITIONS[args.child], args.rounds)))
        return
    from ssl_rec._io import atomic_write_json

    result = {}
    for name in CONDITIONS:
        load = os.getloadavg()[0]
        result[name] = {**run_child(name, args.rounds), "load_average": load}
        r = result[name]
        ratios = {k: round(v, 2) for k, v in r.items() if k.startswith(("ours", "tbe"))}
        print(f"{name:18s} {ratios} ms {r['ms_per_step']} load {load:.1f}")
    if args.json:
        atomic_write_json(args.json, result)


if __name__ == "__main__":
    main()
