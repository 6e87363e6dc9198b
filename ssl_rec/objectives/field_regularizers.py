"""CL4CTR's two embedding regularizers: feature alignment and field uniformity.

Wang et al., "CL4CTR: A Contrastive Learning Framework for CTR Prediction", WSDM 2023,
https://arxiv.org/abs/2212.00522. Both act on the field tokens of a batch's ids (no
augmentation, no head): alignment pulls the embeddings of ids of the same field together,
uniformity pushes the embeddings of different fields apart. They regularize supervised
training (``CTRModule.objectives``) with small weights; alone, alignment would collapse
each field to one point.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ssl_rec._checks import check_at_least
from ssl_rec.objectives.base import Objective
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput


def feature_alignment_loss(tokens: torch.Tensor) -> torch.Tensor:
    """Mean squared distance between the tokens of two rows, over row pairs and fields.

    ``mean_{f, i < j} ||e_if - e_jf||^2``, computed as ``2 / (B - 1) * sum_i ||e_if - mean_f||^2``
    (the same value in ``O(B F D)`` instead of ``O(B^2 F D)``).

    Args:
        tokens: ``float32[B, F, D]`` field embeddings of ``B`` rows.

    Returns:
        ``float32[]``; zero (with gradient) for fewer than two rows.

    Example:
        >>> e = torch.tensor([[[0.0, 0.0]], [[3.0, 4.0]]])  # two rows, one field
        >>> float(feature_alignment_loss(e))
        25.0

    """
    b = tokens.shape[0]
    if b < 2:
        return tokens.sum() * 0.0
    centered = tokens - tokens.mean(dim=0, keepdim=True)
    return 2.0 / (b - 1) * centered.pow(2).sum(dim=(0, 2)).mean()


def field_uniformity_loss(tokens: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Mean cosine similarity between the tokens of different fields of each row.

    Args:
        tokens: ``float32[B, F, D]`` field embeddings.
        eps: floor of a token's norm (an all-zero token has similarity 0).

    Returns:
        ``float32[]`` in ``[-1, 1]``; zero (with gradient) for fewer than two fields.

    Example:
        >>> e = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])  # orthogonal fields
        >>> float(field_uniformity_loss(e))
        0.0

    """
    f = tokens.shape[1]
    if f < 2:
        return tokens.sum() * 0.0
    unit = F.normalize(tokens, dim=2, eps=eps)
    cosine = unit @ unit.transpose(1, 2)  # [B, F, F]
    off_diagonal = ~torch.eye(f, dtype=torch.bool, device=tokens.device)
    return cosine[:, off_diagonal].mean()


class _FieldTokenRegularizer(Objective):
    """A loss of the field tokens of a batch's first ``max_rows`` rows; logs ``loss``."""

    def __init__(self, max_rows: int = 4096) -> None:
        super().__init__()
        self.max_rows = check_at_least(type(self).__name__, "max_rows", max_rows)

    @staticmethod
    def token_loss(tokens: torch.Tensor) -> torch.Tensor:
        """The loss of ``float32[B, F, D]`` field tokens."""
        raise NotImplementedError

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """The loss of the field tokens of ``batch``'s first ``max_rows`` rows."""
        loss = self.token_loss(backbone.embed(batch.head(self.max_rows).sparse))
        return ObjectiveOutput(loss, {"loss": loss.detach()})


class FeatureAlignment(_FieldTokenRegularizer):
    """CL4CTR feature alignment: embeddings of ids of the same field pulled together.

    The loss is :func:`feature_alignment_loss` of the batch's field tokens
    (``backbone.embed(batch.sparse)``); it logs ``loss``.

    Args:
        max_rows: regularize only the batch's first ``max_rows`` rows.

    Example:
        >>> objective = FeatureAlignment(max_rows=512)
        >>> objective.max_rows
        512

    """

    token_loss = staticmethod(feature_alignment_loss)


class FieldUniformity(_FieldTokenRegularizer):
    """CL4CTR field uniformity: embeddings of different fields pushed apart.

    The loss is :func:`field_uniformity_loss` of the batch's field tokens
    (``backbone.embed(batch.sparse)``); it logs ``loss``.

    Args:
        max_rows: regularize only the batch's first ``max_rows`` rows (the loss costs
            ``O(B F^2 D)``).

    Example:
        >>> FieldUniformity(max_rows=0)
        Traceback (most recent call last):
        ...
        ValueError: FieldUniformity.max_rows must be an integer >= 1, got 0

    """

    token_loss = staticmethod(field_uniformity_loss)
