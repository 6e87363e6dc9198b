"""End-to-end speed: the library's DLRM training step against TorchRec's DLRM, pretraining steps
against the supervised step, validation lookups and serving against FP32, in one run.

    python benchmarks/end_to_end.py [--quick] [--threads 1,2] [--batches 4096,16384]
        [--skip-ssl] [--skip-serving] --json OUT.json

``--quick`` is a smoke run that passes every code path once in well under a minute: one
thread, batch 256, 1,000-row tables, three rounds, of the pretraining configs only
:data:`benchmarks._e2e_ssl.QUICK_CONFIGS`, every part in one fresh process; its figures mean
nothing.

Training (``benchmarks/_e2e_models.py``): the shipped Criteo DLRM (26 Criteo-Kaggle-shaped
tables capped at 250k rows as in ``embedding.py``, D = 64, bottom 512-256-64, top 512-256-1,
row-wise Adagrad on the tables, Adam on the dense part) as a ``CTRModule`` with FP32, INT8 + 5%
cache and INT4 + 1% cache tables, and as ``torchrec.models.dlrm.DLRM`` over FBGEMM's fused
row-wise Adagrad tables, at batch 4096 and 16384. Each thread count runs in a fresh process
(glibc malloc settings of the ``ssl-rec`` command, ``MALLOC_ENV``); the models take turns
step by step in an order rotated each round, after a warm-up; a ratio is the median of the
per-round ratios (> 1: the library faster). A per-phase breakdown (data, tables forward, MLPs,
interaction, dense backward, table update, optimizer) times one more pass per model with the
tables' output detached. The validation lookup of each table format (eval mode, no grad) is
timed the same way against the FP32 tables.

Pretraining (``benchmarks/_e2e_ssl.py``): every ``configs/pretrain/*.yaml`` and the supervised
``configs/ctr/synthetic.yaml`` fitted by the Trainer on the same backbone and batch; step time
ratio and a breakdown (views, lookups, encoder passes, momentum encoder, backward).

Serving (``benchmarks/_e2e_serving.py``): the trained FP32-table model exported for inference
in FP32 and quantized as ``ssl-rec quantize`` builds it when every unit may go to INT8 (INT8
tables, FBGEMM INT8 Linear layers but the tiny click unit), samples/s at batch 1, 16 and 4096
on one thread; other plans (INT8 / INT4 tables alone, bfloat16 layers) beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

if not __package__:  # `python benchmarks/end_to_end.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks._e2e_models import FORMATS
from benchmarks._embedding_cases import Cycle, median_ratio, reexec_with_memory_env, timed_rounds
from benchmarks._fresh_process import run_in_fresh_process
from benchmarks._harness import Figure, Recording, benchmark_parser, ratio_bars

NUM_BATCHES = 4  # distinct batches each model cycles over
ROUNDS, QUICK_ROUNDS = 10, 3  # training rounds at batch <= 4096
FULL_SSL, QUICK_SSL = (12, 4096), (3, 128)  # pretraining: (steps, batch)


def measure_training(cap: int, batches: list[int], threads: int, rounds: int, quick: bool) -> dict:
    """Training steps, phase breakdowns and eval lookups at one thread count (fresh process)."""
    import torch

    from benchmarks._e2e_models import LibraryDLRM, TorchRecDLRM, make_raw, phase_breakdown
    from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES

    torch.set_num_threads(threads)
    cards = [min(c, cap) for c in CRITEO_KAGGLE_CARDINALITIES]
    models = {fmt: LibraryDLRM(cards, fmt) for fmt in FORMATS}
    models["torchrec"] = TorchRecDLRM(cards)
    out: dict = {}
    for batch in batches:
        raws = [make_raw(cards, batch, seed) for seed in range(NUM_BATCHES)]
        n = rounds if batch <= 4096 else max(3, (rounds * 2) // 3)
        load = os.getloadavg()[0]
        # every model's Cycle is at the same batch in a round (same number of calls before)
        times = timed_rounds({k: Cycle(m.step, raws) for k, m in models.items()}, n, warmup=2)
        lookups = {fmt: Cycle(models[fmt].eval_lookup, raws) for fmt in FORMATS}
        eval_times = timed_rounds(lookups, 3 * n, warmup=NUM_BATCHES)
        passes = 1 if quick or batch > 4096 else 2
        out[str(batch)] = {
            "samples_per_s": {k: batch / statistics.median(v) for k, v in times.items()},
            "spread": {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()},
            "vs_torchrec": {f: median_ratio(times, "torchrec", f) for f in FORMATS},
            "vs_library_fp32": {f: median_ratio(times, "fp32", f) for f in FORMATS[1:]},
            "eval_lookup_samples_per_s": {
                k: batch / statistics.median(v) for k, v in eval_times.items()
            },
            "eval_lookup_vs_fp32": {f: median_ratio(eval_times, "fp32", f) for f in FORMATS[1:]},
            "breakdown_ms": phase_breakdown(models, raws[:3], passes),
            "rounds": n,
            "load_average": [load, os.getloadavg()[0]],
        }
    return {"threads": threads, "batches": out}


def parse_args() -> argparse.Namespace:
    """Command-line arguments."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--threads", default=None, help="default 1,2 (--quick: 1)")
    parser.add_argument("--batches", default=None, help="default 4096,16384 (--quick: 256)")
    parser.add_argument("--skip-ssl", action="store_true", help="no pretraining step ratios")
    parser.add_argument("--skip-serving", action="store_true", help="no serving comparison")
    args = parser.parse_args()
    try:
        threads = args.threads or ("1" if args.quick else "1,2")
        args.threads = [int(t) for t in threads.split(",") if t.strip()]
        batches = args.batches or ("256" if args.quick else "4096,16384")
        args.batches = [int(b) for b in batches.split(",") if b.strip()]
    except ValueError as e:
        parser.error(f"--threads / --batches take comma-separated integers ({e})")
    if not args.threads or min(args.threads) < 1 or not args.batches or min(args.batches) < 1:
        parser.error("--threads and --batches need positive integers")
    return args


