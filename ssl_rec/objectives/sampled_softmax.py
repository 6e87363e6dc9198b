"""In-batch sampled softmax with log-Q correction for two-tower retrieval.

Yi et al., "Sampling-Bias-Corrected Neural Modeling for Large Corpus Item Recommendations",
RecSys 2019 (in-batch softmax, ``s_c(x, y) = s(x, y) - log p_y``); Yang et al., "Mixed
Negative Sampling for Learning Two-tower Neural Networks in Recommendations", WWW 2020
(in-batch negatives mixed with uniformly sampled ones).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ssl_rec._checks import check_positive
from ssl_rec._config import RecordsConfig
from ssl_rec.types import ObjectiveOutput


def mixed_log_q(in_batch_log_q: torch.Tensor, n_uniform: int, n_items: int) -> torch.Tensor:
    """Log of the expected count of each candidate among in-batch plus uniform negatives.

    An item appears among the batch's positives ``q`` times on average (``exp(in_batch_log_q)``,
    e.g. ``B * p``) and among ``n_uniform`` uniform draws from ``n_items`` items
    ``n_uniform / n_items`` times, so its expected count is the sum of both.

    Args:
        in_batch_log_q: ``float32[...]`` log expected in-batch count of each candidate.
        n_uniform: uniformly drawn negatives per batch (0: the input is returned).
        n_items: items the uniform draws come from (> 0).

    Example:
        >>> mixed_log_q(torch.tensor([0.0]), 2, 4).exp()
        tensor([1.5000])

    """
    if n_uniform <= 0:
        return in_batch_log_q
    uniform = math.log(n_uniform / n_items)
    return torch.logaddexp(in_batch_log_q, torch.full_like(in_batch_log_q, uniform))


class SampledSoftmax(RecordsConfig, nn.Module):
    """Softmax of each query over the batch's items (+ negatives); the positive is its own item.

    Row ``i`` scores every candidate ``j`` by ``(q_i . v_j) / temperature - log Q_j``, where
    ``log Q_j`` (when given) is the log of candidate ``j``'s sampling rate: popular items are
    negatives more often than the full softmax would weigh them, and subtracting ``log Q``
    removes that bias (Yi et al. 2019). Candidates with the same item id as row ``i``'s
    positive (accidental hits) are left out of row ``i``'s softmax, except the positive itself.

    Args:
        temperature: divides the dot products (> 0); unit vectors want small values.
        log_q: apply the log-Q correction when the caller gives ``log Q``.
        remove_accidental_hits: drop other copies of the positive item from each row.

    Shape:
        ``forward(query float32[B, H], items float32[B, H], item_ids int64[B],
        item_log_q float32[B] | None, negatives float32[M, H] | None,
        negative_ids int64[M] | None, negative_log_q float32[M] | None) -> ObjectiveOutput``.

    Example:
        >>> loss = SampledSoftmax(temperature=1.0)
        >>> out = loss(torch.eye(2), torch.eye(2), torch.tensor([0, 1]))
        >>> round(float(out.loss), 4)  # -log(e / (e + 1))
        0.3133

    """

    def __init__(
        self,
        temperature: float = 0.05,
        log_q: bool = True,
        remove_accidental_hits: bool = True,
    ) -> None:
        super().__init__()
        self.temperature = check_positive("SampledSoftmax", "temperature", temperature)
        self.log_q = bool(log_q)
        self.remove_accidental_hits = bool(remove_accidental_hits)

    def forward(
        self,
        query: torch.Tensor,
        items: torch.Tensor,
        item_ids: torch.Tensor,
        item_log_q: torch.Tensor | None = None,
        negatives: torch.Tensor | None = None,
        negative_ids: torch.Tensor | None = None,
        negative_log_q: torch.Tensor | None = None,
    ) -> ObjectiveOutput:
        """Mean cross-entropy of the positives; logs the loss and the hit rate of each row."""
        b = query.shape[0]
        if items.shape != query.shape or item_ids.shape != (b,):
            raise ValueError(
                f"SampledSoftmax: query {tuple(query.shape)}, items {tuple(items.shape)} and "
                f"item_ids {tuple(item_ids.shape)} must be [B, H], [B, H], [B]"
            )
        candidates, ids, log_q = items, item_ids, item_log_q
        if negatives is not None:
            if negative_ids is None or negative_ids.shape != negatives.shape[:1]:
                raise ValueError("SampledSoftmax: negatives [M, H] need negative_ids [M]")
            if (item_log_q is None) != (negative_log_q is None):
                raise ValueError("SampledSoftmax: give log Q for all candidates or for none")
            candidates = torch.cat([items, negatives])
            ids = torch.cat([item_ids, negative_ids])
            if item_log_q is not None and negative_log_q is not None:
                log_q = torch.cat([item_log_q, negative_log_q])
        logits = query @ candidates.T / self.temperature
        if self.log_q and log_q is not None:
            logits = logits - log_q.to(logits.dtype).unsqueeze(0)
        diagonal = torch.zeros_like(logits, dtype=torch.bool)
        diagonal[:, :b] = torch.eye(b, dtype=torch.bool, device=logits.device)
        hits = (item_ids.unsqueeze(1) == ids.unsqueeze(0)) & ~diagonal
        if self.remove_accidental_hits:
            logits = logits.masked_fill(hits, float("-inf"))
        target = torch.arange(b, device=logits.device)
        loss = F.cross_entropy(logits, target)
        with torch.no_grad():
            top1 = (logits.argmax(dim=1) == target).float().mean()
        logs = {
            "loss": loss.detach(),
            "in_batch_top1": top1,
            "accidental_hits": hits.float().sum(1).mean(),
        }
        return ObjectiveOutput(loss, logs)
