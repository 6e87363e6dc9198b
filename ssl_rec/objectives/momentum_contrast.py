"""MoCo: contrast queries against a momentum-encoded key and a queue of past keys."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ssl_rec._checks import check_at_least, check_positive, check_rate
from ssl_rec.metrics import alignment, uniformity
from ssl_rec.models.backbone import ema_update
from ssl_rec.objectives._inplace_softmax import log_softmax_nll_, softmax_minus_onehot_
from ssl_rec.objectives.base import Objective
from ssl_rec.objectives.contrastive import ProjectionHead
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput
from ssl_rec.views import CorrelatedFieldMask, View


class _QueueContrast(torch.autograd.Function):
    """Mean cross-entropy of ``[q.k, q @ queue^T] / t`` against column 0, one ``[N, 1 + K]`` buffer.

    The logits are written and turned into log-probabilities in one buffer, which backward
    turns into the gradient in place (``F.cross_entropy`` of the concatenated logits, to
    rounding). Only ``q`` gets a gradient: keys and queue are constants.
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        q: torch.Tensor,
        k: torch.Tensor,
        queue: torch.Tensor,
        temperature: float,
    ) -> torch.Tensor:
        logits = q.new_empty(q.shape[0], 1 + queue.shape[0])
        scaled = q / temperature  # 1/t on the queries: no pass over the [N, 1 + K] logits
        logits[:, 0] = (scaled * k).sum(1)
        # A copy (the product runs faster with it contiguous) that backward reads: the
        # caller updates the queue in place before backward runs.
        keys = queue.T.contiguous()
        torch.mm(scaled, keys, out=logits[:, 1:])
        target = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        loss = log_softmax_nll_(logits, target)
        ctx.log_probs, ctx.target, ctx.temperature = logits, target, temperature
        ctx.save_for_backward(k, keys)
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:  # noqa: ANN001, D102
        k, keys = ctx.saved_tensors
        g = softmax_minus_onehot_(ctx.log_probs, ctx.target)
        ctx.log_probs = None
        grad_q = torch.addmm(g[:, :1] * k, g[:, 1:], keys.T)
        return grad_q.mul_(grad / (g.shape[0] * ctx.temperature)), None, None, None


class MomentumContrast(Objective):
    """Momentum contrast with a queue of negatives.

    He et al., "Momentum Contrast for Unsupervised Visual Representation Learning", CVPR
    2020, https://arxiv.org/abs/1911.05722 (Algorithm 1); MoCo v2's MLP projection
    (https://arxiv.org/abs/2003.04297). Logs alignment and uniformity (Wang & Isola 2020).

    The key encoder is a momentum copy of the backbone's *dense* encoder and of the
    projection head only; keys look up the *shared* embedding tables without gradient.
    Why: the tables are not parameters (a fused optimizer updates them in backward), are
    usually most of the model's memory, and change slowly per row (each row is touched
    only when its id occurs), which is the consistency the momentum average provides for
    the dense layers.

    Args:
        view: augmentation for the query and key views (drawn independently).
        projection_dim: width of the projected keys and queries.
        temperature: softmax temperature (> 0).
        queue_size: number of past keys kept as negatives (>= 1).
        momentum: key-encoder EMA coefficient in [0, 1] (1 freezes the keys' encoder).
        max_rows: use only the batch's first ``max_rows`` rows as queries (rows arrive
            shuffled); the queue supplies the negatives, so a few thousand logits per row
            are enough and larger batches only cost time.

    """

    def __init__(
        self,
        view: View | None = None,
        projection_dim: int = 64,
        temperature: float = 0.2,
        queue_size: int = 4096,
        momentum: float = 0.99,
        max_rows: int = 1024,
    ) -> None:
        super().__init__()
        self.temperature = check_positive("MomentumContrast", "temperature", temperature)
        self.momentum = check_rate("MomentumContrast", "momentum", momentum)
        sizes = {"projection_dim": projection_dim, "queue_size": queue_size, "max_rows": max_rows}
        for key, value in sizes.items():
            check_at_least("MomentumContrast", key, value)
        self.view = view if view is not None else View(CorrelatedFieldMask(0.5))
        self.projection_dim, self.queue_size = int(projection_dim), int(queue_size)
        self.max_rows = int(max_rows)

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the projection head, its momentum twin, the key encoder and the queue."""
        self.projection = ProjectionHead(backbone.dims.output_dim, 128, self.projection_dim)
        self.key_encoder = backbone.clone_encoder()
        self.key_projection = copy.deepcopy(self.projection).requires_grad_(False)
        queue = F.normalize(torch.randn(self.queue_size, self.projection_dim), dim=1)
        self.register_buffer("queue", queue)
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def _momentum_update(self, backbone: BackboneProtocol) -> None:
        backbone.update_encoder_copy(self.key_encoder, self.momentum)
        ema_update(self.key_projection, self.projection, self.momentum)

    @torch.no_grad()
    def _keys(self, batch: Batch, backbone: BackboneProtocol) -> torch.Tensor:
        batch, mask = self.view.corrupt(batch, backbone)
        n_fields = batch.sparse.shape[1]
        field_emb = backbone.embed(batch.sparse, mask[:, :n_fields])
        standardized = backbone.standardize_dense(batch.dense)
        if mask.shape[1] > n_fields:  # numeric tokens: the key encoder masks them as well
            pooled, _ = self.key_encoder(field_emb, standardized, mask[:, n_fields:])
        else:
            pooled, _ = self.key_encoder(field_emb, standardized)
        return F.normalize(self.key_projection(pooled), dim=1)

    @torch.no_grad()
    def _enqueue(self, keys: torch.Tensor) -> None:
        keys = keys[-self.queue_size :]
        n, ptr = keys.shape[0], int(self.queue_ptr)
        idx = (ptr + torch.arange(n, device=keys.device)) % self.queue_size
        self.queue[idx] = keys
        self.queue_ptr.fill_((ptr + n) % self.queue_size)

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """InfoNCE of each query against its key (positive) and the queue (negatives)."""
        batch = batch.head(self.max_rows)
        if self.training:
            self._momentum_update(backbone)
        q = F.normalize(self.projection(self.view(batch, backbone).rep.pooled), dim=1)
        k = self._keys(batch, backbone)
        loss = _QueueContrast.apply(q, k, self.queue, self.temperature)
        if self.training:
            self._enqueue(k)
        logs = {
            "loss": loss.detach(),
            "alignment": alignment(q, k).detach(),
            "uniformity": uniformity(q.detach(), max_rows=1024),
        }
        return ObjectiveOutput(loss, logs)
