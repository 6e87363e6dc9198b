"""Train column-wise, replicated, row-wise and whole tables on the ranks and in one process.

    torchrun --nproc_per_node 2 column_wise.py OUT_DIR

Every rank trains the sharded collection on its half of 50 global batches and, beside it,
one unsharded collection on the whole global batches (the reference). The loss is a mean
over samples of a sum of one fixed function of each table's row, and each rank's local batch
is a power of two, so the tables' gradients are the same numbers on both sides. The replica
sums each row's gradient along the ranks in sample order, as one process does. Prints one
RESULT line: both runs' losses, whether every sample's loss is the same, the replica's gap
(bytes and values), whether every shard's state (the replica's included) equals its rows
(its column blocks) of the reference tables, and whether a checkpoint written by the ranks
reads back into one process and into freshly sharded tables with the same state, and
whether one process's state, read mapped from a file into declared tables, gives every
shard its rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from common import finish, report
from torch import nn

from ssl_rec.distributed.cyclic_layout import table_pieces
from ssl_rec.distributed.table_placement import TablePlacement
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec, declare_tables
from ssl_rec.lightning.mapped_checkpoint import map_checkpoint_file

STEPS, LOCAL_BATCH, DIM = 50, 64, 16
CARDS = [3000, 20000, 500, 1200, 8000]
NAMES = ["cw2", "cw4", "replica", "whole_blocked", "row_wise"]
INT8 = TableSpec("int8", 0.05, "lru", "rowwise_adagrad", 0.05)
SPECS = [
    TableSpec(**{**INT8.to_dict(), "column_blocks": 2}),
    TableSpec(**{**INT8.to_dict(), "column_blocks": 4}),
    INT8,
    TableSpec(**{**INT8.to_dict(), "column_blocks": 2}),
    INT8,
]
PLAN = {
    "cw2": TablePlacement("column_wise", (0, 1)),
    "cw4": TablePlacement("column_wise", (1, 0)),
    "replica": TablePlacement("data_parallel", (0, 1)),
    "whole_blocked": TablePlacement("table_wise", (1,)),
    "row_wise": TablePlacement("row_wise", (0, 1)),
}
WEIGHT = torch.linspace(-1.0, 1.0, len(CARDS) * DIM).view(len(CARDS), DIM)


def collection(seed: int = 7) -> MixedPrecisionEmbeddingCollection:
    return MixedPrecisionEmbeddingCollection(CARDS, DIM, SPECS, seed=seed, table_names=NAMES)


def batch(step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: skewed ids int64[rows, F] and targets float32[rows]."""
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.stack([(torch.rand(rows, generator=gen) ** 3 * c).long() for c in CARDS], 1)
    return ids, (ids % 7).float().sum(1) / 10 - 1


