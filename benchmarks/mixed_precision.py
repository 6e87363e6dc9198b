"""Accuracy/memory study of low-precision embedding storage on the synthetic CTR task.

    python benchmarks/mixed_precision.py [--quick] [--dim 64] [--seeds 0 1 2] --json OUT.json

Trains the synthetic CTR model of ``configs/ctr/synthetic.yaml`` (DLRM, row-wise Adagrad
tables, Adam 1e-3 for the dense part) at embedding dimension ``--dim`` once per storage
variant and seed, on the same data per seed, and reports validation and test AUC, test
logloss (mean ± std over seeds and the paired gap to FP32), embedding memory with and
without the row-wise Adagrad state, and cache hit rates per table. The cached tables run
with the default admission count (2: a miss enters the cache when its batch looks it up
twice) and with every miss admitted (``_admit_every_miss``); the default is judged on
validation AUC. Every field has at least ``--min-cardinality`` ids, so every table is
larger than its cache (the study reports any that is not). Power check: INT2 with
round-to-nearest and no cache must lose more than the seed spread, else the study cannot
tell precisions apart and says so.
Acceptance (Yang et al., 2020, https://arxiv.org/abs/2010.11305): INT8 + 5% cache within
0.001 test AUC of FP32 (mean over seeds), INT4 + 1% cache within 0.003.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if not __package__:  # `python benchmarks/mixed_precision.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from benchmarks._harness import Figure, Recording, benchmark_parser, chosen_seeds, pyplot
from ssl_rec.cli import instantiate
from ssl_rec.hardware import TableSpec

CONFIG = Path(__file__).resolve().parents[1] / "configs/ctr/synthetic.yaml"

VARIANTS: list[tuple[str, TableSpec]] = [
    ("fp32", TableSpec("fp32")),
    ("int8_nearest_nocache", TableSpec("int8", 0.0, stochastic_rounding=False)),
    ("int8_sr_nocache", TableSpec("int8", 0.0)),
    ("int8_cache5_lru", TableSpec("int8", 0.05, "lru")),
    ("int8_cache5_lru_admit_every_miss", TableSpec("int8", 0.05, "lru", admission_count=1)),
    ("int8_cache5_lfu", TableSpec("int8", 0.05, "lfu")),
    ("int4_cache1_lru", TableSpec("int4", 0.01, "lru")),
    ("int4_cache1_lru_admit_every_miss", TableSpec("int4", 0.01, "lru", admission_count=1)),
    ("int2_nearest_nocache", TableSpec("int2", 0.0, stochastic_rounding=False)),
]
POWER_CHECK = "int2_nearest_nocache"


def run_variant(name: str, spec: TableSpec, setup: dict, seed: int) -> dict:
    """Train and test one storage variant with one seed; return its ``rows`` entry."""
    tables = "--model.init_args.backbone.init_args.tables"
    synthetic = "--data.init_args.synthetic"
    cli = instantiate([
        "--config", str(CONFIG), "--trainer.logger=false", "--trainer.callbacks=null",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0",
        f"--trainer.max_epochs={setup['epochs']}",
        f"--seed_everything={seed}", f"{synthetic}.seed={seed}",
        f"{synthetic}.cardinality_scale={setup['cardinality_scale']}",
        f"{synthetic}.min_cardinality={setup['min_cardinality']}",
        f"--model.init_args.backbone.init_args.embedding_dim={setup['dim']}",
        *(f"--data.init_args.n_{split}={n}" for split, n in setup["sizes"].items()),
        *(f"{tables}.{key}={value}" for key, value in spec.to_dict().items() if value is not None),
    ])  # fmt: skip
    module, dm, trainer = cli.model, cli.datamodule, cli.trainer
    start = time.perf_counter()
    trainer.fit(module, dm)
    seconds = time.perf_counter() - start
    val_auc = float(trainer.callback_metrics["val/auc"])  # the last epoch's validation
    metrics = trainer.test(module, dm, verbose=False)[0]
    stats = module.backbone.table_stats()
    memory, cache = stats["memory"]["total"], stats["cache"]
    cards = list(module.backbone.schema.cardinalities)
    per_table = (
        [_table_cache(cache, i, card) for i, card in enumerate(cards)] if spec.cached else []
    )
    return {
        "name": name,
        "seed": seed,
        "precision": spec.precision.value,
        "cache_fraction": spec.cache_fraction,
        "policy": spec.cache_policy if spec.cached else None,
        "stochastic_rounding": spec.stochastic_rounding,
        "val_auc": val_auc,
        "test_auc": float(metrics["test/auc"]),
        "test_logloss": float(metrics["test/logloss"]),
        "memory_bytes": memory["total_bytes"],
        "fp32_memory_bytes": memory["fp32_bytes"],
        "optimizer_state_bytes": memory["optimizer_state"],
        "hit_rate": cache["hit_rate"],
        "tables": per_table,
        "fully_cached_tables": sum(t["fully_cached"] for t in per_table),
        "train_seconds": seconds,
    }


def _table_cache(cache: dict, i: int, cardinality: int) -> dict:
    hits, misses = cache[f"table{i}/hits"], cache[f"table{i}/misses"]
    capacity = int(cache[f"table{i}/capacity_rows"])
    return {"rows": cardinality, "cache_rows": capacity, "fully_cached": capacity >= cardinality,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0}  # fmt: skip


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per variant: mean ± std of test AUC / logloss over seeds and the paired gap to FP32."""
    base = {r["seed"]: r["test_auc"] for r in rows if r["name"] == "fp32"}
    val_base = {r["seed"]: r["val_auc"] for r in rows if r["name"] == "fp32"}
    out: dict[str, dict] = {}
    for name, _ in VARIANTS:
        mine = [r for r in rows if r["name"] == name]
        auc = torch.tensor([r["test_auc"] for r in mine], dtype=torch.float64)
        gaps = torch.tensor([base[r["seed"]] - r["test_auc"] for r in mine], dtype=torch.float64)
        val_gaps = [val_base[r["seed"]] - r["val_auc"] for r in mine]
        first = mine[0]
        state = first["optimizer_state_bytes"]  # the same row-wise Adagrad state on both sides
        out[name] = {
            "test_auc_mean": float(auc.mean()),
            "test_auc_std": float(auc.std()) if len(mine) > 1 else 0.0,
            "test_logloss_mean": float(sum(r["test_logloss"] for r in mine) / len(mine)),
            "auc_gap_to_fp32_mean": float(gaps.mean()),
            "auc_gap_to_fp32_std": float(gaps.std()) if len(mine) > 1 else 0.0,
            "val_auc_gap_to_fp32_mean": sum(val_gaps) / len(val_gaps),
            "memory_bytes": first["memory_bytes"],
            "compression": first["fp32_memory_bytes"] / first["memory_bytes"],
            "compression_with_optimizer": (first["fp32_memory_bytes"] + state)
            / (first["memory_bytes"] + state),
            "hit_rate_mean": float(sum(r["hit_rate"] for r in mine) / len(mine)),
            "fully_cached_tables": first["fully_cached_tables"],
        }
    return out


