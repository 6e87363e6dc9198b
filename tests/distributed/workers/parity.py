"""Train the CTR model 50 steps on the same global batches, sharded over the ranks or not.

    torchrun --nproc_per_node 2 parity.py   # sharded runs (table-wise / row-wise, FP32/FP16)
    python parity.py --plain                # one process, unsharded, the whole global batch

Prints one RESULT line per run: the loss of each step (mean over the global batch) and the
test AUC after training.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import SPECS, TABLES_PATH, data, finish, model, part, report

from ssl_rec.metrics import binary_auc

STEPS, GLOBAL_BATCH, TEST_ROWS = 50, 256, 8192


def train(module, step_batch, world: int, rank: int) -> list[float]:
    optimizer = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=1e-3)
    local = GLOBAL_BATCH // world
    losses = []
    for step in range(STEPS):
        batch = part(step_batch(step), rank * local, (rank + 1) * local)
        loss = F.binary_cross_entropy_with_logits(module(batch), batch.label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reported = loss.detach().clone()
        if world > 1:
            dist.all_reduce(reported)
        losses.append(float(reported) / world)
    return losses


@torch.no_grad()
def evaluate_auc(module, test, world: int, rank: int) -> float:
    module.eval()
    local = len(test.label) // world
    scores = module(part(test, rank * local, (rank + 1) * local))
    if world > 1:
        gathered = [torch.empty_like(scores) for _ in range(world)]
        dist.all_gather(gathered, scores)
        scores = torch.cat(gathered)
    return binary_auc(scores, test.label[: len(scores)])


def sharded(ctr, sharding: str, precision: str, world: int):
    from torch.nn.parallel import DistributedDataParallel
    from torchrec.distributed.types import ShardingEnv

    from ssl_rec.distributed.grad_hooks import gradient_hook
    from ssl_rec.distributed.planner import plan_collection
    from ssl_rec.distributed.sharder import (
        MixedPrecisionCollectionSharder,
        qcomm_registry,
        shard_collections,
    )

    collection = ctr.get_submodule(TABLES_PATH)
    plan = plan_collection(collection, world, world, sharding).placements
    group = dist.new_group(backend="gloo")
    sharder = MixedPrecisionCollectionSharder(qcomm_registry(precision, precision))
    shard_collections(ctr, {TABLES_PATH: plan}, ShardingEnv.from_process_group(group), sharder)
    wrapped = DistributedDataParallel(ctr, find_unused_parameters=True)
    hook = gradient_hook(precision if precision != "int8" else "fp16")
    if hook is not None:
        wrapped.register_comm_hook(None, hook)
    return wrapped, {name: p.sharding_type for name, p in plan.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plain", action="store_true")
    args = parser.parse_args()
    schema, train_rows = data("train", STEPS * GLOBAL_BATCH)
    _, test = data("test", TEST_ROWS)

    def step_batch(step: int):
        return part(train_rows, step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)

    if args.plain:
        for tables in SPECS:
            ctr = model(schema, SPECS[tables]).train()
            losses = train(ctr, step_batch, 1, 0)
            report(tables=tables, sharding="none", comms="fp32", losses=losses,
                   auc=evaluate_auc(ctr, test, 1, 0))  # fmt: skip
        finish()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    runs = [("int8_cache5", "table_wise", "fp32"), ("int8_cache5", "row_wise", "fp32"),
            ("fp32", "table_wise", "fp32"), ("fp32", "row_wise", "fp32"),
            ("int8_cache5", "row_wise", "fp16")]  # fmt: skip
    for tables, sharding, precision in runs:
        ctr = model(schema, SPECS[tables]).train()
        wrapped, types = sharded(ctr, sharding, precision, world)
        losses = train(wrapped, step_batch, world, rank)
        report(tables=tables, sharding=sharding, comms=precision, losses=losses,
               auc=evaluate_auc(ctr, test, world, rank), types=types)  # fmt: skip
    finish()


if __name__ == "__main__":
    main()
