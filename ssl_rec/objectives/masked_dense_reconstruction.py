"""Masked dense reconstruction: zero some dense features, regress them back."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssl_rec._checks import check_at_least, check_rate
from ssl_rec.models.mlp import MLP
from ssl_rec.objectives.base import Objective, masked_mean
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput
from ssl_rec.views import View


class MaskedDenseReconstruction(Objective):
    """Denoising reconstruction of masked dense features from the pooled representation.

    Vincent et al., "Extracting and Composing Robust Features with Denoising Autoencoders",
    ICML 2008, https://doi.org/10.1145/1390156.1390294; VIME (Yoon et al., NeurIPS 2020,
    https://proceedings.neurips.cc/paper/2020/hash/7d97667a3e056acab9aaf653807b4a03-Abstract.html)
    for tabular data. The values are the backbone's standardized ones
    (:meth:`~ssl_rec.types.BackboneProtocol.standardize_dense`: training mean 0, std 1 per
    column, so no wide-ranged column dominates the loss); masked entries are set to 0 in that
    space (the column's training mean) and the loss is the mean squared error on those
    entries only. ``mse_of_zero`` (predicting the mean) is about 1 for a standardized column.

    Args:
        view: extra masking/corruption of the categorical fields (``None``: none).
        mask_rate: probability of masking each dense entry, in [0, 1].
        hidden: width of the decoder's hidden layer.

    """

    def __init__(self, view: View | None = None, mask_rate: float = 0.3, hidden: int = 128) -> None:
        super().__init__()
        self.mask_rate = check_rate("MaskedDenseReconstruction", "mask_rate", mask_rate)
        check_at_least("MaskedDenseReconstruction", "hidden", hidden)
        self.view = view if view is not None else View()
        self.hidden = int(hidden)

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the decoder ``H -> n_dense``; the data needs dense columns."""
        n_dense = backbone.dims.n_dense
        if n_dense == 0:
            raise ValueError("MaskedDenseReconstruction needs dense columns; the schema has none")
        self.decoder = MLP(backbone.dims.output_dim, [self.hidden, n_dense])

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Mean squared error of the masked (standardized) dense entries."""
        gen = self.view.rng(batch.dense.device)
        dense_mask = torch.rand(batch.dense.shape, generator=gen, device=batch.dense.device)
        dense_mask = dense_mask < self.mask_rate
        target = backbone.standardize_dense(batch.dense)
        hidden = backbone.unstandardize_dense(target.masked_fill(dense_mask, 0.0))
        masked = batch.with_features(dense=hidden)
        pooled = self.view(masked, backbone).rep.pooled
        # Layer norm: the loss must not reward inflating the backbone's activations.
        pred = self.decoder(F.layer_norm(pooled, pooled.shape[-1:]))
        loss = masked_mean((pred - target) ** 2, dense_mask)
        baseline = masked_mean(target**2, dense_mask).detach()
        return ObjectiveOutput(loss, {"loss": loss.detach(), "mse_of_zero": baseline})
