"""Serving the benchmark's DLRM in FP32 and quantized, at batch 1, 16 and 4096 (one thread).

The FP32-table ``CTRModule`` of ``_e2e_models`` is read into the inference model
(``ssl_rec.quantize.FloatCTR`` / ``ModelBuilder``, what ``ssl-rec quantize`` builds) and
built with these plans, timed interleaved batch by batch (``throughput``):

- ``fp32``: every unit FP32 (the baseline);
- ``quantized`` (the headline ``ratios``): what ``ssl-rec quantize`` builds where its NE
  budget lets every unit descend to INT8: INT8 tables, FBGEMM INT8 Linear layers
  (``int8_fbgemm``), the Linear layers of at most ``TINY_WEIGHTS`` weights kept FP32 as its
  search keeps them (the click unit), the interaction FP32 (the compiled kernel);
- ``int8_tables`` (INT8 tables, FP32 layers), ``int4_tables``, ``int8_all`` (every Linear
  layer INT8, the click unit too) and ``int8_bf16`` (INT8 tables, bfloat16 Linear layers
  where ``quantized`` has INT8 ones): ``other_plans_vs_fp32``.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from benchmarks._e2e_models import LibraryDLRM, make_raw
from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.quantize.search import search_plan

BATCHES = {1: 400, 16: 200, 4096: 20}  # batch size -> rounds
# Linear layers of at most this many weights stay FP32 in ssl-rec quantize's search
TINY_WEIGHTS = inspect.signature(search_plan).parameters["tiny_weights"].default
QUICK_ROUNDS = {1: 10, 16: 5, 4096: 2}


def measure_serving(cap: int, quick: bool) -> dict:
    """Samples/s and p50 latency of each plan; ``ratios``: ``quantized`` over FP32 samples/s
    per batch size (``batch1``, ``batch16``, ``batch4096``), ``other_plans_vs_fp32`` the same
    for the other plans (see the module's docstring)."""
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
    plans = {"fp32": fp32, "quantized": _plan(source, fp32, "int8", "int8_fbgemm", TINY_WEIGHTS),
             "int8_tables": _plan(source, fp32, "int8", "fp32", 0),
             "int4_tables": _plan(source, fp32, "int4", "fp32", 0),
             "int8_all": _plan(source, fp32, "int8", "int8_fbgemm", 0),
             "int8_bf16": _plan(source, fp32, "int8", "bf16", TINY_WEIGHTS)}  # fmt: skip
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
        ratios[f"batch{batch}"] = timed["quantized"]["samples_per_s"] / base
        for name in list(plans)[2:]:
            others[f"{name}_batch{batch}"] = timed[name]["samples_per_s"] / base
    out["ratios"], out["other_plans_vs_fp32"] = ratios, others
    return out


def _plan(source, fp32, tables: str, linear: str, tiny: int):  # noqa: ANN001, ANN202
    """``fp32`` with every table at ``tables`` and every Linear layer of more than ``tiny``
    weights at ``linear`` (a QuantizationPlan)."""
    layers = {}
    for name, precision in fp32.layers.items():
        layer = source.dense.get_submodule(name)
        big = isinstance(layer, nn.Linear) and layer.weight.numel() > tiny
        layers[name] = linear if big else precision
    return type(fp32)(dict.fromkeys(fp32.tables, tables), layers)


def _describe(tables: dict[str, str], layers: dict[str, str]) -> str:
    return f"tables {sorted(set(tables.values()))}, layers {sorted(set(layers.values()))}"
