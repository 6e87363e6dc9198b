"""L2-regularized logistic regression on one-hot ids and dense columns, fitted full-batch.

The model a practitioner fits first on a small labeled table (scikit-learn's
``LogisticRegression(C)`` on one-hot features): a scalar per id of every field, a weight per
dense column and a bias. :class:`~ssl_rec.models.WideTerm` holds the same parameters, so a fit
here can start a Wide & Deep model from it (``CTRModule(wide_init="logistic")``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
import torch.nn.functional as F

__all__ = ["LogisticFit", "fit_logistic"]


@dataclasses.dataclass(frozen=True)
class LogisticFit:
    """A fitted logistic regression over ``F`` fields and ``n_dense`` columns.

    Args:
        ids: one ``float32[R_f]`` weight vector per field (indexed by the field's ids).
        dense: ``float32[n_dense]`` weights of the raw dense columns.
        bias: the intercept.
        inverse_strength: ``C`` of the fit (scikit-learn's convention, see :func:`fit_logistic`).

    """

    ids: list[torch.Tensor]
    dense: torch.Tensor
    bias: float
    inverse_strength: float

    def logits(self, sparse: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """``float32[B]`` logits of ``sparse int64[B, F]`` ids and ``dense float32[B, n_dense]``."""
        out = torch.full((sparse.shape[0],), self.bias, dtype=torch.float32)
        for field, weights in enumerate(self.ids):
            out += weights[sparse[:, field]]
        return out + dense.float() @ self.dense if self.dense.numel() else out


def fit_logistic(
    sparse: torch.Tensor,
    dense: torch.Tensor,
    labels: torch.Tensor,
    cardinalities: Sequence[int],
    inverse_strength: float,
    max_iter: int = 200,
) -> LogisticFit:
    """Minimize ``C * sum_i BCE_i + ||w||^2 / 2`` over the id and dense weights (not the bias).

    The same objective as scikit-learn's ``LogisticRegression(C=inverse_strength)`` on one-hot
    ids and standardized dense columns; dense columns are standardized here (training rows'
    mean and std) and the weights mapped back to the raw columns, so the penalty does not
    depend on a column's unit. Solved by L-BFGS with a strong-Wolfe line search.

    Args:
        sparse: ``int64[N, F]`` ids, field ``f``'s in ``[0, cardinalities[f])``.
        dense: ``float32[N, n_dense]`` (``n_dense`` may be 0); finite.
        labels: ``float32[N]`` in {0, 1}.
        cardinalities: ids per field.
        inverse_strength: ``C > 0``; smaller is a stronger penalty.
        max_iter: L-BFGS iterations at most.

    Returns:
        The fit, its weights in float32.

    Raises:
        ValueError: empty or mismatched inputs, ``C <= 0``, ids out of range, non-finite values.

    """
    rows = int(labels.shape[0])
    if rows == 0:
        raise ValueError("fit_logistic: no labeled rows")
    if sparse.shape != (rows, len(cardinalities)) or dense.shape[0] != rows:
        raise ValueError(
            f"fit_logistic: sparse {tuple(sparse.shape)}, dense {tuple(dense.shape)} and "
            f"labels {tuple(labels.shape)} disagree ({len(cardinalities)} fields)"
        )
    if not inverse_strength > 0:
        raise ValueError(f"fit_logistic: inverse_strength must be > 0, got {inverse_strength}")
    limits = torch.tensor(list(cardinalities), dtype=torch.int64)
    if bool((sparse < 0).any()) or bool((sparse >= limits).any()):
        raise ValueError("fit_logistic: an id is outside its field's [0, cardinality)")
    if not (torch.isfinite(dense).all() and torch.isfinite(labels).all()):
        raise ValueError("fit_logistic: dense values and labels must be finite")
    offsets = torch.cumsum(limits, 0) - limits
    flat = sparse + offsets
    y = labels.double()
    mean, std = dense.double().mean(0), dense.double().std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    x = (dense.double() - mean) / std
    ids = torch.zeros(int(limits.sum()), dtype=torch.float64, requires_grad=True)
    weights = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    rate = y.mean().clamp(1e-6, 1 - 1e-6)
    bias = torch.log(rate / (1 - rate)).reshape(1).requires_grad_(True)
    penalty = 0.5 / (inverse_strength * rows)  # the objective divided by C * N
    solver = torch.optim.LBFGS(
        [ids, weights, bias], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
        tolerance_grad=1e-9, tolerance_change=1e-12, history_size=20,
    )  # fmt: skip

    def closure() -> torch.Tensor:
        solver.zero_grad()
        logits = ids[flat].sum(1)  # embedding_bag's float64 backward is 10x slower
        logits = logits + x @ weights + bias
        loss = F.binary_cross_entropy_with_logits(logits, y)
        loss = loss + penalty * (ids.square().sum() + weights.square().sum())
        loss.backward()
        return loss

    solver.step(closure)
    with torch.no_grad():
        raw = weights / std
        intercept = float(bias - (raw * mean).sum())
        per_field = ids.float().split(list(cardinalities))
    return LogisticFit([w.clone() for w in per_field], raw.float(), intercept, inverse_strength)
