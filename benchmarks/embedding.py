"""Embedding kernels benchmark: this library's INT8/INT4 cached training step, validation
lookup and inference lookups against its own FP32 tables, FBGEMM's table-batched embeddings
(TBE, fbgemm-gpu-cpu) and torch's FBGEMM row-wise quantized ops, side by side in one run.

    python benchmarks/embedding.py [--quick] [--configs 1t4096,uniform] [--training-only]
        --json OUT.json

26 tables with Criteo-Kaggle cardinalities (capped), D = 64, one id per table and sample,
batches 4096 and 16384, ids at Criteo-like (Zipf) and uniform skew. Protocol, the same for
every kernel (see docs/hardware.md, "Measuring"): the script re-executes itself once with
fixed glibc malloc settings (no kernel pays page faults for fresh outputs); each kernel
first runs a full cycle of the 8 batches (every page it will touch is mapped, FBGEMM's JIT
kernels are generated); then rounds call every kernel once, in an order rotated each
round; a ratio is the median of per-round ratios (> 1: this library faster). The thread
count is set for all kernels at once, and the load average is recorded beside each config.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

if not __package__:  # `python benchmarks/embedding.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from benchmarks import _embedding_cases as cases
from benchmarks._embedding_cases import (
    Cycle,
    DenseStep,
    counters,
    embedding_bag_step,
    eval_step,
    fbgemm_modules,
    hit_rates,
    lookup_fns,
    make_batch,
    median_ratio,
    ours_step,
    reexec_with_memory_env,
    tbe_step,
    timed_rounds,
)
from benchmarks._harness import Figure, Recording, benchmark_parser, ratio_bars
from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.hardware.freed_memory import MALLOC_ENV  # what the ssl-rec command asks for
from ssl_rec.hardware.kernels.dispatch import get_kernels

# name -> (result section, batch, threads, skew); ``--configs`` picks a subset.
CONFIGS = {
    "1t4096": ("one_thread", 4096, 1, "criteo"),
    "2t4096": ("two_threads", 4096, 2, "criteo"),
    "1t16384": ("one_thread", 16384, 1, "criteo"),
    "2t16384": ("two_threads", 16384, 2, "criteo"),
    "uniform": ("uniform_skew", 4096, 1, "uniform"),
}


def build_steps(cards: list[int], fb: dict | None) -> tuple[dict[str, Callable], dict]:
    """Every training step (name -> step(batch)) and this library's collections by name."""
    steps: dict[str, Callable] = {"embeddingbag_sgd": embedding_bag_step(cards)}
    colls = {}
    for kind, spec in cases.OURS.items():
        for opt in cases.OPTIMIZERS:
            steps[f"ours_{kind}_{opt}"], colls[f"{kind}_{opt}"] = ours_step(cards, spec(opt))
    if fb:
        for opt in cases.OPTIMIZERS:
            steps[f"fbgemm_tbe_{opt}"] = tbe_step(fb[f"train_{opt}"])
    return steps, colls


def ratios(t: dict[str, list[float]]) -> dict[str, object]:
    """Headline ratios (> 1: this library faster) from one set of interleaved timings."""
    out: dict[str, object] = {}
    for bits in (8, 4):
        if f"int{bits}_ours" in t:
            out[f"int{bits}_lookup_vs_torch_fbgemm"] = median_ratio(
                t, f"int{bits}_torch_fbgemm", f"int{bits}_ours"
            )
        if f"int{bits}_fbgemm_tbe" in t:
            out[f"int{bits}_lookup_vs_fbgemm_tbe"] = median_ratio(
                t, f"int{bits}_fbgemm_tbe", f"int{bits}_ours"
            )
    for kind in ("int8_cache5", "int4_cache1"):
        if f"eval_{kind}" in t:
            out[f"eval_lookup_{kind}_vs_ours_fp32"] = median_ratio(t, "eval_fp32", f"eval_{kind}")
        out[f"train_{kind}_vs_ours_fp32"] = {
            opt: median_ratio(t, f"ours_fp32_{opt}", f"ours_{kind}_{opt}")
            for opt in cases.OPTIMIZERS
        }
    if "fbgemm_tbe_sgd" in t:
        out["train_vs_fbgemm_tbe"] = {
            f"{kind}_{opt}": median_ratio(t, f"fbgemm_tbe_{opt}", f"ours_{kind}_{opt}")
            for kind in cases.OURS
            for opt in cases.OPTIMIZERS
        }
        out["fbgemm_tbe_rowwise_adagrad_vs_sgd"] = median_ratio(
            t, "fbgemm_tbe_sgd", "fbgemm_tbe_rowwise_adagrad"
        )
    if "embeddingbag_sgd" in t:
        out["train_int8_cache5_sgd_vs_embeddingbag_sgd"] = median_ratio(
            t, "embeddingbag_sgd", "ours_int8_cache5_sgd"
        )
    for mode in ("inline", "background"):
        if f"dense_{mode}" in t:
            out[f"dense_step_prefetch_{mode}_vs_none"] = median_ratio(
                t, "dense_none", f"dense_{mode}"
            )
    return out


