"""Worker of benchmarks/scale_out.py: timed sharded training steps on this machine's ranks.

``scale_out.py`` runs :func:`train_steps` on every rank of a torchrun world through
``benchmarks._fresh_process``. It builds the model of CONFIG (a configs/dist file), shards
its tables with the config's strategy settings over the ranks, trains STEPS steps on
synthetic batches (the global batch split over the ranks) and rank 0 sends the samples per
second of the timed steps (after 5 warm-up steps) to the parent.
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


def train_steps(config: str, steps: int, global_batch: int) -> None:
    """Run on each rank: shard, train, time; rank 0 sends its figures; the process ends here."""
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
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
    data = batches(steps + WARMUP, global_batch, world, rank)
    for i, batch in enumerate(data):
        if i == WARMUP:
            dist.barrier()
            start = time.perf_counter()
        loss = F.binary_cross_entropy_with_logits(model(batch), batch.label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        result = {"world_size": world, "samples_per_s": steps * global_batch / elapsed,
                  "steps": steps, "global_batch": global_batch}  # fmt: skip
        to_parent(result)
    dist.destroy_process_group()
    os._exit(0)
