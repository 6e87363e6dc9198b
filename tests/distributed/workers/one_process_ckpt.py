"""A one-process checkpoint file used by 2 sharded processes: ``init_from`` and resume.

    python one_process_ckpt.py write OUT_DIR SCALE         # one process: OUT_DIR/one.ckpt
    torchrun --nproc_per_node 2 one_process_ckpt.py check OUT_DIR
    torchrun --nproc_per_node 2 one_process_ckpt.py memory OUT_DIR SCALE init_from|resume

``write``: a CTR model (FP32 tables at Criteo cardinalities times SCALE, D = 64) trained 2
steps in one process, saved as ``ssl-rec fit`` saves it (checksums).

``check`` (SCALE 0.001): a declared model built with ``init_from=one.ckpt`` is sharded
row-wise, one table replicated: every shard must start with its rows of the model that
loaded the checkpoint whole, the declared collection must never be allocated, and both must
train with the same losses; a declared model resumed from the file (``fit(ckpt_path=...)``)
must start with its rows of the checkpoint's tables and train on.

``memory`` (row-wise): either, under a data-segment limit (``RLIMIT_DATA``) of the process's
size plus 9/10 of the tables' bytes (880 MB), set before the checkpoint is read: half the
tables and the process group's and DDP's buffers (up to 260 MB here) fit, all the tables do
not.
"""

from __future__ import annotations

import os
import resource
import sys
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from common import TABLES_PATH, data, finish, part, report, vm_data

from ssl_rec.distributed.cyclic_layout import table_pieces
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec, declare_tables
from ssl_rec.lightning import CTRModule, ShardedTablesStrategy
from ssl_rec.lightning.durable_checkpoint_io import DurableCheckpointIO
from ssl_rec.models import Backbone

BATCH, STEPS, DIM = 64, 2, 64
SPEC = TableSpec("fp32", optimizer="rowwise_adagrad", learning_rate=0.05)
CHECK_SPEC = TableSpec("int8", 0.05, "lru", "rowwise_adagrad", 0.05)
REPLICA = {"C3": {"sharding_type": "data_parallel", "ranks": [0, 1]}}


def schema_at(scale: float) -> dict:
    """The Criteo schema at cardinalities times ``scale``."""
    return data("train", 8, scale=scale)[0].to_dict()


def build(schema: dict, spec: TableSpec, init_from: Path | None = None) -> CTRModule:
    """The CTR model (same dense weights everywhere), optionally ``init_from``."""
    torch.manual_seed(0)
    source = None if init_from is None else str(init_from)
    return CTRModule(partial(Backbone, embedding_dim=DIM, tables=spec), schema,
                     init_from=source)  # fmt: skip


def loader(scale: float, steps: int, world: int, skip: int = 0):
    _, rows = data("train", BATCH * (skip + steps) * world, scale=scale)
    first, stop = skip * world, (skip + steps) * world
    batches = [part(rows, i * BATCH, (i + 1) * BATCH) for i in range(first, stop)]
    return torch.utils.data.DataLoader(batches, batch_size=None)


def trainer(
    steps: int, devices: int = 2, callbacks: list | None = None, overrides: dict = REPLICA
) -> pl.Trainer:
    sharded = ShardedTablesStrategy("row_wise", table_overrides=overrides)
    strategy = sharded if devices > 1 else "auto"
    return pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=steps,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, plugins=[DurableCheckpointIO()],
                      callbacks=callbacks or [])  # fmt: skip


class Capture(pl.Callback):
    """Whether every shard starts with its rows of ``reference``; the per-step losses."""

    def __init__(self, reference: MixedPrecisionEmbeddingCollection | None) -> None:
        self.reference = reference
        self.starts_equal = True
        self.losses: list[float] = []

    def on_train_start(self, trainer, pl_module) -> None:  # noqa: D102 - after any restore
        if self.reference is None:
            return
        for shard in pl_module.get_submodule(TABLES_PATH).local_shards():
            whole = table_pieces(self.reference.group.tables[shard.stream])
            j, n = shard.row_offset, shard.row_stride
            for key, piece in table_pieces(shard).items():
                rows = whole[key][j::n] if whole[key].shape[0] else whole[key]
                self.starts_equal &= torch.equal(piece, rows)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: D102
        loss = outputs["loss"].detach().clone()
        dist.all_reduce(loss)
        self.losses.append(float(loss) / dist.get_world_size())


