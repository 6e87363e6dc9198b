"""How often each item is sampled as an in-batch candidate: the ``Q`` of the log-Q correction.

Two estimates: from item counts of the training data (:func:`counts_log_q`), or streamed
from the batches themselves (:class:`StreamingItemFrequency`, Yi et al., "Sampling-Bias-
Corrected Neural Modeling for Large Corpus Item Recommendations", RecSys 2019, Algorithm 2).
Both give the log of an item's expected count per batch, on the same scale.
"""

from __future__ import annotations

import torch
from torch import nn

from ssl_rec._checks import check_at_least, check_rate
from ssl_rec._config import RecordsConfig


def counts_log_q(counts: torch.Tensor, batch_size: int, smoothing: float = 1.0) -> torch.Tensor:
    """Log expected count per batch of every item, ``log(B * (c + s) / (sum(c) + s N))``.

    Args:
        counts: ``int64 | float32[N]`` occurrences of each item id among training positives.
        batch_size: ``B``, positives per batch.
        smoothing: pseudo-count ``s`` added to every item (> 0 keeps unseen items finite).

    Returns:
        ``float32[N]``.

    Example:
        >>> counts_log_q(torch.tensor([1, 3]), 2, smoothing=0.0).exp()
        tensor([0.5000, 1.5000])

    """
    counts = counts.double() + float(smoothing)
    total = counts.sum()
    if total <= 0:
        raise ValueError("counts_log_q: the item counts are all zero; give smoothing > 0")
    return (batch_size * counts / total).clamp_min(1e-30).log().float()


class StreamingItemFrequency(RecordsConfig, nn.Module):
    """Streaming frequency estimation over hashed item ids (Yi et al. 2019, Algorithm 2).

    Ids share bucket ``id % buckets``. For each bucket it keeps the step at which an item was
    last seen (``A``) and a moving average of the number of steps between its appearances
    (``B``); ``1 / B`` estimates how many times per batch the item turns up, whatever the
    data's order or drift.

    Args:
        buckets: size of the hash arrays; collisions (when ``buckets < N``) over-estimate.
        alpha: moving-average rate in ``(0, 1]``.

    Shape:
        ``update(ids int64[B])`` then ``log_q(ids int64[n]) -> float32[n]``.

    """

    def __init__(self, buckets: int = 1 << 20, alpha: float = 0.01) -> None:
        super().__init__()
        self.buckets = check_at_least("StreamingItemFrequency", "buckets", buckets)
        self.alpha = check_rate("StreamingItemFrequency", "alpha", alpha)
        if self.alpha == 0:
            raise ValueError("StreamingItemFrequency.alpha must be in (0, 1], got 0.0")
        self.register_buffer("last_step", torch.zeros(self.buckets, dtype=torch.float64))
        self.register_buffer("gap", torch.zeros(self.buckets, dtype=torch.float64))
        self.register_buffer("step", torch.zeros((), dtype=torch.float64))

    def _bucket(self, ids: torch.Tensor) -> torch.Tensor:
        # Ids are already dense vocabulary indices: ``buckets >= N`` means no collisions.
        return ids.long() % self.buckets

    @torch.no_grad()
    def update(self, ids: torch.Tensor) -> None:
        """Record one batch of positive item ids (one training step)."""
        self.step += 1
        seen = torch.unique(self._bucket(ids.flatten()))
        gap = self.gap[seen]
        # A bucket seen for the first time starts from its distance to step 0.
        self.gap[seen] = (1 - self.alpha) * gap + self.alpha * (self.step - self.last_step[seen])
        self.last_step[seen] = self.step

    def log_q(self, ids: torch.Tensor) -> torch.Tensor:
        """``float32[n]`` log expected count per batch of ``ids`` (at most one per step)."""
        gap = self.gap[self._bucket(ids)]
        return (-gap.clamp_min(1.0).log()).float()
