"""The wide (linear) term of a CTR model as it serves: FP32 scalars per id, a dense weight.

A wide term's id-count slopes and co-occurrence factor slopes are functions of one id each,
so they serve folded into the ids' scalars.

Post-training quantization leaves it in FP32: it holds one float per id (the embedding
tables hold ``D``), and a logistic-regression term is what the low-label regime leans on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ssl_rec.models.wide import WideTerm

__all__ = ["ServingWide"]


class ServingWide(nn.Module):
    """``sum_f scalars[offset_f + id_f] + <dense_weight, dense>`` (inference only).

    Args:
        cardinalities: ids per field.
        n_dense: number of dense features.

    Attributes:
        scalars: float32[sum(cardinalities)] buffer, each field's rows one after the other.
        offsets: int64[F] buffer, where each field's rows start.
        dense_weight: float32[n_dense] buffer.

    Shape:
        ``sparse int64[B, F]``, ``dense float32[B, n_dense]`` -> ``float32[B]``.
    """

    def __init__(self, cardinalities: Sequence[int], n_dense: int) -> None:
        super().__init__()
        cards = torch.tensor([int(c) for c in cardinalities], dtype=torch.int64)
        self.register_buffer("scalars", torch.zeros(int(cards.sum())))
        self.register_buffer("offsets", torch.cumsum(cards, 0) - cards)
        self.register_buffer("dense_weight", torch.zeros(int(n_dense)))

    @classmethod
    @torch.no_grad()
    def from_wide(cls, wide: WideTerm) -> ServingWide:
        """The serving form of a trained :class:`~ssl_rec.models.WideTerm` (values copied)."""
        weights = wide.ids.float_weights()  # F tensors float32[R_f, 1]
        n_dense = 0 if wide.dense is None else wide.dense.in_features
        out = cls([len(w) for w in weights], n_dense)
        out.scalars.copy_(torch.cat([w.sum(1) for w in weights]))
        if wide.count_weight is not None:
            # The count term is a fixed function of the id: folded into the id's scalar.
            slopes = wide.count_weight.weight.reshape(-1)
            cards = torch.tensor(wide.counts.cardinalities, device=slopes.device)
            out.scalars.add_(slopes.repeat_interleave(cards) * wide.counts.values)
        if wide.factor_weight is not None:
            # <t, [left[id_a], right[id_b]]> splits into one scalar per id of a and of b.
            factors = wide.factors
            slopes = wide.factor_weight.weight.reshape(2, factors.rank)
            for field, table, slope in zip(
                factors.fields, (factors.left, factors.right), slopes, strict=True
            ):
                start = int(out.offsets[field])
                out.scalars[start : start + len(table)] += table @ slope
        if wide.dense is not None:
            out.dense_weight.copy_(wide.dense.weight.reshape(-1))
        return out

    def forward(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """The wide logit of each row; see the class docstring for shapes."""
        logit = self.scalars[sparse + self.offsets].sum(1)
        if self.dense_weight.numel():
            logit = logit + dense.float() @ self.dense_weight
        return logit
