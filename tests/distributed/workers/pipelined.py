"""Train 50 steps unpipelined, pipelined, and pipelined with unusable prefetches; compare.

    torchrun --nproc_per_node 2 pipelined.py

The same 50 global batches as ``parity.py``, on row-split tables and on replicated ones.
The pipelined run calls ``prefetch_next`` with the next batch's ids before each step (as
``TablePrefetch`` does); the perturbed one, on some steps, prefetches other ids on rank 1
only (a mismatch one rank sees) or nothing on rank 0 only. Every run has eval forwards
between a prefetch and its step. Prints one RESULT line per table setup: every run's
per-step local losses (rank 0's), its prefetch counts, and whether its losses and its
tables' bytes equal the unpipelined run's on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import SPECS, TABLES_PATH, data, finish, model, part, report
from parity import GLOBAL_BATCH, STEPS
from replicated import replicated_plan, shard

from ssl_rec.distributed.cyclic_layout import table_pieces

OTHER_IDS, NO_NEXT, EVAL_BETWEEN = 3, 6, 5  # perturbed steps: step % 10 == these


def table_bytes(collection) -> torch.Tensor:
    """This rank's shards (store, optimizer state, cache) and step counter as bytes."""
    parts = [collection.shards.step.reshape(1).view(torch.uint8)]
    for table in collection.shards.tables:
        parts += [
            t.contiguous().view(torch.uint8).reshape(-1) for t in table_pieces(table).values()
        ]
    return torch.cat(parts)


def everywhere(flag: bool) -> bool:
    """Whether ``flag`` holds on every rank."""
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value)


def next_ids(step: int, local, mode: str, rank: int) -> torch.Tensor | None:
    """The ids prefetched before ``step`` (those of ``step + 1``, unless perturbed)."""
    if step + 1 >= STEPS or mode == "off":
        return None
    if mode == "perturbed" and step % 10 == OTHER_IDS and rank == 1:
        return local(min(step + 2, STEPS - 1)).sparse
    if mode == "perturbed" and step % 10 == NO_NEXT and rank == 0:
        return None
    return local(step + 1).sparse


def run(spec, plan_of, group, rows, test, mode: str) -> tuple[list[float], torch.Tensor, dict]:
    """Train STEPS steps in ``mode`` (off / on / perturbed); local losses, table bytes, counts."""
    from torch.nn.parallel import DistributedDataParallel

    world, rank = dist.get_world_size(), dist.get_rank()
    schema = data("train", 1)[0]
    ctr = model(schema, spec).train()
    collection = shard(ctr, plan_of(ctr.get_submodule(TABLES_PATH), world), group)
    wrapped = DistributedDataParallel(ctr, find_unused_parameters=True)
    optimizer = torch.optim.Adam([p for p in ctr.parameters() if p.requires_grad], lr=1e-3)
    local_batch = GLOBAL_BATCH // world

    def local(step: int):
        lo = step * GLOBAL_BATCH + rank * local_batch
        return part(rows, lo, lo + local_batch)

    losses = []
    for step in range(STEPS):
        batch = local(step)
        if mode != "off":
            collection.prefetch_next(next_ids(step, local, mode, rank))
        if step % 10 == EVAL_BETWEEN:  # an eval forward between the prefetch and its step
            wrapped.eval()
            with torch.no_grad():
                wrapped(part(test, rank * 64, (rank + 1) * 64))
            wrapped.train()
        loss = F.binary_cross_entropy_with_logits(wrapped(batch), batch.label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    counts = {"used": collection.ahead.used, "discarded": collection.ahead.discarded}
    return losses, table_bytes(collection), counts


def main() -> None:
    _, rows = data("train", STEPS * GLOBAL_BATCH)
    _, test = data("test", 128)
    dist.init_process_group("gloo")
    group = dist.new_group(backend="gloo")

    def row_wise(collection, world: int):
        from ssl_rec.distributed.planner import plan_collection

        return plan_collection(collection, world, world, "row_wise").placements

    setups = {"int8_cache5/row_wise": (SPECS["int8_cache5"], row_wise),
              "fp32/replicated": (SPECS["fp32"], replicated_plan)}  # fmt: skip
    for name, (spec, plan_of) in setups.items():
        runs = {mode: run(spec, plan_of, group, rows, test, mode)
                for mode in ("off", "on", "perturbed")}  # fmt: skip
        losses, reference = runs["off"][0], runs["off"][1]
        report(
            setup=name,
            losses={mode: r[0] for mode, r in runs.items()},  # rank 0's local losses
            counts={mode: r[2] for mode, r in runs.items()},
            losses_equal={mode: everywhere(r[0] == losses) for mode, r in runs.items()},
            tables_equal={
                mode: everywhere(torch.equal(r[1], reference)) for mode, r in runs.items()
            },  # fmt: skip
        )
    finish()


if __name__ == "__main__":
    main()
