"""Fit on the ranks with ShardedTablesStrategy, save a DCP checkpoint, reload it resharded.

    torchrun --nproc_per_node 2 ckpt.py OUT_DIR

Writes OUT_DIR/ckpt (the checkpoint, row-wise shards) and OUT_DIR/pred.pt (the trained
model's logits on a fixed batch), then loads the checkpoint into a fresh model sharded
table-wise and prints a RESULT line comparing its logits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from common import SPECS, data, finish, model, part, report

from ssl_rec.lightning import ShardedTablesStrategy

STEPS, BATCH = 8, 128


def trainer(out: Path, sharding: str) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=2, strategy=ShardedTablesStrategy(sharding),
                      max_steps=STEPS, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=out)  # fmt: skip


def logits(module, batch) -> torch.Tensor:
    module.eval()
    with torch.no_grad():
        return module(batch)


def main() -> None:
    out = Path(sys.argv[1])
    schema, rows = data("train", 2 * STEPS * BATCH)
    batches = [part(rows, i * BATCH, (i + 1) * BATCH) for i in range(2 * STEPS)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    fixed = part(data("test", 512)[1], 0, 512)
    first = trainer(out, "row_wise")
    module = model(schema, SPECS["int8_cache5"])
    first.fit(module, train_dataloaders=loader)
    first.save_checkpoint(out / "ckpt")
    expected = logits(module, fixed)
    if first.global_rank == 0:
        torch.save(expected, out / "pred.pt")
    second = trainer(out, "table_wise")
    fresh = model(schema, SPECS["int8_cache5"])
    second.fit(fresh, train_dataloaders=loader, ckpt_path=out / "ckpt")
    again = logits(fresh, fixed)
    report(
        steps=int(first.global_step),
        resumed_step=int(second.global_step),
        reshard_max_diff=float((again - expected).abs().max()),
    )
    finish()


if __name__ == "__main__":
    main()
