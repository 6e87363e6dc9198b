"""PretrainModule: a backbone trained by a weighted sum of self-supervised objectives."""

from __future__ import annotations

from typing import Any

import torch

from ssl_rec.lightning.finite_checks import check_finite_loss
from ssl_rec.lightning.module_config import (
    BackboneFactory,
    backbone_factory,
    build_objectives,
    module_hparams,
)
from ssl_rec.lightning.objective_set import ObjectiveModule, check_objectives
from ssl_rec.models.backbone import as_schema
from ssl_rec.objectives.base import Objective
from ssl_rec.types import Batch


class PretrainModule(ObjectiveModule):
    """Self-supervised pretraining: ``loss = sum_i weight_i * objective_i(batch, backbone)``.

    Objectives are composed, not inherited: each is an ``nn.Module`` holding its own heads;
    this module builds the backbone, calls ``objective.setup(backbone)`` once, sums the
    weighted losses and logs ``{stage}/{objective}/{metric}`` (the composition
    :class:`~ssl_rec.lightning.objective_set.ObjectiveModule` shares with ``CTRModule``'s
    auxiliary objectives). Batches may be unlabeled.

    When an objective declares generator parameters (adversarial objectives), training
    switches to manual optimization, kept in :meth:`_adversarial_step` only (the pattern of
    Lightning's GAN example): one optimizer for the backbone and all non-generator heads,
    one for the generators, stepped every ``objective.generator_interval`` batches.
    Embedding tables are not parameters; they update in backward of the backbone step
    (the generator step reads them without gradient).

    The hyperparameters saved in checkpoints are the constructor's arguments as plain values
    (backbone and objectives as ``class_path`` dicts), with the schema and vocabulary
    beside them, so ``PretrainModule.load_from_checkpoint(path)`` rebuilds it alone.

    Args:
        backbone: factory ``schema_dict -> Backbone`` (a class, ``functools.partial`` or a
            ``class_path`` dict; ``class_path`` in YAML).
        objectives: name -> objective (an instance or a ``class_path`` dict); names appear
            in log keys.
        weights: name -> loss weight (default 1 for every objective); names must exist.
        schema: the data's feature schema dict; the CLI links it from ``data.schema``.
        learning_rate: Adam learning rate of the dense parameters (> 0).
        weight_decay: Adam weight decay (>= 0).
        gradient_clip: max global gradient norm per step (0 disables); applies to both
            optimizers on the manual path, where the Trainer's clipping is unavailable.

    Example:
        >>> from functools import partial
        >>> from ssl_rec.models import Backbone
        >>> from ssl_rec.objectives import MaskedFeaturePrediction
        >>> from ssl_rec.schema import CategoricalField, FeatureSchema
        >>> schema = FeatureSchema(["price"], [CategoricalField("user", 10)], None)
        >>> module = PretrainModule(partial(Backbone, embedding_dim=16),
        ...                         {"mfp": MaskedFeaturePrediction()}, schema=schema.to_dict())
        >>> list(module.objectives)
        ['mfp']

    """

    def __init__(
        self,
        backbone: BackboneFactory,
        objectives: dict[str, Objective],
        weights: dict[str, float] | None = None,
        schema: dict | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.0,
        gradient_clip: float = 1.0,
    ) -> None:
        super().__init__()
        if schema is None:
            raise ValueError("PretrainModule needs `schema` (the CLI links it from data.schema)")
        _check_hyperparameters(learning_rate, weight_decay, gradient_clip)
        factory = backbone_factory(backbone, "PretrainModule")
        objectives = build_objectives(objectives, "PretrainModule")
        checked_weights = check_objectives(objectives, weights, "PretrainModule")
        self.schema = as_schema(schema)
        schema = self.schema.to_dict()
        self.save_hyperparameters(module_hparams(
            self, backbone=backbone, objectives=objectives, weights=weights,
            schema=schema, learning_rate=learning_rate, weight_decay=weight_decay,
            gradient_clip=gradient_clip,
        ))  # fmt: skip
        self.provenance: dict[str, Any] = {}
        self.backbone = factory(schema)
        self.compose_objectives(objectives, checked_weights)
        self.automatic_optimization = not self.adversarial

    def forward(self, batch: Batch) -> torch.Tensor:
        """Pooled representation ``float32[B, H]`` of ``batch`` (no masking)."""
        return self.backbone(batch).pooled

    def _losses(self, batch: Batch, stage: str) -> torch.Tensor:
        total = self.objective_loss(batch, stage)
        self.log(f"{stage}/loss", total, prog_bar=True, batch_size=batch.batch_size)
        return total

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor | None:
        """Weighted objective loss (automatic) or one adversarial round (manual)."""
        if self.automatic_optimization:
            return self._losses(batch, "train")
        self._adversarial_step(batch, batch_idx)
        return None

    def _adversarial_step(self, batch: Batch, batch_idx: int) -> None:
        backbone_opt, generator_opt = self.optimizers()
        self.toggle_optimizer(backbone_opt)
        loss = self._losses(batch, "train")
        backbone_opt.zero_grad()
        self.manual_backward(loss)
        self._clip(backbone_opt)
        backbone_opt.step()
        self.untoggle_optimizer(backbone_opt)
        for name in self.adversarial:
            objective = self.objectives[name]
            if batch_idx % objective.generator_interval:
                continue
            self.toggle_optimizer(generator_opt)
            out = objective.generator_loss(batch, self.backbone)
            what = f"the generator loss of objective {name!r}"
            check_finite_loss(out.loss, what, self.global_step)
            generator_opt.zero_grad()
            self.manual_backward(out.loss)
            self._clip(generator_opt)
            generator_opt.step()
            self.untoggle_optimizer(generator_opt)
            self.log_objective(
                "train",
                f"{name}/generator",
                {"loss": out.loss.detach(), **out.logs},
                batch.batch_size,
            )

    def _clip(self, optimizer: torch.optim.Optimizer) -> None:
        if self.hparams.gradient_clip > 0:
            self.clip_gradients(
                optimizer,
                gradient_clip_val=self.hparams.gradient_clip,
                gradient_clip_algorithm="norm",
            )

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """Objective losses on held-out rows (labels, if any, are ignored)."""
        self._losses(batch, "val")

    def configure_optimizers(self) -> Any:
        """Adam over dense parameters; a second Adam for generators on the manual path."""
        generator = {
            id(p) for n in self.adversarial for p in self.objectives[n].generator_parameters()
        }
        main = [p for p in self.parameters() if p.requires_grad and id(p) not in generator]
        kwargs = {"lr": self.hparams.learning_rate, "weight_decay": self.hparams.weight_decay}
        if not self.adversarial:
            return torch.optim.Adam(main, **kwargs)
        gen_params = [p for p in self.parameters() if id(p) in generator]
        return [torch.optim.Adam(main, **kwargs), torch.optim.Adam(gen_params, **kwargs)]


def _check_hyperparameters(learning_rate: float, weight_decay: float, gradient_clip: float) -> None:
    if not learning_rate > 0:
        raise ValueError(f"PretrainModule.learning_rate must be > 0, got {learning_rate}")
    if not weight_decay >= 0:
        raise ValueError(f"PretrainModule.weight_decay must be >= 0, got {weight_decay}")
    if not gradient_clip >= 0:
        raise ValueError(f"PretrainModule.gradient_clip must be >= 0, got {gradient_clip}")
