"""PretrainModule: a backbone trained by a weighted sum of self-supervised objectives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ssl_rec.lightning.finite_checks import check_finite_loss
from ssl_rec.lightning.module_config import (
    BackboneFactory,
    backbone_factory,
    build_objectives,
    module_hparams,
)
from ssl_rec.lightning.standalone import StandaloneModule
from ssl_rec.models.backbone import as_schema
from ssl_rec.objectives.base import Objective
from ssl_rec.types import Batch


class PretrainModule(StandaloneModule):
    """Self-supervised pretraining: ``loss = sum_i weight_i * objective_i(batch, backbone)``.

    Objectives are composed, not inherited: each is an ``nn.Module`` holding its own heads;
    this module builds the backbone, calls ``objective.setup(backbone)`` once, sums the
    weighted losses and logs ``{stage}/{objective}/{metric}``. Batches may be unlabeled.

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
        self.objective_weights = _check_objectives(objectives, weights)
        self.schema = as_schema(schema)
        schema = self.schema.to_dict()
        self.save_hyperparameters(module_hparams(
            self, backbone=backbone, objectives=objectives, weights=weights,
            schema=schema, learning_rate=learning_rate, weight_decay=weight_decay,
            gradient_clip=gradient_clip,
        ))  # fmt: skip
        self.provenance: dict[str, Any] = {}
        self.backbone = factory(schema)
        self.objectives = nn.ModuleDict(objectives)
        for objective in self.objectives.values():
            objective.setup(self.backbone)
        self.adversarial = [n for n, o in self.objectives.items() if o.generator_parameters()]
        self.automatic_optimization = not self.adversarial

    def forward(self, batch: Batch) -> torch.Tensor:
        """Pooled representation ``float32[B, H]`` of ``batch`` (no masking)."""
        return self.backbone(batch).pooled

    def _losses(self, batch: Batch, stage: str) -> torch.Tensor:
        total = 0.0
        for name, objective in self.objectives.items():
            out = objective(batch, self.backbone)
            check_finite_loss(out.loss, f"the {stage} loss of objective {name!r}", self.global_step)
            total = total + self.objective_weights[name] * out.loss
            self._log(stage, name, out.logs, batch.batch_size)
        self.log(f"{stage}/loss", total, prog_bar=True, batch_size=batch.batch_size)
        return total

    def _log(self, stage: str, name: str, logs: Mapping[str, Any], batch_size: int) -> None:
        values = {f"{stage}/{name}/{k}": v for k, v in logs.items()}
        self.log_dict(values, batch_size=batch_size, on_step=stage == "train", on_epoch=True)

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
            self._log(
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


def _check_objectives(
    objectives: Mapping[str, Objective], weights: Mapping[str, float] | None
) -> dict[str, float]:
    """Validate names/types and return name -> weight (1.0 unless given)."""
    if not objectives:
        raise ValueError("PretrainModule needs at least one objective in `objectives`")
    for name, objective in objectives.items():
        if not isinstance(objective, Objective):
            raise TypeError(
                f"objectives[{name!r}] is a {type(objective).__name__}, not an "
                "ssl_rec.objectives.Objective (check its class_path)"
            )
        if not name.isidentifier():
            raise ValueError(f"objective name {name!r} must be an identifier (it is a log key)")
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(objectives))
    if unknown:
        raise ValueError(
            f"weights name unknown objectives {unknown}; objectives are {sorted(objectives)}"
        )
    for name, w in weights.items():
        if not w >= 0:
            raise ValueError(f"weights[{name!r}] must be >= 0, got {w}")
    return {name: float(weights.get(name, 1.0)) for name in objectives}
