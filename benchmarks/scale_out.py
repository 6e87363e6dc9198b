"""Scale-out benchmark: 1- vs 2-process training throughput here, and the cost model for 8-128.

    python benchmarks/scale_out.py [--quick] --json benchmarks/results/scale_out.json

1. Kernel rates (one thread): training forward and fused update, ns per id, per storage
   precision; the dense layers' ns per sample. They feed the cost model.
2. Samples/s of sharded training (configs/dist/synthetic_int8_row_wise.yaml) with torchrun on
   1 and 2 gloo processes of this machine. Two processes on two shared cores show that the
   sharded path runs and what its communication costs, not how it scales.
3. Pipelined vs unpipelined sharded steps (the next batch's input dist during the current
   step) on 2 processes: one model, the same batches, interleaved rounds; the median of the
   rounds' step-time ratios.
4. The cost model's per-rank memory, all-to-all bytes and predicted step time on 8-128 ranks
   for the Criteo-Kaggle tables (INT8 + 5% cache, D = 16), planned by ``ssl-rec plan``'s
   planner, with the measured rates.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if not __package__:  # `python benchmarks/scale_out.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch

from benchmarks._fresh_process import run_in_fresh_process
from benchmarks._harness import Figure, Recording, benchmark_parser, pyplot
from benchmarks._scale_out_worker import pipeline_rounds, train_steps
from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.distributed.cost_model import KernelRates, TableInfo, default_hit_rate, step_cost
from ssl_rec.distributed.planner import plan_tables
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/dist/synthetic_int8_row_wise.yaml"
PRECISIONS = ("fp32", "fp16", "int8", "int4")
WORLDS = (8, 16, 32, 64, 128)


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernel_rates(ids_per_call: int, repeats: int) -> dict:
    """Training forward / update ns per id (no cache: the storage precision's own cost)."""
    forward, backward = {}, {}
    ids = torch.randint(0, 200_000, (ids_per_call, 1))
    for precision in PRECISIONS:
        emb = MixedPrecisionEmbeddingCollection([200_000], 16, TableSpec(precision)).train()
        grad = torch.randn(ids_per_call, 1, 16)
        group = emb.group
        plan = group.admit(ids)  # warm up; the update below is timed on this batch's plan
        group.gather(plan)
        # training forward = admission + gather (TableGroup's API since the fused
        # admit_and_lookup was split); the update is the fused optimizer step
        forward[precision] = _median_seconds(lambda g=group: g.gather(g.admit(ids)), repeats)
        backward[precision] = _median_seconds(
            lambda g=group, p=plan, d=grad: g.apply_update(p, d), repeats
        )
        forward[precision] *= 1e9 / ids_per_call
        backward[precision] *= 1e9 / ids_per_call
    for low in ("bf16", "int2"):  # not measured: priced like their neighbours
        source = "fp16" if low == "bf16" else "int4"
        forward[low], backward[low] = forward[source], backward[source]
    return {"forward_ns": forward, "backward_ns": backward}


def dense_ns_per_sample(batch: int, repeats: int) -> tuple[float, int]:
    """Forward + backward ns per sample of the config's dense layers; their parameter bytes."""
    from ssl_rec.cli import instantiate

    tiny = [f"--data.init_args.{split}=64" for split in ("n_train", "n_val", "n_test")]
    cli = instantiate(["--config", str(CONFIG), "--trainer.devices=1", *tiny])
    module = cli.model.train()
    backbone, head = module.backbone, module.head
    field_emb = torch.randn(batch, backbone.dims.n_fields, backbone.dims.embedding_dim)
    dense = torch.randn(batch, backbone.dims.n_dense)

    def step() -> None:
        pooled, _ = backbone.encode(field_emb, dense)
        head(pooled).sum().backward()

    step()
    seconds = _median_seconds(step, repeats)
    params = sum(p.numel() * 4 for p in module.parameters() if p.requires_grad)
    return seconds * 1e9 / batch, params


def throughput(nproc: int, steps: int, global_batch: int) -> float:
    """Samples/s of the worker on ``nproc`` gloo processes (torchrun)."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_in_fresh_process(train_steps, str(CONFIG), steps, global_batch, timeout=900,
                                  env=env, launcher=torchrun)  # fmt: skip
    return result["samples_per_s"]


def pipeline_ratio(rounds: int, steps: int, global_batch: int) -> dict:
    """Step time pipelined / unpipelined on 2 gloo processes: rounds' median ratio."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = run_in_fresh_process(pipeline_rounds, str(CONFIG), rounds, steps, global_batch,
                                  timeout=900, env=env, launcher=torchrun)  # fmt: skip
    piped, plain = result["pipelined"], result["unpipelined"]
    ratios = [a / b for a, b in zip(piped, plain, strict=True)]
    return {"processes": 2, "global_batch": global_batch, "rounds": rounds,
            "steps_per_round": steps,
            "ms_per_step_pipelined": 1e3 * statistics.median(piped) / steps,
            "ms_per_step_unpipelined": 1e3 * statistics.median(plain) / steps,
            "ratios": ratios, "median_ratio_pipelined_over_unpipelined": statistics.median(ratios),
            "input_dists_used": result["used"],
            "input_dists_discarded": result["discarded"]}  # fmt: skip