def acceptance(summary: dict[str, dict]) -> dict[str, object]:
    """Mean AUC gaps to FP32 against the targets, and the power check."""
    # Seed noise of a paired gap (same data and seed on both sides), not of the AUC itself:
    # each seed draws other data, which moves every variant's AUC alike.
    spread = max(v["auc_gap_to_fp32_std"] for n, v in summary.items() if n != "fp32")
    power_gap = summary[POWER_CHECK]["auc_gap_to_fp32_mean"]
    gaps = {n: v["auc_gap_to_fp32_mean"] for n, v in summary.items()}
    return {
        "auc_gap_to_fp32": gaps,
        "seed_spread": spread,
        "power_check_gap": power_gap,
        "power_check_passes": power_gap > max(2 * spread, 0.0),
        "int8_cache5_within_0.001": all(gaps[n] <= 0.001 for n in gaps if "int8_cache5" in n),
        "int4_cache1_within_0.003": gaps["int4_cache1_lru"] <= 0.003,
    }


def plot(rows: list[dict]) -> Figure:
    """AUC vs memory scatter."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.scatter(r["memory_bytes"] / 2**20, r["test_auc"])
        ax.annotate(r["name"], (r["memory_bytes"] / 2**20, r["test_auc"]), fontsize=8)
    ax.set_xlabel("embedding memory (MiB, optimizer state excluded)")
    ax.set_ylabel("test AUC")
    fig.tight_layout()
    return fig


def study_parser(description: str) -> argparse.ArgumentParser:
    """The benchmark parser with the synthetic study's options (dim, rows, epochs, vocabularies)."""
    parser = benchmark_parser(description, seeds=True)
    parser.add_argument("--dim", type=int, default=64, help="embedding dimension D")
    parser.add_argument("--train-rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--cardinality-scale", type=float, default=0.01)
    parser.add_argument("--min-cardinality", type=int, default=2000)
    return parser


def study_setup(args: argparse.Namespace, quick_rows: int, min_test_rows: int) -> dict:
    """The ``setup`` of :func:`run_variant` from :func:`study_parser`'s arguments.

    ``--quick`` trains on ``quick_rows`` rows with a 200-id vocabulary floor; the test split
    holds a quarter of the training rows, at least ``min_test_rows``.
    """
    train = quick_rows if args.quick else args.train_rows
    sizes = {"train": train, "val": train // 10, "test": max(train // 4, min_test_rows)}
    floor = 200 if args.quick else args.min_cardinality
    return {"dim": args.dim, "epochs": args.epochs, "sizes": sizes,
            "cardinality_scale": args.cardinality_scale, "min_cardinality": floor}  # fmt: skip


def main() -> None:
    """Parse arguments, run every variant and seed, print, write JSON + PNG."""
    parser = study_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    record = Recording(__file__)
    torch.set_num_threads(1)  # shares the machine with other runs; accuracy, not speed
    setup = study_setup(args, quick_rows=50_000, min_test_rows=10_000)
    seeds = list(chosen_seeds(args, (0, 1, 2)))
    rows = [run_variant(name, spec, setup, seed) for seed in seeds for name, spec in VARIANTS]
    summary = summarize(rows)
    print(f"{'name':24s} {'auc':>15s} {'gap':>15s} {'x fp32':>7s} {'x w/ opt':>8s} {'hit':>6s}")
    for name, v in summary.items():
        print(f"{name:24s} {v['test_auc_mean']:.4f}±{v['test_auc_std']:.4f} "
              f"{v['auc_gap_to_fp32_mean']:+.4f}±{v['auc_gap_to_fp32_std']:.4f} "
              f"{v['compression']:7.2f} {v['compression_with_optimizer']:8.2f} "
              f"{v['hit_rate_mean']:6.3f}")  # fmt: skip
    result = {
        "config": {
            "data": "SyntheticCTRDataModule (easy preset)",
            **setup,
            "seeds": seeds,
            "model": "configs/ctr/synthetic.yaml (DLRM)",
        },  # fmt: skip
        "summary": summary,
        "rows": rows,
        "acceptance": acceptance(summary),
    }
    print(result["acceptance"])
    record.write(args.json, result, lambda r: plot(r["rows"]))


if __name__ == "__main__":
    main()
