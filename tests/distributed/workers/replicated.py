"""Train with the small tables replicated (``data_parallel``), the others as planned row-wise.

    torchrun --nproc_per_node 2 replicated.py

The same 50 global batches as ``parity.py``. Prints one RESULT line per table spec: the loss
of each step, the names of the replicated tables, whether every replica is bit-identical
across the ranks after training, whether a sharded collection loaded from the trained
one's ``state_dict`` (DCP's ``ShardedTensor`` blocks) holds the same replicas, the floats
rank 0 sent and received by broadcast for the replicas in each backward against the global
batch's unique ids times D, the replicas' cache rows and hits, and the tables trained alone
(:func:`tables_only`) against one process: every sample's loss and every replica's bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import SPECS, TABLES_PATH, data, finish, model, part, report
from parity import GLOBAL_BATCH, STEPS, train

import ssl_rec.distributed.replica_grads as replica_grads
from ssl_rec.distributed.cyclic_layout import table_pieces
from ssl_rec.distributed.table_placement import DATA_PARALLEL, TablePlacement

SMALL = 1000  # rows


def replicated_plan(collection, world: int) -> dict[str, TablePlacement]:
    """Tables under ``SMALL`` rows replicated, the others as the row-wise plan has them."""
    from ssl_rec.distributed.planner import plan_collection

    plan = plan_collection(collection, world, world, "row_wise").placements
    everyone = tuple(range(world))
    rows = dict(zip(collection.table_names, collection.cardinalities, strict=True))
    return {name: TablePlacement(DATA_PARALLEL, everyone) if rows[name] < SMALL else p
            for name, p in plan.items()}  # fmt: skip


def shard(ctr, plan, group):
    from torchrec.distributed.types import ShardingEnv

    from ssl_rec.distributed.sharder import MixedPrecisionCollectionSharder, shard_collections

    env = ShardingEnv.from_process_group(group)
    shard_collections(ctr, {TABLES_PATH: plan}, env, MixedPrecisionCollectionSharder())
    return ctr.get_submodule(TABLES_PATH)


def replica_bytes(collection, replicated: list[str]) -> torch.Tensor:
    """Every replica's tensors (store, optimizer state, cache) as one byte vector."""
    parts = []
    for name in replicated:
        table, _, _ = collection._shard_of(collection.table_names.index(name))
        parts += [
            t.contiguous().view(torch.uint8).reshape(-1) for t in table_pieces(table).values()
        ]
    return torch.cat(parts)


def same_everywhere(local: torch.Tensor) -> bool:
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return all(torch.equal(gathered[0], g) for g in gathered)


class CollectiveSpy:
    """``torch.distributed`` for ``replica_grads``, recording the floats of every message."""

    def __init__(self) -> None:
        self.calls: dict[str, list[int]] = {"send": [], "recv": [], "broadcast": []}

    def __getattr__(self, name: str):
        op = getattr(dist, name)
        if name not in self.calls:
            return op

        def spied(tensor: torch.Tensor, *args, **kwargs):
            self.calls[name].append(tensor.numel())
            return op(tensor, *args, **kwargs)

        return spied


def unique_row_floats(collection, replicated: list[str], step_batch) -> list[int]:
    """Per step: the global batch's unique ids summed over the replicated tables, times D."""
    columns = [collection.table_names.index(name) for name in replicated]
    return [sum(len(torch.unique(step_batch(step).sparse[:, t])) for t in columns)
            * collection.embedding_dim for step in range(STEPS)]  # fmt: skip


def cache_counts(collection, replicated: list[str]) -> tuple[int, int]:
    """The replicas' cache rows and cache hits, summed."""
    tables = [collection._shard_of(collection.table_names.index(n))[0] for n in replicated]
    return (sum(int(t.cache.rows.shape[0]) for t in tables),
            sum(int(t.cache.stats[0]) for t in tables))  # fmt: skip


def tables_only(schema, spec, plan, group, step_batch, world: int, rank: int) -> dict:
    """The tables alone (no dense layers), sharded by ``plan`` against one process.

    The loss is a mean over samples of one term per table, so every gradient the tables get
    is a function of the samples' rows only, the same numbers on both sides (local batches
    are powers of two). Returns whether every sample's loss of every step equals one
    process's and whether every replica's bytes equal one process's table.
    """
    sharded = shard(model(schema, spec), plan, group).train()
    reference = model(schema, spec).get_submodule(TABLES_PATH).train()
    fields, dim = len(sharded.table_names), sharded.embedding_dim
    weight = torch.linspace(-1.0, 1.0, fields * dim).view(fields, dim)
    same, local = True, GLOBAL_BATCH // world
    for step in range(STEPS):
        batch = step_batch(step)
        outputs = []
        for tables, start, size in ((sharded, rank * local, local), (reference, 0, GLOBAL_BATCH)):
            rows = tables(batch.sparse[start : start + size])
            target = batch.label[start : start + size, None]
            per_sample = ((rows * weight).sum(2) - target).pow(2).sum(1)
            per_sample.mean().backward()
            outputs.append(per_sample.detach())
        gathered = [torch.empty_like(outputs[0]) for _ in range(world)]
        dist.all_gather(gathered, outputs[0])
        same &= torch.equal(torch.cat(gathered), outputs[1])
    replicated = [n for n, p in plan.items() if p.replicated]
    expected = torch.cat([
        t.contiguous().view(torch.uint8).reshape(-1)
        for n in replicated
        for t in table_pieces(reference.group.tables[reference.table_names.index(n)]).values()
    ])  # fmt: skip
    return {"samples_same": same,
            "replicas_same": same_everywhere(torch.tensor([torch.equal(
                replica_bytes(sharded, replicated), expected)]))
            and torch.equal(replica_bytes(sharded, replicated), expected)}  # fmt: skip


def main() -> None:
    from torch.nn.parallel import DistributedDataParallel

    schema, train_rows = data("train", STEPS * GLOBAL_BATCH)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.new_group(backend="gloo")

    def step_batch(step: int):
        return part(train_rows, step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)

    for tables, spec in SPECS.items():
        ctr = model(schema, spec).train()
        plan = replicated_plan(ctr.get_submodule(TABLES_PATH), world)
        collection = shard(ctr, plan, group)
        wrapped = DistributedDataParallel(ctr, find_unused_parameters=True)
        spy = replica_grads.dist = CollectiveSpy()
        losses = train(wrapped, step_batch, world, rank)
        replicated = [n for n, p in plan.items() if p.replicated]
        cache_rows, cache_hits = cache_counts(collection, replicated)
        trained = replica_bytes(collection, replicated)
        fresh = shard(model(schema, spec), plan, group)
        fresh.load_state_dict(collection.state_dict())
        report(tables=tables, losses=losses, replicated=replicated,
               types={n: p.sharding_type for n, p in plan.items()},
               sent=list(spy.calls["send"]), broadcast=list(spy.calls["broadcast"]),
               unique_floats=unique_row_floats(collection, replicated, step_batch),
               sample_floats=GLOBAL_BATCH * len(replicated) * collection.embedding_dim,
               cache_rows=cache_rows, cache_hits=cache_hits,
               replicas_identical=same_everywhere(trained),
               reload_identical=same_everywhere(
                   torch.tensor([torch.equal(trained, replica_bytes(fresh, replicated))])
               ) and torch.equal(trained, replica_bytes(fresh, replicated)),
               tables_only=tables_only(schema, spec, plan, group, step_batch, world,
                                       rank))  # fmt: skip
    finish()


if __name__ == "__main__":
    main()