def all_ranks(flag: bool) -> bool:
    value = torch.tensor([int(flag)])
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return bool(value)


def write(out: Path, scale: float) -> None:
    module = build(schema_at(scale), SPEC if scale >= 0.01 else CHECK_SPEC)
    fitter = trainer(STEPS, devices=1)
    fitter.fit(module, train_dataloaders=loader(scale, STEPS, 1))
    fitter.save_checkpoint(out / "one.ckpt")
    total = module.get_submodule(TABLES_PATH).memory_report()["total"]
    report(table_bytes=total["total_bytes"] + total["optimizer_state"],
           file_bytes=(out / "one.ckpt").stat().st_size)  # fmt: skip
    os._exit(0)


def saved_tables(path: Path) -> MixedPrecisionEmbeddingCollection:
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    prefix = f"{TABLES_PATH}."
    return MixedPrecisionEmbeddingCollection.from_state_dict(
        {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    )


def check(out: Path) -> None:
    scale, world = 0.001, dist.get_world_size()
    ckpt, schema = out / "one.ckpt", schema_at(scale)
    whole = build(schema, CHECK_SPEC, ckpt)  # the checkpoint loaded whole, as one process
    reference = whole.get_submodule(TABLES_PATH)
    reference_copy = MixedPrecisionEmbeddingCollection.from_state_dict(reference.state_dict())
    with declare_tables():
        module = build(schema, CHECK_SPEC, ckpt)
    declared = module.get_submodule(TABLES_PATH)
    pending = declared._pending is not None
    capture = Capture(reference_copy)
    trainer(STEPS + 1, callbacks=[capture]).fit(module, train_dataloaders=loader(scale, 3, world))
    baseline = Capture(None)
    trainer(STEPS + 1, callbacks=[baseline]).fit(whole, train_dataloaders=loader(scale, 3, world))
    with declare_tables():
        resumed = build(schema, CHECK_SPEC)
    restored = Capture(saved_tables(ckpt))
    fitter = trainer(STEPS + 2, callbacks=[restored])
    fitter.fit(resumed, train_dataloaders=loader(scale, 2, world, skip=STEPS), ckpt_path=ckpt)
    report(init_pending=all_ranks(pending), never_allocated=all_ranks(declared.declared),
           init_starts_equal=all_ranks(capture.starts_equal), losses=capture.losses,
           whole_losses=baseline.losses, resume_starts_equal=all_ranks(restored.starts_equal),
           resumed_losses=restored.losses, resumed_step=int(fitter.global_step))  # fmt: skip
    finish()


def memory(out: Path, scale: float, phase: str) -> None:
    import torchrec  # noqa: F401 - imported before the limit, as the strategy would

    world, schema = dist.get_world_size(), schema_at(scale)
    data_loader = loader(scale, 1, world)  # the data is made before the limit
    with declare_tables():
        total = build(schema, SPEC).get_submodule(TABLES_PATH).memory_report()["total"]
    table_bytes = total["total_bytes"] + total["optimizer_state"]
    limit = vm_data() + 9 * table_bytes // 10  # below all tables, above half plus gloo's
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    ckpt = out / "one.ckpt"
    capture = Capture(None)
    fitter = trainer(STEPS + 1, callbacks=[capture], overrides={})
    try:
        with declare_tables():
            module = build(schema, SPEC, ckpt if phase == "init_from" else None)
        fitter.fit(module, train_dataloaders=data_loader,
                   ckpt_path=ckpt if phase == "resume" else None)  # fmt: skip
    except MemoryError as error:
        report(phase=phase, outcome="error", type=type(error).__name__, message=str(error))
        finish()
    held = sum(t.memory()["total_bytes"] + t.memory()["optimizer_state"]
               for t in module.get_submodule(TABLES_PATH).local_shards())  # fmt: skip
    report(phase=phase, outcome="trained", table_bytes=table_bytes, held_bytes=held,
           losses=capture.losses, step=int(fitter.global_step))  # fmt: skip
    finish()


if __name__ == "__main__":
    mode, target = sys.argv[1], Path(sys.argv[2])
    if mode == "write":
        write(target, float(sys.argv[3]))
    dist.init_process_group("gloo")
    if mode == "check":
        check(target)
    else:
        memory(target, float(sys.argv[3]), sys.argv[4])
