"""Shard-local construction: tables declared without memory, each rank allocating its rows.

    torchrun --nproc_per_node 2 shard_local.py check
    torchrun --nproc_per_node 2 shard_local.py memory   # or: python shard_local.py memory

``check``: the CTR model is built under ``declare_tables()`` and sharded row-wise; every rank
must hold only its rows, with the initial values of the unsharded tables, and train like a
model whose tables were allocated whole before sharding.

``memory``: tables of about 880 MB under a data-segment limit (``RLIMIT_DATA``) of the
process's size plus 3/4 of the tables' bytes: on 2 processes each rank allocates half and
trains; one process must fail with the table's ``TableMemoryError``.
"""

from __future__ import annotations

import os
import resource
import sys
from functools import partial

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from common import SPECS, TABLES_PATH, data, finish, part, report, vm_data

from ssl_rec.hardware import TableSpec, declare_tables
from ssl_rec.lightning import CTRModule, ShardedTablesStrategy
from ssl_rec.models import Backbone

BATCH, CHECK_STEPS, MEMORY_STEPS = 64, 3, 3
MEMORY_SCALE, MEMORY_DIM = 0.1, 64


def build(schema, spec: TableSpec, dim: int = 16) -> CTRModule:
    """The parity model (same dense weights on every rank)."""
    torch.manual_seed(0)
    return CTRModule(partial(Backbone, embedding_dim=dim, tables=spec), schema.to_dict())


class Capture(pl.Callback):
    """Records this rank's shards right after the strategy built them (before any step)."""

    def __init__(self, keep_stores: bool = True) -> None:
        self.keep_stores = keep_stores
        self.shards: list = []
        self.losses: list[float] = []

    def on_fit_start(self, trainer, pl_module) -> None:  # noqa: D102
        sharded = pl_module.get_submodule(TABLES_PATH)
        self.shards = [(t.stream, t.row_offset, t.row_stride, t.num_rows,
                        t.store.clone() if self.keep_stores else None)
                       for t in sharded.local_shards()]  # fmt: skip

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: D102
        loss = outputs["loss"].detach().clone()
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world > 1:
            dist.all_reduce(loss)
        self.losses.append(float(loss) / world)


def trainer(steps: int, callbacks: list, devices: int = 2, strategy=None) -> pl.Trainer:
    strategy = ShardedTablesStrategy("row_wise") if strategy is None else strategy
    return pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=steps,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=callbacks)  # fmt: skip


def loader(rows, steps: int, world: int):
    batches = [part(rows, i * BATCH, (i + 1) * BATCH) for i in range(steps * world)]
    return torch.utils.data.DataLoader(batches, batch_size=None)


def check() -> None:
    world = int(os.environ["WORLD_SIZE"])
    schema, rows = data("train", BATCH * CHECK_STEPS * world)
    spec = SPECS["int8_cache5"]
    allocated = build(schema, spec)  # tables allocated whole: sliced when sharded
    reference = [t.store.clone() for t in allocated.get_submodule(TABLES_PATH).group.tables]
    with declare_tables():
        module = build(schema, spec)
    declared = module.get_submodule(TABLES_PATH)
    capture = Capture()
    trainer(CHECK_STEPS, [capture]).fit(module, train_dataloaders=loader(rows, CHECK_STEPS, world))
    identical = all(torch.equal(store, reference[stream][offset::stride])
                    for stream, offset, stride, _, store in capture.shards)  # fmt: skip
    held = torch.tensor([sum(n for *_, n, _ in capture.shards)])
    gathered = [torch.zeros_like(held) for _ in range(world)]
    dist.all_gather(gathered, held)
    flags = torch.tensor([int(identical), int(declared.declared)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    baseline = Capture(keep_stores=False)
    trainer(CHECK_STEPS, [baseline]).fit(
        allocated, train_dataloaders=loader(rows, CHECK_STEPS, world)
    )
    report(rows_held=[int(g) for g in gathered], total_rows=sum(declared.cardinalities),
           identical_init=bool(flags[0]), never_allocated=bool(flags[1]),
           losses=capture.losses, allocated_losses=baseline.losses)  # fmt: skip
    finish()


def memory() -> None:
    import torchrec  # noqa: F401 - imported before the limit, as the strategy would

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # the process group's threads and buffers exist before the limit is measured
        dist.init_process_group("gloo")
    spec = TableSpec("fp32", optimizer="rowwise_adagrad", learning_rate=0.05)
    schema, rows = data("train", BATCH * MEMORY_STEPS * world, scale=MEMORY_SCALE)
    with declare_tables():
        module = build(schema, spec, MEMORY_DIM)
    total = module.get_submodule(TABLES_PATH).memory_report()["total"]
    table_bytes = total["total_bytes"] + total["optimizer_state"]
    limit = vm_data() + 3 * table_bytes // 4
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    capture = Capture(keep_stores=False)
    if world > 1:
        fitter = trainer(MEMORY_STEPS, [capture])
    else:  # one process: the default single-device trainer, tables allocated at first use
        fitter = trainer(MEMORY_STEPS, [], devices=1, strategy="auto")
    try:
        fitter.fit(module, train_dataloaders=loader(rows, MEMORY_STEPS, world))
    except MemoryError as error:
        report(world=world, outcome="error", type=type(error).__name__, message=str(error),
               table_bytes=table_bytes)  # fmt: skip
        finish()
    held = sum(t.memory()["total_bytes"] + t.memory()["optimizer_state"]
               for t in module.get_submodule(TABLES_PATH).local_shards())  # fmt: skip
    report(world=world, outcome="trained", table_bytes=table_bytes, held_bytes=held,
           losses=capture.losses)  # fmt: skip
    finish()


if __name__ == "__main__":
    if sys.argv[1] == "check":
        check()
    else:
        memory()
