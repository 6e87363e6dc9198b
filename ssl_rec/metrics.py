"""Every metric of the package, defined once: CTR quality, representation geometry, retrieval.

CTR metrics exist as pure functions (one call on whole arrays: the oracle metrics of
synthetic data, probes) and as streaming ``torchmetrics`` metrics that accumulate batches
(Lightning modules); the streaming ones finish with the same functions. Normalized entropy
is He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook", ADKDD 2014.
Alignment and uniformity follow Wang & Isola, ICML 2020, https://arxiv.org/abs/2005.10242
(Eq. 4 and 5, on L2-normalised vectors).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import BinaryAUROC
from torchmetrics.functional.classification import binary_auroc

__all__ = [
    "Calibration",
    "LogLoss",
    "NormalizedEntropy",
    "alignment",
    "ann_recall_at_k",
    "binary_auc",
    "binary_logloss",
    "calibration",
    "ctr_metrics",
    "ctr_summary",
    "ndcg_at_k",
    "normalized_entropy",
    "recall_at_k",
    "uniformity",
]

_EPS = 1e-7


def binary_auc(score: np.ndarray | torch.Tensor, label: np.ndarray | torch.Tensor) -> float:
    """Exact area under the ROC curve (ties count one half); ``nan`` with a single class.

    Args:
        score: ``float[N]`` scores on any monotone scale (probabilities or logits).
        label: ``[N]`` binary labels in {0, 1}.

    Example:
        >>> binary_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1]))
        0.75

    """
    score = torch.as_tensor(np.asarray(score, np.float64))
    label = torch.as_tensor(np.asarray(label)).long()
    if label.numel() == 0 or bool((label == label[0]).all()):
        return float("nan")
    return float(binary_auroc(score, label))


def binary_logloss(prob: np.ndarray, label: np.ndarray, eps: float = _EPS) -> float:
    """Mean binary cross-entropy in nats of probabilities ``prob float[N]`` vs ``label [N]``."""
    p = np.clip(np.asarray(prob, np.float64), eps, 1.0 - eps)
    y = np.asarray(label, np.float64)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def normalized_entropy(logloss: float, ctr: float) -> float:
    """Logloss divided by the entropy of the observed click rate ``ctr`` (< 1 beats the mean)."""
    p = min(max(float(ctr), 1e-12), 1.0 - 1e-12)
    return float(logloss) / -(p * math.log(p) + (1.0 - p) * math.log(1.0 - p))


def calibration(mean_prediction: float, ctr: float) -> float:
    """Predicted over observed click rate (1.0 is calibrated on average; ``nan`` without clicks)."""
    return float(mean_prediction) / float(ctr) if ctr > 0 else math.nan


def ctr_summary(prob: np.ndarray, label: np.ndarray) -> dict[str, float]:
    """``{"auc", "logloss", "ne", "calibration", "ctr"}`` of probabilities ``prob float[N]``."""
    ctr = float(np.mean(label))
    logloss = binary_logloss(prob, label)
    return {
        "auc": binary_auc(prob, label),
        "logloss": logloss,
        "ne": normalized_entropy(logloss, ctr),
        "calibration": calibration(float(np.mean(prob)), ctr),
        "ctr": ctr,
    }


class _LabelAndLossSums(Metric):
    """Streaming sums of BCE, predictions and labels, and the row count."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        for name in ("bce", "pred", "label", "count"):
            self.add_state(
                name, default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum"
            )

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """Add a batch: ``logits float32[B]``, ``labels float32[B]`` in {0, 1}."""
        logits, labels = logits.detach().double(), labels.detach().double()
        self.bce += F.binary_cross_entropy_with_logits(logits, labels, reduction="sum")
        self.pred += torch.sigmoid(logits).sum()
        self.label += labels.sum()
        self.count += labels.numel()

    def _means(self) -> tuple[float, float, float]:
        n = float(self.count.clamp_min(1))
        return float(self.bce) / n, float(self.pred) / n, float(self.label) / n


class LogLoss(_LabelAndLossSums):
    """Mean binary cross-entropy (nats) over all rows seen."""

    def compute(self) -> torch.Tensor:
        """Return ``sum(bce) / n``."""
        return torch.tensor(self._means()[0])


class NormalizedEntropy(_LabelAndLossSums):
    """Streaming :func:`normalized_entropy`."""

    def compute(self) -> torch.Tensor:
        """Return ``logloss / H(ctr)``."""
        logloss, _, ctr = self._means()
        return torch.tensor(normalized_entropy(logloss, ctr))


class Calibration(_LabelAndLossSums):
    """Streaming :func:`calibration`."""

    def compute(self) -> torch.Tensor:
        """Return mean prediction over observed CTR."""
        _, pred, ctr = self._means()
        return torch.tensor(calibration(pred, ctr))


class _AUC(BinaryAUROC):
    """Binary AUROC taking logits and float labels."""

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:  # noqa: D102
        super().update(torch.sigmoid(logits.detach()), labels.detach().long())


