"""CTR metrics as torchmetrics: AUC, logloss, normalized entropy and calibration."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import BinaryAUROC


class _LabelAndLossSums(Metric):
    """Accumulates summed BCE, summed predictions, summed labels and the row count."""

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


class LogLoss(_LabelAndLossSums):
    """Mean binary cross-entropy (natural log) over all rows seen."""

    def compute(self) -> torch.Tensor:
        """Return ``sum(bce) / n``."""
        return (self.bce / self.count.clamp_min(1)).float()


class NormalizedEntropy(_LabelAndLossSums):
    """Logloss divided by the entropy of the observed click rate (He et al., ADKDD 2014).

    NE < 1 means the model beats always predicting the average CTR.
    """

    def compute(self) -> torch.Tensor:
        """Return ``logloss / H(p)`` with ``p`` the observed CTR."""
        n = self.count.clamp_min(1)
        p = (self.label / n).clamp(1e-12, 1 - 1e-12)
        entropy = -(p * torch.log(p) + (1 - p) * torch.log(1 - p))
        return (self.bce / n / entropy).float()


class Calibration(_LabelAndLossSums):
    """Predicted CTR over observed CTR (1.0 is perfectly calibrated on average)."""

    def compute(self) -> torch.Tensor:
        """Return ``sum(sigmoid(logit)) / sum(label)``."""
        if self.label.item() == 0:
            return torch.tensor(math.nan)
        return (self.pred / self.label).float()


class _AUC(BinaryAUROC):
    """Binary AUROC taking logits and float labels."""

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:  # noqa: D102
        super().update(torch.sigmoid(logits.detach()), labels.detach().long())


def ctr_metrics(prefix: str) -> MetricCollection:
    """Metrics ``{prefix}auc, logloss, ne, calibration``, updated with ``(logits, labels)``."""
    return MetricCollection(
        {
            "auc": _AUC(),
            "logloss": LogLoss(),
            "ne": NormalizedEntropy(),
            "calibration": Calibration(),
        },
        prefix=prefix,
    )