def sample_losses(rows: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """float32[B]: each sample's sum of one term per table (a table's gradient does not depend
    on the others' rows)."""
    return ((rows * WEIGHT).sum(2) - target[:, None]).pow(2).sum(1)


def shard(tables: MixedPrecisionEmbeddingCollection, group) -> nn.Module:
    from torchrec.distributed.types import ShardingEnv

    from ssl_rec.distributed.sharder import MixedPrecisionCollectionSharder, shard_collections

    root = nn.Module()
    root.tables = tables
    env = ShardingEnv.from_process_group(group)
    shard_collections(root, {"tables": PLAN}, env, MixedPrecisionCollectionSharder())
    return root.tables


def train(module, rank: int, world: int, global_batch: int) -> tuple[list[float], torch.Tensor]:
    """Train 50 steps on this rank's part of each global batch (all of it for one process).

    Returns:
        Each step's loss (the mean of the global batch's sample losses, taken alike for any
        number of ranks) and float32[STEPS, global_batch] every sample's loss.

    """
    losses, every, local = [], [], global_batch // world
    for step in range(STEPS):
        ids, target = batch(step, global_batch)
        mine = slice(rank * local, (rank + 1) * local)
        per_sample = sample_losses(module(ids[mine]), target[mine])
        loss = per_sample.mean()
        loss.backward()
        samples = per_sample.detach()
        if world > 1:
            gathered = [torch.empty_like(samples) for _ in range(world)]
            dist.all_gather(gathered, samples)
            samples = torch.cat(gathered)
        losses.append(float(samples.mean()))
        every.append(samples)
    return losses, torch.stack(every)


def shards_match(sharded, reference: MixedPrecisionEmbeddingCollection) -> bool:
    """Every shard's store, optimizer state and cache equal its rows of the reference."""
    same = True
    for t in range(len(CARDS)):
        shard_table, j, n = sharded._shard_of(t)
        if shard_table is None:
            continue
        whole = table_pieces(reference.group.tables[t])
        for key, piece in table_pieces(shard_table).items():
            expected = whole[key][j::n] if whole[key].shape[0] else whole[key]
            same &= torch.equal(piece, expected)
    flag = torch.tensor([int(same)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag)


def replica_gap(sharded, reference: MixedPrecisionEmbeddingCollection) -> dict:
    """Whether the replica's tensors equal the reference table's, and its largest differences."""
    index = NAMES.index("replica")
    mine = table_pieces(sharded._shard_of(index)[0])
    theirs = table_pieces(reference.group.tables[index])
    decisions = all(torch.equal(mine[k], theirs[k]) for k in ("cache.tags", "cache.state"))
    values = sharded.float_weights()[index] - reference.float_weights()[index]
    momentum = mine["momentum"] - theirs["momentum"]
    return {"replica_decisions_same": decisions,
            "replica_bytes_same": mine.keys() == theirs.keys()
            and all(torch.equal(mine[k], theirs[k]) for k in mine),
            "replica_value_gap": float(values.abs().max()),
            "replica_momentum_gap": float(momentum.abs().max())}  # fmt: skip


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor)
    )


def main() -> None:
    from ssl_rec.distributed.dcp_checkpoint import (
        load_distributed_checkpoint,
        read_distributed_checkpoint,
        save_distributed_checkpoint,
    )

    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    group = dist.new_group(backend="gloo")
    sharded = shard(collection(), group).train()
    reference = collection().train()
    losses, samples = train(sharded, rank, world, LOCAL_BATCH * world)
    reference_losses, reference_samples = train(reference, 0, 1, LOCAL_BATCH * world)
    replica = replica_gap(sharded, reference)
    ids, _ = batch(STEPS, LOCAL_BATCH * world)
    mine = ids[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]
    sharded.eval(), reference.eval()
    lookup_same = torch.equal(sharded(mine), reference(mine))
    pairs = zip(sharded.float_weights(), reference.float_weights(), strict=True)
    weights_same = all(torch.equal(a, b) for a, b in pairs)
    save_distributed_checkpoint({"state_dict": sharded.state_dict()}, out / "ckpt", group)
    one_process = None
    if rank == 0:
        saved = read_distributed_checkpoint(out / "ckpt")["state_dict"]
        one_process = states_equal(
            MixedPrecisionEmbeddingCollection.from_state_dict(saved).state_dict(),
            reference.state_dict(),
        )
    fresh = shard(collection(seed=3), group)
    loaded = load_distributed_checkpoint(out / "ckpt", fresh.state_dict(), group)
    fresh.load_state_dict(loaded["state_dict"])
    from_plain = shard(collection(seed=5), group)
    from_plain.load_state_dict(reference.state_dict())
    if rank == 0:  # one process's state as a file; the ranks read its tables mapped
        torch.save({"state_dict": reference.state_dict()}, out / "one.pt")
    dist.barrier()
    with declare_tables():
        declared = collection(seed=5)
    declared.load_state_dict(map_checkpoint_file(out / "one.pt")["state_dict"])  # pending
    from_pending = shard(declared, group)
    report(
        losses=losses,
        reference_losses=reference_losses,
        sample_losses_same=torch.equal(samples, reference_samples),
        **replica,
        types={name: p.sharding_type for name, p in PLAN.items()},
        shards_match=shards_match(sharded, reference),
        lookup_same=lookup_same,
        weights_same=weights_same,
        checkpoint_in_one_process=one_process,
        checkpoint_resharded=shards_match(fresh, reference),
        one_process_state_sharded=shards_match(from_plain, reference),
        pending_state_sharded=shards_match(from_pending, reference) and declared.declared,
    )
    finish()


if __name__ == "__main__":
    main()
