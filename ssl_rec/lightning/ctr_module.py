"""CTRModule: a backbone and a click head trained with binary cross-entropy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from ssl_rec.lightning.checkpoint import load_backbone_weights, unpicklable_hparams
from ssl_rec.lightning.strategy import refuse_unsharded_tables
from ssl_rec.lightning.table_prefetch import TablePrefetch
from ssl_rec.metrics import ctr_metrics
from ssl_rec.models.backbone import Backbone, as_schema
from ssl_rec.models.heads import CTRHead
from ssl_rec.types import Batch

BackboneFactory = Callable[[dict], Backbone]
FinetuneMode = Literal["full", "linear_probe"]


class CTRModule(pl.LightningModule):
    """Click-through-rate prediction: ``logit = head(backbone(batch).pooled)``.

    Embedding tables update themselves in backward (fused optimizer, see
    ``ssl_rec.hardware``); the optimizer built here steps the dense parameters only.

    Args:
        backbone: factory ``schema_dict -> Backbone``; in YAML a ``class_path`` of
            ``ssl_rec.models.Backbone`` with its ``init_args`` (the schema is linked in).
        schema: the data's feature schema as a dict; the CLI links it from ``data.schema``.
        head_hidden: hidden widths of the click head (empty = linear head).
        learning_rate: Adam learning rate of the dense parameters (> 0).
        weight_decay: Adam weight decay (>= 0).
        init_from: path of a checkpoint whose backbone weights initialise this one
            (a pretraining or CTR checkpoint, tables at any precision), or ``None`` to
            start from scratch. The tables' optimizer state restarts, like the dense one.
        finetune: ``full`` trains everything; ``linear_probe`` freezes the backbone
            (embeddings included) and trains the head only.
        embedding_lr: learning rate of the tables' fused optimizer during this run,
            overriding the backbone's ``TableSpec.learning_rate`` (``None`` keeps it); a
            smaller value fine-tunes pretrained embeddings gently.

    Example:
        >>> from functools import partial  # doctest: +SKIP
        >>> factory = partial(Backbone, embedding_dim=16)  # doctest: +SKIP
        >>> module = CTRModule(factory, schema.to_dict())  # doctest: +SKIP

    """

    def __init__(
        self,
        backbone: BackboneFactory,
        schema: dict | None = None,
        head_hidden: list[int] | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.0,
        init_from: str | None = None,
        finetune: FinetuneMode = "full",
        embedding_lr: float | None = None,
    ) -> None:
        super().__init__()
        if schema is None:
            raise ValueError("CTRModule needs `schema` (the CLI links it from data.schema)")
        if learning_rate <= 0:
            raise ValueError(f"CTRModule.learning_rate must be > 0, got {learning_rate}")
        if weight_decay < 0:
            raise ValueError(f"CTRModule.weight_decay must be >= 0, got {weight_decay}")
        if finetune not in ("full", "linear_probe"):
            raise ValueError(
                f"CTRModule.finetune must be 'full' or 'linear_probe', got {finetune!r}"
            )
        if embedding_lr is not None and not embedding_lr > 0:
            raise ValueError(f"CTRModule.embedding_lr must be > 0, got {embedding_lr}")
        schema = as_schema(schema).to_dict()
        self.save_hyperparameters(ignore=unpicklable_hparams("backbone"))
        self.schema = as_schema(schema)
        self.backbone = backbone(schema)
        self.head = CTRHead(self.backbone.dims.output_dim, head_hidden or [])
        if init_from:
            load_backbone_weights(self.backbone, init_from)
            # A fresh table optimizer, like the dense one: pretraining accumulators would
            # shrink the embedding step by an amount that depends on the pretraining objective.
            self.backbone.reset_table_optimizer()
        if embedding_lr is not None:
            self.backbone.set_table_learning_rate(embedding_lr)
        if finetune == "linear_probe":
            self.backbone.requires_grad_(False)
            self.backbone.freeze_tables()
        self.val_metrics = ctr_metrics("val/")
        self.test_metrics = ctr_metrics("test/")

    def setup(self, stage: str) -> None:
        """Refuse multi-process strategies that would replicate the tables (see ``strategy``)."""
        refuse_unsharded_tables(self.trainer, self)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Click logits ``float32[B]`` for ``batch``."""
        return self.head(self.backbone(batch).pooled)

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """BCE loss on one labeled batch."""
        labels = _labels(batch)
        loss = F.binary_cross_entropy_with_logits(self(batch), labels)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.batch_size)
        return loss

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """Accumulate validation metrics."""
        self.val_metrics.update(self(batch), _labels(batch))

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        """Accumulate test metrics."""
        self.test_metrics.update(self(batch), _labels(batch))

    def on_validation_epoch_end(self) -> None:
        """Log and reset validation metrics."""
        self.log_dict(self.val_metrics.compute(), prog_bar=True)
        self.val_metrics.reset()

    def on_test_epoch_end(self) -> None:
        """Log and reset test metrics."""
        self.log_dict(self.test_metrics.compute())
        self.test_metrics.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam over the dense parameters that require grad."""
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.Adam(
            params, lr=self.hparams.learning_rate, weight_decay=self.hparams.weight_decay
        )

    def configure_callbacks(self) -> list[pl.Callback]:
        """The next batch's table admissions overlap this step (see ``TablePrefetch``)."""
        return [TablePrefetch()]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store the feature schema so the checkpoint is readable without the data."""
        checkpoint["feature_schema"] = self.schema.to_dict()


def _labels(batch: Batch) -> torch.Tensor:
    if batch.label is None:
        raise ValueError(
            "CTRModule got a batch without labels; use labeled data (data.use_labels=true)"
        )
    return batch.label
