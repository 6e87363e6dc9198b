"""Serving speed and size of a quantized CTR model against FP32, on CPU.

    python benchmarks/inference.py --config configs/ctr/synthetic.yaml --json OUT.json
    python benchmarks/inference.py --config configs/ctr/movielens.yaml --json OUT.json
    python benchmarks/inference.py --ckpt CKPT --json OUT.json          # a trained model

Trains a small CTR model from a shipped config (``ssl_rec.cli.instantiate``; synthetic
data: ``--train-rows`` rows, one epoch) or takes ``--ckpt``, quantizes it with
``ssl_rec.cli.quantize_commands.quantize`` (what ``ssl-rec quantize`` runs: NE-budget search
on the validation split, report on the test split) and loads the quantized directory back.
Then, on the test rows, interleaved round by round:

- samples/s and p50/p99 latency at batch 1, 64 and 4096 on one thread and on two, of the
  FP32 model (the serving code with every unit in FP32) and of the quantized directory;
- the time of each serving stage at batch 4096 on one thread, median over batches, for
  both models on the fused path (bottom MLP, lookup and interaction in one kernel, top MLP,
  head) and on the module's concatenating one (lookup, bottom MLP, interaction with its two
  concatenations, top MLP, head);
- the table part alone: the model's lookups (``torch.ops.quantized`` row-wise FBGEMM ops)
  against FBGEMM's table-batched ``IntNBitTableBatchedEmbeddingBagsCodegen`` holding the
  same rows at the same precisions (``fbgemm-gpu-cpu``; skipped when not installed);
- predictions of the loaded directory against the checkpoint's own module: row pairs
  ordered alike, largest probability change.

Writes the JSON and a PNG beside it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

if not __package__:  # `python benchmarks/inference.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import torch

from benchmarks._harness import Figure, Recording, benchmark_parser, portable_path, pyplot
from ssl_rec.cli import instantiate
from ssl_rec.cli.datamodules import datamodule_from, split_loader
from ssl_rec.cli.quantize_commands import quantize
from ssl_rec.hardware import serving_kernels
from ssl_rec.lightning.ctr_checkpoint import load_ctr
from ssl_rec.quantize import ModelBuilder, load_quantized, logits_of, pair_agreement, throughput
from ssl_rec.quantize.fused import dlrm_logits, fusable
from ssl_rec.quantize.ptq import agreement
from ssl_rec.quantize.workflow import labeled_rows
from ssl_rec.types import Batch

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LeafSpec.*")

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 64, 4096)
THREADS = (1, 2)
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false",
         "--trainer.callbacks=null", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0"]  # fmt: skip
TBE_TYPES = {"fp32": "FP32", "fp16": "FP16", "int8": "INT8", "int4": "INT4", "int2": "INT2"}


def train(config: str, train_rows: int, epochs: int, out: Path) -> tuple[str, float]:
    """Fit ``config`` (synthetic data: ``train_rows`` rows); the checkpoint path and seconds."""
    sizes = []
    if "synthetic" in Path(config).name:
        eval_rows = max(train_rows // 10, 2000)
        sizes = [f"--data.init_args.n_train={train_rows}", f"--data.init_args.n_val={eval_rows}",
                 f"--data.init_args.n_test={eval_rows}"]  # fmt: skip
    cli = instantiate(["--config", config, *QUIET, f"--trainer.max_epochs={epochs}", *sizes,
                       f"--trainer.default_root_dir={out}"])  # fmt: skip
    start = time.perf_counter()
    cli.trainer.fit(cli.model, cli.datamodule)
    seconds = time.perf_counter() - start
    ckpt = str(out / "model.ckpt")
    cli.trainer.save_checkpoint(ckpt)
    return ckpt, seconds


def speed_grid(models: dict, rows, quick: bool) -> list[dict]:
    """Samples/s and latency of each model at every batch size and thread count."""
    out = []
    for threads in THREADS:
        for batch in BATCHES:
            rounds = {1: 300, 64: 100, 4096: 20}[batch] // (10 if quick else 1)
            timed = throughput(models, rows, batch, threads=threads, rounds=max(rounds, 3))
            for name, figures in timed.items():
                out.append({"model": name, "batch": batch, "threads": threads, **figures})
    return out


def _one_pass(model, fused: bool, dense: torch.Tensor, sparse: torch.Tensor) -> dict:
    """Seconds of each stage of one forward on the fused or the concatenating path."""
    marks = [time.perf_counter()]
    stages: dict[str, float] = {}

    def mark(stage: str) -> None:
        marks.append(time.perf_counter())
        stages[stage] = marks[-1] - marks[-2]

    dlrm_logits(model.tables, model.dense, dense, sparse, fused, mark)
    return stages


def stage_times(models: dict, rows, quick: bool, batch: int = 4096) -> dict:
    """Median milliseconds of each serving stage per model, fused and concatenating paths.

    One thread, ``batch`` rows, the models and paths interleaved round by round; the
    stages are those the serving forward reports (``ssl_rec.quantize.fused.STAGES``, and
    ``FUSED_STAGES`` on the fused path, where the lookup and interaction are one kernel).
    """
    if not all(fusable(model.dense) for model in models.values()):
        return {"skipped": "not a DLRM with an FP32 interaction"}
    paths = ("fused", "concatenating") if serving_kernels() is not None else ("concatenating",)
    runs = {f"{name}/{path}": (model, path == "fused")
            for name, model in models.items() for path in paths}  # fmt: skip
    times: dict[str, list[dict[str, float]]] = {key: [] for key in runs}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for r in range(6 if quick else 31):
                dense, sparse = rows.batch(r * batch, batch)
                for key, (model, fused) in runs.items():
                    stages = _one_pass(model, fused, dense, sparse)
                    if r > 0:  # the first round allocates and warms up
                        times[key].append(stages)
    finally:
        torch.set_num_threads(previous)
    out: dict = {"batch": batch, "threads": 1}
    for key, measured in times.items():
        out[key] = {stage: 1e3 * float(np.median([m[stage] for m in measured]))
                    for stage in measured[0]}  # fmt: skip
        out[key]["total"] = 1e3 * float(np.median([sum(m.values()) for m in measured]))
    return out


def tbe_peer(tables, sparse: torch.Tensor, quick: bool) -> dict:
    """The model's table lookups vs FBGEMM's IntNBit TBE with the same rows, batch 4096."""
    try:
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
            IntNBitTableBatchedEmbeddingBagsCodegen,
        )
    except ImportError as e:
        return {"skipped": f"fbgemm_gpu is not installed ({e})"}
    specs = [("", rows, tables.dim, SparseType[TBE_TYPES[p.value]], EmbeddingLocation.HOST)
             for p, rows in zip(tables.precisions, tables.cardinalities, strict=True)]  # fmt: skip
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(specs, device="cpu", output_dtype=SparseType.FP32)
    tbe.fill_random_weights()
    for f, (weight, qparams) in enumerate(tbe.split_embedding_weights()):
        _copy_rows(weight, qparams, tables.table_store(f), tables.precisions[f], tables.dim)
    batch = sparse[:4096]
    offsets = torch.arange(4096 * tables.num_tables + 1, dtype=torch.int32)

    def fbgemm_tbe(dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:  # one id per bag
        return tbe(ids.t().reshape(-1).int(), offsets[: ids.numel() + 1])

    def library(dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return tables(ids)

    with torch.inference_mode():
        ours, theirs = library(None, batch), fbgemm_tbe(None, batch)
    theirs = theirs.view(len(batch), tables.num_tables, tables.dim)
    from ssl_rec.quantize import Rows

    rows = Rows(torch.zeros(len(sparse), 0), sparse, torch.zeros(len(sparse)))
    timed = throughput({"library": library, "fbgemm_tbe": fbgemm_tbe}, rows, 4096,
                       rounds=10 if quick else 40)  # fmt: skip
    ratio = timed["library"]["samples_per_s"] / timed["fbgemm_tbe"]["samples_per_s"]
    return {
        "batch": 4096,
        "threads": 1,
        **timed,
        "library_over_tbe": ratio,
        "max_abs_difference": float((ours - theirs).abs().max()),
    }


def _copy_rows(weight, qparams, store: torch.Tensor, precision, dim: int) -> None:
    """Write the library's rows into a TBE's (data, FP16 scale and bias) views."""
    if precision.is_float:
        weight.copy_(store.contiguous().view(torch.uint8).reshape(len(store), -1))
        return
    data = weight.shape[1]
    scale_bias = store[:, data:]
    if precision.bits == 8:  # FP32 scale and bias -> FP16, as the TBE stores them
        scale_bias = scale_bias.contiguous().view(torch.float32).half().view(torch.uint8)
    weight.copy_(store[:, :data])
    qparams.copy_(scale_bias)


def predictions(ckpt: str, quantized_dir: Path, rows) -> dict:
    """The loaded directory's predictions against the checkpoint's module on ``rows``."""
    module, _ = load_ctr(ckpt)
    with torch.inference_mode():
        reference = logits_of(lambda d, s: module(Batch(d, s)), rows)
    candidate = logits_of(load_quantized(quantized_dir), rows)
    return {"rows": len(rows), **agreement(reference, candidate),
            "pairs_same_order_check": pair_agreement(reference, candidate, seed=1)}  # fmt: skip


def run(args: argparse.Namespace, work: Path) -> dict:
    """Train or take the model, quantize it, time and compare; the JSON document."""
    train_seconds = None
    ckpt = args.ckpt
    if ckpt is None:
        rows = 20_000 if args.quick else args.train_rows
        ckpt, train_seconds = train(args.config, rows, args.epochs, work)
    out = Path(args.out) if args.out else work / "quantized"
    limit = 4096 if args.quick else 65_536
    report = quantize(ckpt, str(out), args.budget_ne, calibration_rows=limit,
                      evaluation_rows=limit, overwrite=True,
                      min_pair_agreement=args.min_pair_agreement)  # fmt: skip
    _, source = load_ctr(ckpt)
    datamodule = datamodule_from(ckpt, None, None, use_labels=True)
    test = labeled_rows(split_loader(datamodule, "test"), source.schema, datamodule.schema, limit,
                        "evaluation", "test")  # fmt: skip
    quantized = load_quantized(out)
    fp32 = ModelBuilder(source).build(source.fp32_plan())
    return {
        "config": args.config, "checkpoint": args.ckpt and portable_path(args.ckpt),
        "train_seconds": train_seconds,
        "budget_ne": args.budget_ne, "min_pair_agreement": args.min_pair_agreement,
        "report": {k: report[k] for k in REPORT_KEYS},
        "choices": report["choices"],
        "bytes": {"fp32": fp32.nbytes(), "quantized": quantized.nbytes()},
        "speed": speed_grid({"fp32": fp32, "quantized": quantized}, test, args.quick),
        "stages_ms": stage_times({"fp32": fp32, "quantized": quantized}, test, args.quick),
        "tables": tbe_peer(quantized.tables, test.sparse, args.quick),
        "predict": predictions(ckpt, out, test),
    }  # fmt: skip


REPORT_KEYS = ("ne_fp32", "ne_quantized", "ne_change", "auc_fp32", "auc_quantized",
               "bytes_fp32", "bytes_quantized", "compression", "samples_per_s_fp32",
               "samples_per_s_quantized", "speedup", "calibration_set", "agreement")  # fmt: skip


def acceptance(result: dict) -> dict:
    """The targets: >= 4x smaller, >= 2x samples/s at 4096 on one thread, NE, pair order."""
    speed = {(r["model"], r["batch"], r["threads"]): r["samples_per_s"] for r in result["speed"]}
    ratio = speed["quantized", 4096, 1] / speed["fp32", 4096, 1]
    cpu = {(r["model"], r["batch"], r["threads"]): r["samples_per_cpu_s"] for r in result["speed"]}
    calibration = result["report"]["calibration_set"]
    ne_change = calibration["ne_quantized"] - calibration["ne_fp32"]
    return {
        "compression": result["report"]["compression"],
        "speedup_4096_1thread": ratio,
        "cpu_time_speedup_4096_1thread": cpu["quantized", 4096, 1] / cpu["fp32", 4096, 1],
        "ne_change_calibration": ne_change,
        "ne_change_test": result["report"]["ne_change"],
        "pairs_same_order": result["predict"]["pairs_same_order"],
        "met": bool(result["report"]["compression"] >= 4 and ratio >= 2
                    and abs(ne_change) <= result["budget_ne"]
                    and result["predict"]["pairs_same_order"] >= 0.99),
    }  # fmt: skip


def plot(result: dict) -> Figure:
    """Samples/s of FP32 and quantized by batch size, one panel per thread count."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(THREADS), figsize=(9, 3.8), sharey=True)
    for ax, threads in zip(axes, THREADS, strict=True):
        for shift, model in ((-0.2, "fp32"), (0.2, "quantized")):
            values = [next(r["samples_per_s"] for r in result["speed"]
                           if (r["model"], r["batch"], r["threads"]) == (model, b, threads))
                      for b in BATCHES]  # fmt: skip
            ax.bar(np.arange(len(BATCHES)) + shift, values, width=0.4, label=model)
        ax.set_xticks(range(len(BATCHES)), [f"batch {b}" for b in BATCHES])
        ax.set_yscale("log")
        ax.set_title(f"{threads} thread{'s' if threads > 1 else ''}")
    axes[0].set_ylabel("samples/s")
    axes[0].legend()
    fig.suptitle(f"{Path(result['config'] or result['checkpoint']).name}: "
                 f"{result['acceptance']['compression']:.1f}x smaller")  # fmt: skip
    fig.tight_layout()
    return fig


