"""Worker of benchmarks/scale_out.py: timed sharded training steps on this machine's ranks.

``scale_out.py`` runs :func:`train_steps` on every rank of a torchrun world through
``benchmarks._fresh_process``. It builds the model of CONFIG (a configs/dist file), shards
its tables with the config's strategy settings over the ranks, trains STEPS steps on
synthetic batches (the global batch split over the ranks) and rank 0 sends the samples per
second of the timed steps (after 5 warm-up steps) to the parent. :func:`pipeline_rounds`
times the same model in rounds with and without pipelined steps (``prefetch_next``).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from benchmarks._fresh_process import to_parent
from ssl_rec.cli import instantiate
from ssl_rec.data.sources.synthetic_clicks import SyntheticClickModel, SyntheticConfig
from ssl_rec.types import Batch

WARMUP = 5


def batches(steps: int, global_batch: int, world: int, rank: int) -> list[Batch]:
    rows = SyntheticClickModel(SyntheticConfig()).rows("train", 0, steps * global_batch)
    local = global_batch // world
    out = []
    for s in range(steps):
        lo = s * global_batch + rank * local
        dense = np.log1p(rows.dense[lo : lo + local]).astype(np.float32)
        sparse = rows.sparse[lo : lo + local].astype(np.int64)
        label = rows.label[lo : lo + local]
        out.append(
            Batch(torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(label))
        )
    return out


def _sharded_model(config: str, world: int):
    """(DDP-wrapped model, optimizer, sharded collection) of the config, tables sharded."""
    cli = instantiate(["--config", config, "--trainer.devices=1", "--data.init_args.n_train=64",
                       "--data.init_args.n_val=64", "--data.init_args.n_test=64"])  # fmt: skip
    strategy, module = cli.trainer.strategy, cli.model.train()
    from torchrec.distributed.types import ShardingEnv

    from ssl_rec.distributed.planner import plan_collection
    from ssl_rec.distributed.sharder import (
        MixedPrecisionCollectionSharder,
        qcomm_registry,
        shard_collections,
    )

    path = "backbone.embedding.tables"
    plan = plan_collection(module.get_submodule(path), world, world, strategy.sharding)
    sharder = MixedPrecisionCollectionSharder(qcomm_registry(*strategy.precisions))
    env = ShardingEnv.from_process_group(dist.new_group(backend="gloo"))
    shard_collections(module, {path: plan.placements}, env, sharder)
    model = DistributedDataParallel(module, find_unused_parameters=True)
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-3)
    return model, optimizer, module.get_submodule(path)


def _step(model, optimizer, batch: Batch) -> None:
    loss = F.binary_cross_entropy_with_logits(model(batch), batch.label)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_steps(config: str, steps: int, global_batch: int) -> None:
    """Run on each rank: shard, train, time; rank 0 sends its figures; the process ends here."""
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    model, optimizer, _ = _sharded_model(config, world)
    data = batches(steps + WARMUP, global_batch, world, rank)
    for i, batch in enumerate(data):
        if i == WARMUP:
            dist.barrier()
            start = time.perf_counter()
        _step(model, optimizer, batch)
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        result = {"world_size": world, "samples_per_s": steps * global_batch / elapsed,
                  "steps": steps, "global_batch": global_batch}  # fmt: skip
        to_parent(result)
    dist.destroy_process_group()
    os._exit(0)


def pipeline_rounds(config: str, rounds: int, steps: int, global_batch: int) -> None:
    """Run on each rank: ``rounds`` pairs of rounds of ``steps`` steps, pipelined or not.

    One model trains on one stream of batches; in a pair's pipelined round each step first
    calls ``prefetch_next`` with the next step's ids (as ``TablePrefetch`` does; the round's
    last step has none), and the pairs alternate which round comes first. Rank 0 sends the
    seconds of every round (``{"pipelined": [...], "unpipelined": [...]}``) and the ids'
    input dists the pipelined rounds used; the process ends here.
    """
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    model, optimizer, tables = _sharded_model(config, world)
    data = batches(WARMUP + 2 * rounds * steps, global_batch, world, rank)
    for batch in data[:WARMUP]:
        _step(model, optimizer, batch)
    seconds: dict[str, list[float]] = {"pipelined": [], "unpipelined": []}
    at = WARMUP
    for pair in range(rounds):
        order = ("pipelined", "unpipelined") if pair % 2 == 0 else ("unpipelined", "pipelined")
        for mode in order:
            dist.barrier()
            start = time.perf_counter()
            for i in range(at, at + steps):
                if mode == "pipelined":
                    tables.prefetch_next(data[i + 1].sparse if i + 1 < at + steps else None)
                _step(model, optimizer, data[i])
            dist.barrier()
            seconds[mode].append(time.perf_counter() - start)
            at += steps
    if rank == 0:
        to_parent({**seconds, "used": tables.ahead.used, "discarded": tables.ahead.discarded})
    dist.destroy_process_group()
    os._exit(0)
