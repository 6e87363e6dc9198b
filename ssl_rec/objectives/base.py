"""The Objective interface shared by every pretraining objective."""

from __future__ import annotations

import torch
from torch import nn

from ssl_rec._config import RecordsConfig
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput


class Objective(RecordsConfig, nn.Module):
    """A self-supervised loss on a batch: ``forward(batch, backbone) -> ObjectiveOutput``.

    Objectives take their hyperparameters in ``__init__`` and receive the sizes that depend
    on the backbone (``backbone.dims``: ``H``, ``D``, ``F``, cardinalities) in :meth:`setup`, which
    ``PretrainModule`` calls once after building the backbone (the CLI can only link the
    data schema into the module, not into each objective).

    Adversarial objectives additionally declare :meth:`generator_parameters` and implement
    :meth:`generator_loss`; ``PretrainModule`` then steps those parameters with their own
    optimizer every ``generator_interval`` batches (manual optimization). Objectives never
    log and never import Lightning: they return scalars in ``ObjectiveOutput.logs``.
    """

    generator_interval: int = 1

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the layers whose sizes depend on ``backbone`` (default: nothing)."""

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Loss to minimise with respect to the backbone and this objective's own heads."""
        raise NotImplementedError

    def generator_parameters(self) -> list[nn.Parameter]:
        """Parameters trained adversarially by :meth:`generator_loss` (default: none)."""
        return []

    def generator_loss(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Loss of the generator parameters (only for objectives that declare some)."""
        raise NotImplementedError(f"{type(self).__name__} has no adversarial generator")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is True; 0 (with gradient) when nothing is selected."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp_min(1.0)
