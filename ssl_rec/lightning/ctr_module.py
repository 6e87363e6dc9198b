"""CTRModule: a backbone and a click head trained with binary cross-entropy."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from pytorch_lightning.utilities.rank_zero import rank_zero_info

from ssl_rec.lightning.checkpoint_loading import load_backbone_weights
from ssl_rec.lightning.module_config import (
    BackboneFactory,
    backbone_factory,
    build_objectives,
    module_hparams,
)
from ssl_rec.lightning.objective_set import ObjectiveModule, check_objectives
from ssl_rec.lightning.transfer_schedule import (
    TransferParts,
    apply_backbone_freeze,
    check_transfer_settings,
    dense_parameter_groups,
    regroup_optimizer_state,
)
from ssl_rec.lightning.wide_prefit import WideFitState, count_wide_ids, start_wide_term
from ssl_rec.metrics import ctr_metrics
from ssl_rec.models.backbone import as_schema
from ssl_rec.models.heads import CTRHead
from ssl_rec.models.wide import wide_term
from ssl_rec.objectives.base import Objective
from ssl_rec.types import Batch

FinetuneMode = Literal["full", "linear_probe"]
WideInit = Literal["zero", "logistic", "auto"]


class CTRModule(ObjectiveModule):
    """Click-through-rate prediction: ``logit = head(backbone(batch).pooled)``.

    Self-supervised objectives may join as auxiliary losses (joint training): the training
    loss is the binary cross-entropy over the rows whose label is finite plus
    ``sum_i weight_i * objective_i(batch, backbone)`` over all rows, composed as
    ``PretrainModule`` composes them. Rows labeled NaN (semi-supervised batches, see
    ``ArrowDataModule.unlabeled_per_batch``) feed the objectives only. Validation, test and
    prediction use the click head alone.

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
        objectives: name -> self-supervised objective added to the training loss (an
            instance or a ``class_path`` dict); names appear in log keys
            (``train/{name}/{metric}``). Adversarial objectives (those with generator
            parameters) are refused: train them with ``PretrainModule``.
        objective_weights: name -> weight of each objective's loss (default 1; ``>= 0``).
        wide: add Wide & Deep's linear term to the logit (:class:`~ssl_rec.models.WideTerm`:
            a learned scalar per id of every field, in tables trained by each field's fused
            optimizer, plus a linear map of the dense features); ``False`` (default) is the
            deep model alone.
        transfer: what ``init_from`` gives: ``backbone`` (default) its tables, ``[MASK]``
            tokens, encoder and dense statistics; ``tables`` the tables and ``[MASK]`` tokens
            only, with a fresh encoder (which may be another class or size).
        encoder_lr_scale: the backbone's dense parameters (encoder, ``[MASK]`` tokens) step
            at ``learning_rate * encoder_lr_scale`` and the head at ``learning_rate``
            (``> 0``; 1 = one learning rate; the tables follow ``embedding_lr``).
        freeze_backbone_epochs: train the head alone (backbone and tables frozen) for the
            first ``N`` epochs, then everything: linear probing then fine-tuning (LP-FT,
            Kumar et al., ICLR 2022). ``0`` (default) fine-tunes from the first step. The
            phase follows the trainer's epoch, so a resumed run stays in its phase. Needs
            ``finetune=full`` and no objectives. See
            :mod:`ssl_rec.lightning.transfer_schedule`.
        wide_init: how the wide term starts: ``zero``, ``logistic`` (fitted as logistic
            regression on the labeled rows and held) or ``auto`` (``logistic`` where labeled
            rows are few: :func:`~ssl_rec.lightning.wide_prefit.wide_auto_start_reason`).
        wide_counts: the wide term also has a slope per field on how often the row's id
            occurs in the rows the fit reads (:class:`~ssl_rec.models.id_counts.IdCountFeatures`:
            the labeled rows, and the unlabeled ones of a semi-supervised fit), counted by the
            data module (``id_counts()``) when the fit starts and saved with the weights.
            Part of the wide term: without one (``wide=false``) it does nothing.
        wide_factors: ``K > 0`` adds slopes on rank-``K`` factors of how often two fields'
            ids occur together in those same rows (the truncated SVD of their log counts,
            :class:`~ssl_rec.models.cooccurrence_factors.CooccurrenceFactors`): who is alike,
            learned without labels. Counted by the data module (``id_pair_counts()``) when
            the fit starts and saved with the weights; ``0`` (default) is off. Part of the
            wide term, like ``wide_counts``.
        wide_factor_fields: the two fields of ``wide_factors`` by name; default the two with
            the most ids (users and items, in a recommender's logs; a table of one field has
            no pair, and the default then adds no factors).

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
        objectives: dict[str, Objective] | None = None,
        objective_weights: dict[str, float] | None = None,
        wide: bool = False,
        transfer: TransferParts = "backbone",
        encoder_lr_scale: float = 1.0,
        freeze_backbone_epochs: int = 0,
        wide_init: WideInit = "zero",
        wide_counts: bool = False,
        wide_factors: int = 0,
        wide_factor_fields: list[str] | None = None,
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
        if wide_init not in ("zero", "logistic", "auto"):
            raise ValueError(
                f"CTRModule.wide_init must be 'zero', 'logistic' or 'auto', got {wide_init!r}"
            )
        if wide_factors < 0:
            raise ValueError(f"CTRModule.wide_factors must be >= 0, got {wide_factors}")
        if wide_init == "logistic" and not wide:
            raise ValueError("CTRModule.wide_init='logistic' fits the wide term: set wide=true")
        check_transfer_settings(
            transfer, encoder_lr_scale, freeze_backbone_epochs, finetune, bool(objectives)
        )
        factory = backbone_factory(backbone, "CTRModule")
        objectives = build_objectives(objectives or {}, "CTRModule")
        weights = check_objectives(
            objectives, objective_weights, "CTRModule", "objective_weights", required=False
        )
        if objectives and finetune == "linear_probe":
            raise ValueError(
                f"CTRModule: objectives {sorted(objectives)} cannot train a frozen backbone "
                "(finetune=linear_probe); use finetune=full or drop the objectives"
            )
        self.schema = as_schema(schema)
        schema = self.schema.to_dict()
        self.save_hyperparameters(module_hparams(
            self, backbone=backbone, schema=schema, head_hidden=list(head_hidden or []),
            learning_rate=learning_rate, weight_decay=weight_decay, init_from=None,
            finetune=finetune, embedding_lr=embedding_lr, objectives=objectives or None,
            objective_weights=objective_weights, wide=bool(wide), transfer=transfer,
            encoder_lr_scale=float(encoder_lr_scale), freeze_backbone_epochs=freeze_backbone_epochs,
            wide_init=wide_init, wide_counts=bool(wide_counts), wide_factors=int(wide_factors),
            wide_factor_fields=list(wide_factor_fields) if wide_factor_fields else None,
        ))  # fmt: skip
        self.backbone = factory(schema)
        self.head = CTRHead(self.backbone.dims.output_dim, head_hidden or [])
        self.wide = (
            wide_term(self.backbone, bool(wide_counts), int(wide_factors), wide_factor_fields)
            if wide
            else None
        )
        if self.wide is not None and wide_factors and self.wide.factors is None:
            # A shipped config on a one-field table: nothing to pair, not an error.
            rank_zero_info("wide_factors: the table has one categorical field, no pair to factor")
        if self.wide is not None and wide_init != "zero":
            # saved with the weights, so a resumed fit keeps what its first start decided
            self.register_buffer("wide_fit_state", torch.tensor(WideFitState.pending))
        self.provenance: dict[str, Any] = {}
        self._schedule_frozen: list[torch.nn.Parameter] = []
        if init_from:
            source = load_backbone_weights(self.backbone, init_from, self.schema, transfer)
            self.provenance["init_from"] = source
            # A fresh table optimizer, like the dense one: pretraining accumulators would
            # shrink the embedding step by an amount that depends on the pretraining objective.
            self.backbone.reset_table_optimizer()
        if embedding_lr is not None:
            self.backbone.set_table_learning_rate(embedding_lr)
        if finetune == "linear_probe":
            self.backbone.requires_grad_(False)
            self.backbone.freeze_tables()
        self.compose_objectives(objectives, weights)
        if self.adversarial:
            name = self.adversarial[0]
            raise ValueError(
                f"CTRModule.objectives[{name!r}] ({type(objectives[name]).__name__}) trains a "
                "generator adversarially, which CTRModule does not support; use it in "
                "PretrainModule, or another objective here"
            )
        self.val_metrics = ctr_metrics("val/")
        self.test_metrics = ctr_metrics("test/")

    def forward(self, batch: Batch) -> torch.Tensor:
        """Click logits ``float32[B]`` for ``batch``."""
        logits = self.head(self.backbone(batch).pooled)
        return logits if self.wide is None else logits + self.wide(batch.sparse, batch.dense)

    def click_loss(self, batch: Batch) -> tuple[torch.Tensor, int]:
        """Mean BCE over the rows of ``batch`` whose label is finite, and how many there are.

        Rows labeled NaN (unlabeled) are not fed to the click head; a batch without a
        finite label gives a zero loss.

        Raises:
            ValueError: the batch has unlabeled rows and this module has no objective.

        """
        labels = _labels(batch)
        finite = torch.isfinite(labels)
        labeled = int(finite.sum())
        if labeled == batch.batch_size:
            return F.binary_cross_entropy_with_logits(self(batch), labels), labeled
        if not self.objectives:
            raise ValueError(
                f"CTRModule got a batch with {batch.batch_size - labeled} unlabeled rows "
                "(label NaN) but has no objectives: unlabeled rows need an objective "
                "(model.objectives), or train on labeled rows only (data.unlabeled_per_batch 0)"
            )
        if not labeled:
            return labels.new_zeros(()), 0
        return F.binary_cross_entropy_with_logits(
            self(batch.rows(finite.nonzero().squeeze(1))), labels[finite]
        ), labeled

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """BCE over the labeled rows plus the weighted objectives over all rows."""
        loss, labeled = self.click_loss(batch)
        if self.objectives:
            self.log("train/ctr_loss", loss, batch_size=max(labeled, 1))
            loss = loss + self.objective_loss(batch, "train")
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
        """Adam over the dense parameters that require grad (the backbone's at its own rate).

        Under a freezing schedule the backbone's parameters are held while frozen too, so
        the optimizer's state has one layout in both phases.
        """
        groups = dense_parameter_groups(
            self, self.backbone, self.hparams.learning_rate, self.hparams.encoder_lr_scale,
            scheduled=self.hparams.freeze_backbone_epochs > 0,
        )  # fmt: skip
        return torch.optim.Adam(groups, weight_decay=self.hparams.weight_decay)

    def on_fit_start(self) -> None:
        """Count the ids (and id pairs), then start the wide term as ``wide_init`` says.

        Each happens once: what a checkpoint brings is kept.
        """
        if self.wide is not None:
            count_wide_ids(self, self.wide)
        if self.wide is not None and self.hparams.wide_init != "zero":
            start_wide_term(self, self.wide, self.wide_fit_state, self.hparams.wide_init)

    @property
    def backbone_frozen_by_schedule(self) -> bool:
        """Whether the trainer's epoch is one of the first ``freeze_backbone_epochs``."""
        return self.current_epoch < self.hparams.freeze_backbone_epochs

    def on_train_epoch_start(self) -> None:
        """Enter the freezing schedule's phase of this epoch (``freeze_backbone_epochs``)."""
        epochs = self.hparams.freeze_backbone_epochs
        if epochs:
            apply_backbone_freeze(self.backbone, self._schedule_frozen, self.current_epoch < epochs)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the artifact, and fit a resumed optimizer state to this run's groups."""
        super().on_load_checkpoint(checkpoint)
        states = checkpoint.get("optimizer_states") or []
        if len(states) == 1:  # another encoder_lr_scale may have split the groups otherwise
            groups = dense_parameter_groups(
                self, self.backbone, self.hparams.learning_rate, self.hparams.encoder_lr_scale,
                scheduled=self.hparams.freeze_backbone_epochs > 0,
            )  # fmt: skip
            regroup_optimizer_state(states[0], groups)


def _labels(batch: Batch) -> torch.Tensor:
    if batch.label is None:
        raise ValueError(
            "CTRModule got a batch without labels; use labeled data (data.use_labels=true)"
        )
    return batch.label