def cost_model(rates: KernelRates, batch_per_rank: int, dense_bytes: int) -> list[dict]:
    spec = TableSpec("int8", 0.05)
    tables = [TableInfo(f"C{i + 1}", rows, 16, spec, default_hit_rate(spec))
              for i, rows in enumerate(CRITEO_KAGGLE_CARDINALITIES)]  # fmt: skip
    rows = []
    for world in WORLDS:
        plan = plan_tables(tables, world, local_world_size=8, rates=rates)
        cost = step_cost(tables, plan.placements, world, batch_per_rank, dense_bytes, rates)
        rows.append({"world_size": world, "max_rank_mib": max(cost["per_rank_bytes"]) / 2**20,
                     "memory_imbalance": plan.imbalance,
                     "a2a_mib_per_rank": cost["a2a_bytes_per_rank"] / 2**20,
                     "step_ms": cost["step_s"] * 1e3,
                     "parts_ms": {k.removesuffix("_s"): v * 1e3 for k, v in cost["parts"].items()},
                     "samples_per_s": world * batch_per_rank / cost["step_s"]})  # fmt: skip
    return rows


def plot(result: dict) -> Figure:
    """The cost model's predicted step by part, and per-rank memory and all-to-all bytes."""
    plt = pyplot()
    rows = result["cost_model"]
    worlds = [r["world_size"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    bottom = [0.0] * len(rows)
    for part in rows[0]["parts_ms"]:
        values = [r["parts_ms"][part] for r in rows]
        left.bar([str(w) for w in worlds], values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    left.set(xlabel="ranks", ylabel="predicted step (ms)", title="cost model, Criteo-Kaggle INT8")
    left.legend(fontsize=7)
    right.plot(worlds, [r["max_rank_mib"] for r in rows], marker="o", label="table MiB per rank")
    right.plot(worlds, [r["a2a_mib_per_rank"] for r in rows], marker="s", label="a2a MiB per step")
    right.set(xscale="log", yscale="log", xlabel="ranks", title="per rank")
    right.legend(fontsize=7)
    return fig


def main() -> None:
    """Measure rates, 1-/2-process throughput and the pipelined ratio; price 8-128 ranks."""
    args = benchmark_parser(__doc__.splitlines()[0]).parse_args()
    record = Recording(__file__)
    torch.set_num_threads(1)
    repeats = 3 if args.quick else 7
    measured = kernel_rates(16_384 if args.quick else 65_536, repeats)
    dense_ns, dense_bytes = dense_ns_per_sample(1024, repeats)
    rates = KernelRates(
        measured["forward_ns"], measured["backward_ns"], dense_ns_per_sample=dense_ns
    )
    steps, batch = (10, 1024) if args.quick else (30, 2048)
    one, two = throughput(1, steps, batch), throughput(2, steps, batch)
    pipelined = pipeline_ratio(*((2, 4, 1024) if args.quick else (15, 10, 2048)))
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "rates": rates.to_dict(),
        "dense_param_bytes": dense_bytes,
        "throughput": {
            "global_batch": batch,
            "steps": steps,
            "samples_per_s_1_process": one,
            "samples_per_s_2_processes": two,
            "ratio_2_over_1": two / one,
        },  # fmt: skip
        "pipelined_steps": pipelined,
        "cost_model": cost_model(rates, 2048, dense_bytes),
    }
    record.write(args.json, result, plot)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
