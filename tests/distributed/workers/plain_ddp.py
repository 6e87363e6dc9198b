"""Fit the CTR model with Lightning's plain DDP on the ranks; print what happened.

torchrun --nproc_per_node 2 plain_ddp.py OUT_DIR
"""

from __future__ import annotations

import sys

import pytorch_lightning as pl
import torch
from common import SPECS, data, finish, model, part, report


def main() -> None:
    schema, rows = data("train", 4 * 64)
    loader = torch.utils.data.DataLoader([part(rows, i * 64, (i + 1) * 64) for i in range(4)],
                                         batch_size=None)  # fmt: skip
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=sys.argv[1])  # fmt: skip
    try:
        trainer.fit(model(schema, SPECS["int8_cache5"]), train_dataloaders=loader)
        report(outcome="trained")
    except Exception as error:  # noqa: BLE001 - the outcome is the result
        report(outcome="error", type=type(error).__name__, message=str(error))
    finish()


if __name__ == "__main__":
    main()