def ctr_metrics(prefix: str) -> MetricCollection:
    """Streaming ``{prefix}auc, logloss, ne, calibration``, updated with ``(logits, labels)``."""
    return MetricCollection(
        {"auc": _AUC(), "logloss": LogLoss(), "ne": NormalizedEntropy(),
         "calibration": Calibration()},
        prefix=prefix,
    )  # fmt: skip


def alignment(x: torch.Tensor, y: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """Alignment ``E ||f(x) - f(y)||^alpha`` of positive pairs (lower is better).

    Args:
        x: ``float32[n, d]`` one view of each item; L2-normalised here.
        y: ``float32[n, d]`` the positive view of each item.
        alpha: exponent (> 0), 2 in the paper.

    Returns:
        A scalar tensor (differentiable).

    """
    if x.shape != y.shape or x.dim() != 2:
        raise ValueError(
            f"alignment needs two [n, d] tensors of one shape, got {x.shape}, {y.shape}"
        )
    x, y = F.normalize(x.float(), dim=1), F.normalize(y.float(), dim=1)
    return (x - y).norm(dim=1).pow(alpha).mean()


def uniformity(x: torch.Tensor, t: float = 2.0, max_rows: int = 4096) -> torch.Tensor:
    """Uniformity ``log E exp(-t ||f(x) - f(y)||^2)`` over distinct pairs (lower is better).

    Estimated on the first ``max_rows`` rows: all pairs of a large batch cost more than a
    training step.

    Args:
        x: ``float32[n, d]`` with ``n >= 2``; L2-normalised here.
        t: temperature (> 0), 2 in the paper.
        max_rows: rows used.

    Returns:
        A scalar tensor.

    """
    if x.dim() != 2 or len(x) < 2:
        raise ValueError(f"uniformity needs [n, d] with n >= 2, got {tuple(x.shape)}")
    x = F.normalize(x[:max_rows].float(), dim=1)
    return torch.pdist(x, p=2).pow(2).mul(-t).exp().mean().log()


def _relevance(
    retrieved: np.ndarray, positives: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    retrieved = np.asarray(retrieved)
    positives = np.asarray(positives)
    if positives.ndim == 1:
        positives = positives[:, None]
    if retrieved.ndim != 2 or len(retrieved) != len(positives):
        raise ValueError(
            f"retrieved must be [n, K] and positives [n] or [n, P]; got {retrieved.shape} "
            f"and {positives.shape}"
        )
    if k < 1 or k > retrieved.shape[1]:
        raise ValueError(f"k={k} must be in 1..{retrieved.shape[1]} (columns of retrieved)")
    top = retrieved[:, :k]
    valid = positives >= 0
    rel = (top[:, :, None] == positives[:, None, :]) & valid[:, None, :]
    return rel.any(-1), valid.sum(1)


def recall_at_k(retrieved: np.ndarray, positives: np.ndarray, k: int) -> float:
    """Mean over queries of (positives in the top ``k``) / (number of positives).

    Args:
        retrieved: ``int[n, K]`` ranked ids per query (``K >= k``).
        positives: ``int[n]`` one positive id per query, or ``int[n, P]`` padded with -1.
        k: cut-off.

    Example:
        >>> recall_at_k(np.array([[3, 1], [2, 0]]), np.array([1, 5]), 2)
        0.5

    """
    hits, n_pos = _relevance(retrieved, positives, k)
    return float(np.mean(hits.sum(1) / np.maximum(n_pos, 1)))


def ndcg_at_k(retrieved: np.ndarray, positives: np.ndarray, k: int) -> float:
    """Normalised discounted cumulative gain at ``k`` with binary relevance.

    ``DCG = sum_r rel_r / log2(r + 2)`` over ranks ``r = 0..k-1``; the ideal DCG places
    ``min(P, k)`` positives first. Shapes as in :func:`recall_at_k`.

    Example:
        >>> round(ndcg_at_k(np.array([[3, 1]]), np.array([1]), 2), 4)
        0.6309

    """
    hits, n_pos = _relevance(retrieved, positives, k)
    discounts = 1.0 / np.log2(np.arange(k) + 2.0)
    dcg = (hits * discounts).sum(1)
    ideal = np.array([discounts[: min(int(p), k)].sum() for p in n_pos])
    return float(np.mean(np.where(ideal > 0, dcg / np.maximum(ideal, 1e-12), 0.0)))


def ann_recall_at_k(approx: np.ndarray, exact: np.ndarray, k: int) -> float:
    """Fraction of the exact top-``k`` ids that the approximate search also returns.

    Args:
        approx: ``int[n, >=k]`` ids from the approximate index.
        exact: ``int[n, >=k]`` ids from exact search.
        k: cut-off.

    Example:
        >>> ann_recall_at_k(np.array([[1, 2]]), np.array([[2, 3]]), 2)
        0.5

    """
    approx, exact = np.asarray(approx)[:, :k], np.asarray(exact)[:, :k]
    if approx.shape != exact.shape:
        raise ValueError(f"approx {approx.shape} and exact {exact.shape} must match at k={k}")
    hits = (approx[:, :, None] == exact[:, None, :]).any(-1).sum(1)
    return float(np.mean(hits / k))