def main() -> None:
    """Parse arguments, run, print the acceptance figures, write JSON + PNG."""
    parser = benchmark_parser(__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs/ctr/synthetic.yaml"))
    parser.add_argument("--ckpt", help="a trained CTR checkpoint (skips training)")
    parser.add_argument("--train-rows", type=int, default=300_000, help="synthetic data only")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--budget-ne", type=float, default=0.001)
    parser.add_argument(
        "--min-pair-agreement",
        type=float,
        default=None,
        help="also keep this fraction of calibration pairs in FP32's order",
    )
    parser.add_argument("--out", help="where to keep the quantized directory")
    args = parser.parse_args()
    record = Recording(__file__)
    with tempfile.TemporaryDirectory() as work:
        result = run(args, Path(work))
    result["acceptance"] = acceptance(result)
    for r in result["speed"]:
        print(f"{r['model']:10s} batch {r['batch']:5d} threads {r['threads']} "
              f"{r['samples_per_s']:12.0f}/s p50 {r['p50_ms']:8.3f} ms "
              f"p99 {r['p99_ms']:8.3f} ms {r['samples_per_cpu_s']:12.0f}/CPU-s")  # fmt: skip
    for key, stages in result["stages_ms"].items():
        if isinstance(stages, dict):
            print(f"stages {key:24s}", " ".join(f"{k} {v:.2f}" for k, v in stages.items()), "ms")
    print("tables:", {k: v for k, v in result["tables"].items() if not isinstance(v, dict)})
    print("acceptance:", result["acceptance"])
    record.write(args.json, result, plot, threads=None)  # one and two threads, per figure


if __name__ == "__main__":
    main()
