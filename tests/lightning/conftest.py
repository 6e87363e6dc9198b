"""``fit_synthetic_ctr``: a seeded, quiet CTR fit on a few hundred synthetic rows."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl

from ssl_rec.data import SyntheticConfig, SyntheticCTRDataModule
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.models import Backbone, DLRMEncoder


def _fit_synthetic_ctr(
    root: Path,
    callbacks: list[pl.Callback],
    *,
    n_train: int,
    n_val: int,
    tables: TableSpec,
    hidden: int,
    ckpt_path: str | Path | None = None,
    module_args: dict[str, Any] | None = None,
    **trainer_args: Any,
) -> tuple[pl.Trainer, CTRModule]:
    """Seed everything with 0 and fit a DLRM ``CTRModule`` on synthetic clicks.

    Args:
        root: the trainer's ``default_root_dir``; the data cache is ``root / "cache"``.
        callbacks: the trainer's callbacks.
        n_train: training rows (validation ``n_val``, test 64; batches of 128 rows).
        n_val: validation rows.
        tables: the embedding tables' spec (dimension 8).
        hidden: the DLRM bottom MLP's width; the top MLP's is ``2 * hidden``.
        ckpt_path: a checkpoint to resume from.
        module_args: more ``CTRModule`` arguments.
        **trainer_args: more ``pl.Trainer`` arguments (limits, checkpointing); no logger,
            progress bar, model summary or sanity validation.

    Returns:
        The trainer after ``fit`` and the module it trained.

    """
    pl.seed_everything(0)
    data = SyntheticCTRDataModule(
        n_train=n_train, n_val=n_val, n_test=64, batch_size=128, cache_dir=str(root / "cache"),
        synthetic=SyntheticConfig(cardinality_scale=0.0002),
    )  # fmt: skip
    encoder = partial(DLRMEncoder, bottom=(hidden,), top=(2 * hidden,))
    backbone = partial(Backbone, embedding_dim=8, tables=tables, encoder=encoder)
    module = CTRModule(backbone, data.schema.to_dict(), **(module_args or {}))
    trainer = pl.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=root, callbacks=callbacks, **trainer_args,
    )  # fmt: skip
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module


@pytest.fixture(scope="session")
def fit_synthetic_ctr() -> Callable[..., tuple[pl.Trainer, CTRModule]]:
    """``fit_synthetic_ctr(root, callbacks, *, n_train, n_val, tables, hidden, ...)``: see above."""
    return _fit_synthetic_ctr