def assemble(training: list[dict]) -> dict:
    """The headline keys of the training part: ``{"<format>_<threads>t<batch>": ratio}``."""
    train, evals = {}, {}
    for run in training:
        for batch, res in run["batches"].items():
            setting = f"{run['threads']}t{batch}"
            for fmt, ratio in res["vs_torchrec"].items():
                train[f"{fmt}_{setting}"] = ratio
            for fmt, ratio in res["eval_lookup_vs_fp32"].items():
                evals[f"{fmt}_{setting}"] = ratio
    return {"train_vs_torchrec_dlrm": train, "eval_lookup_by_setting": evals}


def headline_eval(training: list[dict]) -> dict[str, float]:
    """``{format: ratio}``: the median over every thread count and batch size measured."""
    by_format: dict[str, list[float]] = {}
    for run in training:
        for res in run["batches"].values():
            for fmt, ratio in res["eval_lookup_vs_fp32"].items():
                by_format.setdefault(fmt, []).append(ratio)
    return {fmt: statistics.median(v) for fmt, v in by_format.items()}


def plot(results: dict) -> Figure:
    """Bars of every headline ratio (> 1: the library / the quantized model / faster)."""
    labels, values = [], []
    for key in ("train_vs_torchrec_dlrm", "eval_lookup_vs_fp32", "serve_vs_fp32"):
        for name, v in results.get(key, {}).items():
            labels.append(f"{key}: {name}")
            values.append(v)
    for name, v in results.get("ssl_step_vs_supervised", {}).items():
        labels.append(f"ssl_step_vs_supervised: {name} (lower is cheaper)")
        values.append(v)
    return ratio_bars(labels, values, "ratio", width=9, row_height=0.3)


def measure_quick(
    cap: int, batches: list[int], threads: list[int], ssl: bool, serving: bool
) -> dict:
    """``--quick``: every part in this one process (a smoke run pays the imports once)."""
    from benchmarks._e2e_serving import measure_serving
    from benchmarks._e2e_ssl import measure_ssl

    out: dict = {
        "training": [measure_training(cap, batches, t, QUICK_ROUNDS, True) for t in threads]
    }
    if ssl:
        out["ssl"] = measure_ssl(1, *QUICK_SSL, True)
    if serving:
        out["serving"] = measure_serving(cap, True)
    return out


def measure_parts(args: argparse.Namespace, cap: int) -> dict:
    """``{"training": [per thread count], "ssl": ..., "serving": ...}``, each part (each thread
    count) in a fresh process."""
    from benchmarks._e2e_serving import measure_serving
    from benchmarks._e2e_ssl import measure_ssl

    ssl, serving = not args.skip_ssl, not args.skip_serving
    if args.quick:
        return run_in_fresh_process(
            measure_quick, cap, args.batches, args.threads, ssl, serving, quiet=False
        )  # fmt: skip
    out: dict = {
        "training": [
            run_in_fresh_process(measure_training, cap, args.batches, t, ROUNDS, False, quiet=False)
            for t in args.threads
        ]
    }
    if ssl:
        out["ssl"] = run_in_fresh_process(measure_ssl, 1, *FULL_SSL, False, quiet=False)
    if serving:
        out["serving"] = run_in_fresh_process(measure_serving, cap, False, quiet=False)
    return out


def main() -> None:
    """Parse arguments, run every part in fresh processes, print, write JSON + PNG."""
    args = parse_args()
    reexec_with_memory_env(False)
    record = Recording(__file__)
    cap = 1_000 if args.quick else 250_000
    parts = measure_parts(args, cap)
    training = parts["training"]
    results: dict = {
        "config": {
            "table_cap": cap,
            "dim": 64,
            "bottom": [512, 256, 64],
            "top": [512, 256, 1],
            "threads": args.threads,
            "batches": args.batches,
            "rounds": QUICK_ROUNDS if args.quick else ROUNDS,
            "library_step": "CTRModule forward + BCE + backward (fused table update) + Adam; "
            "no Trainer",
            "torchrec_step": "torchrec.models.dlrm.DLRM + FusedEmbeddingBagCollection "
            "(FBGEMM EXACT_ROWWISE_ADAGRAD) + Adam; KeyedJaggedTensor built each step",
        },
        **assemble(training),
        "eval_lookup_vs_fp32": headline_eval(training),
        "training": {f"{run['threads']}t": run["batches"] for run in training},
    }
    if ssl := parts.get("ssl"):
        steps, batch = QUICK_SSL if args.quick else FULL_SSL
        results["ssl_step_vs_supervised"] = ssl["ratios"]
        results["ssl_breakdown_ms"] = ssl["breakdown_ms"]
        results["ssl_config"] = {"threads": 1, "batch": batch, "steps": steps,
                                 "synthetic_data_for": ssl["synthetic_data_instead_of_user_file"],
                                 "errors": ssl["errors"]}  # fmt: skip
    if serving := parts.get("serving"):
        results["serve_vs_fp32"] = serving["ratios"]
        results["serving"] = serving
    for key in ("train_vs_torchrec_dlrm", "eval_lookup_vs_fp32", "serve_vs_fp32",
                "ssl_step_vs_supervised"):  # fmt: skip
        for name, v in results.get(key, {}).items():
            print(f"{key:24s} {name:20s} {v:6.2f}")
    record.write(args.json, results, plot, dpi=90, threads=None)


if __name__ == "__main__":
    main()