def breakdown(steps: dict, batches: list[dict], passes: int = 5) -> dict[str, dict]:
    """CPU milliseconds per step in each kernel phase (compiled kernels' counters), per case.

    The step total is the calling thread's CPU time too (one thread: every phase runs on
    it), so time the thread spends descheduled on a loaded machine counts nowhere. The cases
    take turns, one pass of the 8 batches each, and every figure is the median over
    ``passes`` passes: a burst of load then moves one pass, not one case.
    """
    ext = getattr(get_kernels(), "_ext", None)
    if ext is None:
        return {}
    names = ("int8_cache5_rowwise_adagrad", "int4_cache1_rowwise_adagrad", "fp32_rowwise_adagrad")
    cycles = {name: Cycle(steps[f"ours_{name}"], batches) for name in names}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(passes):
        for name in names:
            ext.phase_seconds(on=True, reset=True)
            start = time.thread_time()
            for _ in range(cases.NUM_BATCHES):
                cycles[name]()
            total = time.thread_time() - start
            phases = ext.phase_seconds(on=False, reset=True)
            ms = {k: 1e3 * v / cases.NUM_BATCHES for k, v in phases.items()}
            ms["step_total"] = 1e3 * total / cases.NUM_BATCHES
            ms["outside_kernels"] = ms["step_total"] - sum(
                v for k, v in ms.items() if k != "step_total"
            )
            runs[name].append(ms)
    return {
        name: {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        for name in names
    }


def run_config(cards, batch, threads, skew, rounds, fb, steps, colls, extra=True) -> dict:
    """Time the kernels at one batch size, thread count and id skew."""
    torch.set_num_threads(threads)
    batches = [make_batch(cards, batch, seed, skew) for seed in range(cases.NUM_BATCHES)]
    fns: dict[str, Callable] = {}
    if extra:
        fns.update(lookup_fns(cards, batches[0]["ids"], get_kernels(), fb))
        for kind in cases.OURS:
            fns[f"eval_{kind}"] = Cycle(eval_step(colls[f"{kind}_sgd"]), batches)
    fns.update(
        {k: Cycle(s, batches) for k, s in steps.items() if skew == "criteo" or "bag" not in k}
    )
    if extra and batch == 4096:
        for mode in ("none", "inline", "background"):
            fns[f"dense_{mode}"] = Cycle(
                DenseStep(cards, cases.OURS["int8_cache5"]("sgd"), mode), batches, True
            )
    before, load = counters(colls), os.getloadavg()[0]
    times = timed_rounds(fns, rounds)
    result = {
        "samples_per_s": {k: batch / statistics.median(v) for k, v in times.items()},
        "spread": {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()},
        "ratios": ratios(times),
        "hit_rate": hit_rates(colls, before),
        "load_average": [load, os.getloadavg()[0]],
    }
    if threads == 1:
        result["breakdown_ms"] = breakdown(steps, batches)
    return result


def environment(fb: dict | None) -> dict:
    """What the figures depend on beyond the code: CPU, ISA, versions, memory settings."""
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    model = next(
        (ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), ""
    )
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    kernels = get_kernels()
    fbgemm_version = None
    if fb:
        import fbgemm_gpu

        fbgemm_version = fbgemm_gpu.__version__
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "isa": [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni") if f in flags],
        "kernels": type(kernels).__name__,
        "simd_variant": getattr(kernels, "simd", "reference"),
        "torch": torch.__version__,
        "fbgemm_gpu": fbgemm_version,
        "fbgemm_env": {k: v for k, v in os.environ.items() if k.startswith("FBGEMM_")},
        "transparent_hugepages": thp.read_text().strip() if thp.exists() else None,
        "malloc": MALLOC_ENV,
        # 1: every PyTorch allocation of >= 2 MiB on huge pages (--all-huge-pages); else only
        # ssl_rec's own table buffers ask for them (ssl_rec.hardware.huge_pages)
        "thp_mem_alloc_enable": os.environ.get(cases.THP_ENV, "0"),
    }


def plot(result: dict) -> Figure:
    """Bar chart of the 1-thread ratios at B = 4096, both skews."""
    labels, values = [], []
    shown = [("criteo", result.get("one_thread", {}).get("4096")),
             ("uniform", result.get("uniform_skew"))]  # fmt: skip
    for title, res in ((t, r) for t, r in shown if r is not None):
        for key, val in res["ratios"].items():
            for sub, v in val.items() if isinstance(val, dict) else [("", val)]:
                labels.append(f"{title} {key} {sub}".strip())
                values.append(v)
    xlabel = "speed ratio, 1 thread, B = 4096 (>1: ssl_rec faster)"
    return ratio_bars(labels, values, xlabel, width=10, row_height=0.28)


def print_table(result: dict) -> None:
    """Samples/s and ratios as a plain table."""
    for mode in ("one_thread", "two_threads"):
        for batch, res in result.get(mode, {}).items():
            _print_config(f"{mode}, batch {batch}, criteo skew", res)
    if "uniform_skew" in result:
        _print_config("one_thread, batch 4096, uniform skew", result["uniform_skew"])


def _print_config(title: str, res: dict) -> None:
    print(f"\n[{title}] load average {res['load_average']}")
    for k, v in sorted(res["samples_per_s"].items()):
        print(f"  {k:36s} {v:14,.0f} samples/s   spread {res['spread'][k]:.2f}")
    for k, v in res["ratios"].items():
        print(f"  {k:44s} {v}")
    print(f"  hit rates {res['hit_rate']}")
    for name, ms in res.get("breakdown_ms", {}).items():
        print(f"  breakdown {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in ms.items()))


def parse_args() -> argparse.Namespace:
    """Command-line arguments (``--configs`` checked against :data:`CONFIGS`)."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {','.join(CONFIGS)} (default: all)",
    )
    parser.add_argument(
        "--all-huge-pages",
        action="store_true",
        help=f"run with {cases.THP_ENV}=1: every tensor of >= 2 MiB on huge pages, FBGEMM's too",
    )
    parser.add_argument(
        "--training-only",
        action="store_true",
        help="time the training steps only (no lookups, no embedding + MLP steps)",
    )
    args = parser.parse_args()
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or not args.configs:
        parser.error(f"--configs {unknown or '(empty)'}: allowed are {list(CONFIGS)}")
    return args


def main() -> None:
    """Parse arguments, run, print, write JSON + PNG."""
    args = parse_args()
    reexec_with_memory_env(args.all_huge_pages)
    record = Recording(__file__)
    cap = 50_000 if args.quick else 250_000
    cards = [min(c, cap) for c in CRITEO_KAGGLE_CARDINALITIES]
    rounds = 5 if args.quick else 15
    fb = fbgemm_modules(cards)
    steps, colls = build_steps(cards, fb)
    result: dict = {
        "config": {
            "cardinalities": cards,
            "dim": 64,
            "batches": cases.NUM_BATCHES,
            "rounds": rounds,
            "configs": args.configs,
            "training_only": args.training_only,
            "ids": {"criteo": "Zipf(1.1) ranks hashed over each table", "uniform": "uniform"},
            "timing": "warm-up cycle per kernel, rotated interleaved rounds, median ratio",
        },
        "environment": environment(fb),
    }
    for name in args.configs:
        section, batch, threads, skew = CONFIGS[name]
        extra = skew == "criteo" and not args.training_only
        n = rounds if threads == 1 else max(3, rounds // 3)
        res = run_config(cards, batch, threads, skew, n, fb, steps, colls, extra=extra)
        if section == "uniform_skew":
            result[section] = res
        else:
            result.setdefault(section, {})[str(batch)] = res
    print_table(result)
    threads = {CONFIGS[name][2] for name in args.configs}
    record.write(args.json, result, plot, dpi=90,
                 threads=threads.pop() if len(threads) == 1 else None)  # fmt: skip


if __name__ == "__main__":
    main()
