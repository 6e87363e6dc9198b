"""Serving the benchmark's DLRM in FP32 and quantized, at batch 1, 16 and 4096 (one thread).

The FP32-table ``CTRModule`` of ``_e2e_models`` is read into the inference model
(``ssl_rec.quantize.FloatCTR`` / ``ModelBuilder``, what ``ssl-rec quantize`` builds): every
unit FP32, then the same model with INT8 tables (``int8``), with INT8 tables and FBGEMM INT8
Linear layers (``int8_all``), and with INT4 tables (``int4``). ``throughput`` times them
interleaved batch by batch.
"""

from __future__ import annotations

import torch
from torch import nn

from benchmarks._e2e_models import LibraryDLRM, make_raw
from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES

BATCHES = {1: 400, 16: 200, 4096: 20}  # batch size -> rounds
QUICK_ROUNDS = {1: 10, 16: 5, 4096: 2}


def measure_serving(cap: int, quick: bool) -> dict:
    """Samples/s and p50 latency of each model; ``ratios``: INT8 tables over FP32 samples/s
    per batch size (``batch1``, ``batch16``, ``batch4096``), ``other_plans_vs_fp32`` the same
    for INT4 tables and for INT8 tables + INT8 Linear layers."""
    from ssl_rec.quantize import FloatCTR, ModelBuilder, Rows, throughput

    torch.set_num_threads(1)
    cards = [min(c, cap) for c in CRITEO_KAGGLE_CARDINALITIES]
    trained = LibraryDLRM(cards, "fp32")
    raws = [make_raw(cards, 256 if quick else 4096, seed) for seed in range(1 if quick else 2)]
    for raw in raws:
        trained.step(raw)
    module = trained.module.eval()
    source = FloatCTR.from_backbone(module.backbone, module.head)
    builder = ModelBuilder(source)
    fp32 = source.fp32_plan()
    plans = {"fp32": fp32}
    for bits in ("int8", "int4"):
        plans[bits] = type(fp32)(dict.fromkeys(fp32.tables, bits), dict(fp32.layers))
    linear = {
        name: "int8_fbgemm" if isinstance(source.dense.get_submodule(name), nn.Linear) else p
        for name, p in fp32.layers.items()
    }
    plans["int8_all"] = type(fp32)(dict.fromkeys(fp32.tables, "int8"), linear)
    models = {name: builder.build(plan) for name, plan in plans.items()}
    rows = Rows(torch.cat([r.dense for r in raws]), torch.cat([r.ids for r in raws]),
                torch.cat([r.label for r in raws]))  # fmt: skip
    out: dict = {"plans": {k: _describe(p.tables, p.layers) for k, p in plans.items()}}
    ratios: dict[str, float] = {}
    others: dict[str, float] = {}
    for batch, rounds in (QUICK_ROUNDS if quick else BATCHES).items():
        timed = throughput(models, rows, batch, threads=1, rounds=rounds)
        out[f"batch{batch}"] = timed
        base = timed["fp32"]["samples_per_s"]
        ratios[f"batch{batch}"] = timed["int8"]["samples_per_s"] / base
        for name in ("int4", "int8_all"):
            others[f"{name}_batch{batch}"] = timed[name]["samples_per_s"] / base
    out["ratios"], out["other_plans_vs_fp32"] = ratios, others
    return out


def _describe(tables: dict[str, str], layers: dict[str, str]) -> str:
    return f"tables {sorted(set(tables.values()))}, layers {sorted(set(layers.values()))}"
