"""Accuracy/memory ablation of low-precision embedding storage on the synthetic CTR task.

    python benchmarks/mixed_precision.py [--quick] --json OUT.json

Trains the default synthetic CTR model (built from ``configs/ctr/synthetic.yaml``: DLRM,
D = 16, row-wise Adagrad tables, Adam 1e-3 for the dense part) once per storage variant on
the same data with the same seed, and reports test AUC / logloss, embedding memory and
cache hit rate.
Acceptance (Yang et al., 2020, https://arxiv.org/abs/2010.11305): INT8 + 5% cache within
0.001 test AUC of FP32, INT4 + 1% cache within 0.003.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from _figures import save_figure

from ssl_rec._io import atomic_write_json
from ssl_rec.cli import instantiate
from ssl_rec.hardware import TableSpec

CONFIG = Path(__file__).resolve().parents[1] / "configs/ctr/synthetic.yaml"

VARIANTS: list[tuple[str, TableSpec]] = [
    ("fp32", TableSpec("fp32")),
    ("int8_nearest_nocache", TableSpec("int8", 0.0, stochastic_rounding=False)),
    ("int8_sr_nocache", TableSpec("int8", 0.0)),
    ("int8_cache5_lru", TableSpec("int8", 0.05, "lru")),
    ("int8_cache5_lfu", TableSpec("int8", 0.05, "lfu")),
    ("int4_cache1_lru", TableSpec("int4", 0.01, "lru")),
]


def run_variant(name: str, spec: TableSpec, sizes: dict[str, int], epochs: int) -> dict:
    """Train and test one storage variant; return its ``rows`` entry."""
    tables = "--model.init_args.backbone.init_args.tables"
    cli = instantiate([
        "--config", str(CONFIG), "--trainer.logger=false", "--trainer.callbacks=null",
        "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=0", f"--trainer.max_epochs={epochs}",
        *(f"--data.init_args.n_{split}={n}" for split, n in sizes.items()),
        *(f"{tables}.{key}={value}" for key, value in spec.to_dict().items()),
    ])  # fmt: skip
    module, dm, trainer = cli.model, cli.datamodule, cli.trainer
    start = time.perf_counter()
    trainer.fit(module, dm)
    seconds = time.perf_counter() - start
    metrics = trainer.test(module, dm, verbose=False)[0]
    stats = module.backbone.table_stats()
    memory = stats["memory"]["total"]
    return {
        "name": name,
        "precision": spec.precision.value,
        "cache_fraction": spec.cache_fraction,
        "policy": spec.cache_policy if spec.cached else None,
        "stochastic_rounding": spec.stochastic_rounding,
        "test_auc": float(metrics["test/auc"]),
        "test_logloss": float(metrics["test/logloss"]),
        "memory_bytes": memory["total_bytes"],
        "fp32_memory_bytes": memory["fp32_bytes"],
        "optimizer_state_bytes": memory["optimizer_state"],
        "hit_rate": stats["cache"]["hit_rate"],
        "train_seconds": seconds,
    }


def acceptance(rows: list[dict]) -> dict[str, object]:
    """AUC gaps to FP32 and whether they meet the targets."""
    by = {r["name"]: r for r in rows}
    base = by["fp32"]["test_auc"]
    gaps = {n: base - r["test_auc"] for n, r in by.items()}
    return {
        "auc_gap_to_fp32": gaps,
        "int8_cache5_within_0.001": all(gaps[n] <= 0.001 for n in gaps if "int8_cache5" in n),
        "int4_cache1_within_0.003": gaps["int4_cache1_lru"] <= 0.003,
    }


def write_png(path: str, rows: list[dict]) -> None:
    """AUC vs memory scatter, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        ax.scatter(r["memory_bytes"] / 2**20, r["test_auc"])
        ax.annotate(r["name"], (r["memory_bytes"] / 2**20, r["test_auc"]), fontsize=8)
    ax.set_xlabel("embedding memory (MiB, optimizer state excluded)")
    ax.set_ylabel("test AUC")
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    """Parse arguments, run every variant, print, write JSON + PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200k training rows, 1 epoch")
    parser.add_argument("--json", required=True, help="output JSON path (PNG beside it)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # shares the machine with other runs; accuracy, not speed
    if args.quick:
        sizes, epochs = {"train": 200_000, "val": 20_000, "test": 50_000}, 1
    else:
        sizes, epochs = {"train": 1_000_000, "val": 100_000, "test": 100_000}, 2
    rows = [run_variant(name, spec, sizes, epochs) for name, spec in VARIANTS]
    print(f"{'name':24s} {'auc':>8s} {'logloss':>8s} {'MiB':>8s} {'x fp32':>7s} {'hit':>6s}")
    for r in rows:
        ratio = r["fp32_memory_bytes"] / r["memory_bytes"]
        print(
            f"{r['name']:24s} {r['test_auc']:8.4f} {r['test_logloss']:8.4f} "
            f"{r['memory_bytes'] / 2**20:8.2f} {ratio:7.2f} {r['hit_rate']:6.3f}"
        )
    result = {
        "config": {
            "data": "SyntheticCTRDataModule",
            **sizes,
            "epochs": epochs,
            "model": "configs/ctr/synthetic.yaml (DLRM, D=16)",
            "seed": 0,
        },
        "rows": rows,
        "acceptance": acceptance(rows),
    }
    print(result["acceptance"])
    atomic_write_json(args.json, result)
    write_png(os.path.splitext(args.json)[0] + ".png", rows)


if __name__ == "__main__":
    main()
