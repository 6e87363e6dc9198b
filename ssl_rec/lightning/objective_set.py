"""Weighted self-supervised objectives composed into a module's loss, in one place.

``PretrainModule`` (objectives alone) and ``CTRModule`` (click loss plus auxiliary objectives)
both derive from :class:`ObjectiveModule`: the names and weights are checked by
:func:`check_objectives`, each objective is set up once on the module's backbone, and the
training and validation steps sum ``weight * loss`` over the objectives, check the sum
is finite (naming the objective that is not) and log ``{stage}/{objective}/{metric}``.
``RetrievalModule`` checks its item objectives with :func:`check_objectives` and sums them
with :func:`weighted_objective_loss` too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn

from ssl_rec._checks import check_known_keys
from ssl_rec.lightning.finite_checks import check_finite_loss
from ssl_rec.lightning.standalone import StandaloneModule
from ssl_rec.objectives.base import Objective
from ssl_rec.types import BackboneProtocol, Batch


def check_objectives(
    objectives: Mapping[str, Objective],
    weights: Mapping[str, float] | None,
    owner: str,
    weights_key: str = "weights",
    required: bool = True,
) -> dict[str, float]:
    """Validate objective names and types; return ``name -> weight`` (1.0 unless given).

    Args:
        objectives: name -> objective (already built).
        weights: name -> loss weight (``>= 0``); every name must be an objective's.
        owner: the module's class name, for messages.
        weights_key: the owner's argument holding ``weights``, for messages.
        required: refuse an empty ``objectives``.

    Raises:
        ValueError: no objective (when required), a name that is no identifier, a weight
            naming no objective, or a negative or infinite weight.
        TypeError: a value that is not an :class:`~ssl_rec.objectives.Objective`.

    """
    if required and not objectives:
        raise ValueError(f"{owner} needs at least one objective in `objectives`")
    for name, objective in objectives.items():
        if not isinstance(objective, Objective):
            raise TypeError(
                f"{owner}: objectives[{name!r}] is a {type(objective).__name__}, not an "
                "ssl_rec.objectives.Objective (check its class_path)"
            )
        if not name.isidentifier():
            raise ValueError(f"objective name {name!r} must be an identifier (it is a log key)")
    weights = dict(weights or {})
    check_known_keys(owner, weights_key, weights, sorted(objectives), "objectives")
    for name, w in weights.items():
        if not (math.isfinite(w) and w >= 0):
            raise ValueError(f"{owner}.{weights_key}[{name!r}] must be >= 0, got {w}")
    return {name: float(weights.get(name, 1.0)) for name in objectives}


class ObjectiveModule(StandaloneModule):
    """A :class:`StandaloneModule` whose loss includes weighted self-supervised objectives.

    Subclasses build ``self.backbone``, then call :meth:`compose_objectives`; their steps
    call :meth:`objective_loss`. Objectives see whole batches, labeled or not.
    """

    objectives: nn.ModuleDict
    objective_weights: dict[str, float]
    adversarial: list[str]

    def compose_objectives(
        self, objectives: Mapping[str, Objective], weights: Mapping[str, float]
    ) -> None:
        """Hold ``objectives`` (``self.objectives``), set each up on ``self.backbone`` once.

        Args:
            objectives: name -> objective, checked by :func:`check_objectives`.
            weights: name -> weight, as :func:`check_objectives` returns it.

        """
        self.objective_weights = dict(weights)
        self.objectives = nn.ModuleDict(objectives)
        for objective in self.objectives.values():
            objective.setup(self.backbone)
        self.adversarial = [n for n, o in self.objectives.items() if o.generator_parameters()]

    def objective_loss(self, batch: Batch, stage: str) -> torch.Tensor | float:
        """``sum_i weight_i * loss_i`` on ``batch`` (``0.0`` without objectives), each logged."""
        return weighted_objective_loss(
            self, self.objectives, self.objective_weights, batch, self.backbone, stage
        )

    def log_objective(
        self, stage: str, name: str, logs: Mapping[str, Any], batch_size: int
    ) -> None:
        """Log an objective's scalars as ``{stage}/{name}/{metric}`` (per step in training)."""
        log_objective(self, stage, name, logs, batch_size)


def weighted_objective_loss(
    module: pl.LightningModule,
    objectives: Mapping[str, Objective],
    weights: Mapping[str, float],
    batch: Batch,
    backbone: BackboneProtocol,
    stage: str,
    log_batch_size: int | None = None,
    noun: str = "objective",
) -> torch.Tensor | float:
    """``sum_i weight_i * objective_i(batch, backbone)``, each objective's scalars logged.

    The sum is checked finite with one host sync per step; only when it is not are the
    losses checked one by one, to name the first non-finite one.

    Args:
        module: the LightningModule that logs (``{stage}/{name}/{metric}``).
        objectives: name -> objective.
        weights: name -> weight (:func:`check_objectives`).
        batch: what the objectives see.
        backbone: the backbone (or tower) they train.
        stage: ``train``, ``val``, ...
        log_batch_size: the batch size the logs are weighted by (``batch``'s by default).
        noun: what an objective is called in the error message.

    Raises:
        NonFiniteError: naming the objective and ``stage`` whose loss is not finite.

    """
    outputs = {name: objective(batch, backbone) for name, objective in objectives.items()}
    total: torch.Tensor | float = 0.0
    for name, out in outputs.items():
        total = total + weights[name] * out.loss
    if isinstance(total, torch.Tensor) and not bool(torch.isfinite(total.detach()).all()):
        for name, out in outputs.items():
            what = f"the {stage} loss of {noun} {name!r}"
            check_finite_loss(out.loss, what, module.global_step)
        check_finite_loss(total, f"the weighted sum of {stage} losses", module.global_step)
    size = batch.batch_size if log_batch_size is None else log_batch_size
    for name, out in outputs.items():
        log_objective(module, stage, name, out.logs, size)
    return total


def log_objective(
    module: pl.LightningModule, stage: str, name: str, logs: Mapping[str, Any], batch_size: int
) -> None:
    """Log an objective's scalars as ``{stage}/{name}/{metric}`` (per step in training)."""
    values = {f"{stage}/{name}/{k}": v for k, v in logs.items()}
    module.log_dict(values, batch_size=batch_size, on_step=stage == "train", on_epoch=True)
