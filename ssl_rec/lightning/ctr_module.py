"""CTRModule: a backbone and a click head trained with binary cross-entropy."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F

from ssl_rec.lightning.checkpoint_loading import load_backbone_weights
from ssl_rec.lightning.module_config import BackboneFactory, backbone_factory, module_hparams
from ssl_rec.lightning.standalone import StandaloneModule
from ssl_rec.metrics import ctr_metrics
from ssl_rec.models.backbone import as_schema
from ssl_rec.models.heads import CTRHead
from ssl_rec.types import Batch

FinetuneMode = Literal["full", "linear_probe"]


class CTRModule(StandaloneModule):
    """Click-through-rate prediction: ``logit = head(backbone(batch).pooled)``.

    Embedding tables update themselves in backward (fused optimizer, see
    ``ssl_rec.hardware``); the optimizer built here steps the dense parameters only.

    The checkpoint stands alone: its hyperparameters are this constructor's arguments as
    plain values (the backbone as a ``class_path`` dict, ``init_from`` cleared), and it
    holds the schema and the vocabulary, so ``CTRModule.load_from_checkpoint(path)`` needs
    neither the data nor the pretraining checkpoint.

    Args:
        backbone: factory ``schema_dict -> Backbone`` (a class or ``functools.partial``), or
            its config ``{"class_path": "ssl_rec.models.Backbone", "init_args": {...}}``;
            in YAML the ``class_path`` form (the schema is linked in).
        schema: the data's feature schema as a dict; the CLI links it from ``data.schema``.
        head_hidden: hidden widths of the click head (empty = linear head).
        learning_rate: Adam learning rate of the dense parameters (> 0).
        weight_decay: Adam weight decay (>= 0).
        init_from: path of a checkpoint whose backbone weights and vocabulary initialise
            this one (a pretraining or CTR checkpoint, tables at any precision), or
            ``None`` to start from scratch. The data must be encoded with that checkpoint's
            vocabulary (``ssl-rec fit`` does it); rows are never attached by position
            alone. The tables' optimizer state restarts, like the dense one. Recorded as
            provenance (file name and hash); loading this module's checkpoint never reads it.
        finetune: ``full`` trains everything; ``linear_probe`` freezes the backbone
            (embeddings included) and trains the head only.
        embedding_lr: learning rate of the tables' fused optimizer during this run,
            overriding the backbone's ``TableSpec.learning_rate`` (``None`` keeps it); a
            smaller value fine-tunes pretrained embeddings gently.

    Example:
        >>> from functools import partial
        >>> from ssl_rec.models import Backbone
        >>> from ssl_rec.schema import CategoricalField, FeatureSchema
        >>> schema = FeatureSchema(["price"], [CategoricalField("user", 10)], "label")
        >>> module = CTRModule(partial(Backbone, embedding_dim=16), schema.to_dict())
        >>> module.hparams.backbone["class_path"]
        'ssl_rec.models.backbone.Backbone'
        >>> CTRModule.load_from_checkpoint("runs/ctr/checkpoints/last.ckpt")  # doctest: +SKIP

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
        factory = backbone_factory(backbone, "CTRModule")
        self.schema = as_schema(schema)
        schema = self.schema.to_dict()
        self.save_hyperparameters(module_hparams(
            self, backbone=backbone, schema=schema, head_hidden=list(head_hidden or []),
            learning_rate=learning_rate, weight_decay=weight_decay, init_from=None,
            finetune=finetune, embedding_lr=embedding_lr,
        ))  # fmt: skip
        self.backbone = factory(schema)
        self.head = CTRHead(self.backbone.dims.output_dim, head_hidden or [])
        self.provenance: dict[str, Any] = {}
        if init_from:
            source = load_backbone_weights(self.backbone, init_from, self.schema)
            self.provenance["init_from"] = source
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

    def predict_step(self, batch: Batch, batch_idx: int) -> dict[str, torch.Tensor]:
        """Click probability ``float32[B]`` and ``row_id int64[B]`` of each row (and its label)."""
        out = {"probability": torch.sigmoid(self(batch)).float()}
        if batch.row_id is not None:
            out["row_id"] = batch.row_id
        if batch.label is not None:
            out["label"] = batch.label
        return out

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


def _labels(batch: Batch) -> torch.Tensor:
    if batch.label is None:
        raise ValueError(
            "CTRModule got a batch without labels; use labeled data (data.use_labels=true)"
        )
    return batch.label
