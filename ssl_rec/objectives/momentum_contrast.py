"""MoCo: contrast queries against a momentum-encoded key and a queue of past keys."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ssl_rec._checks import check_at_least, check_positive, check_rate
from ssl_rec.metrics import alignment, uniformity
from ssl_rec.models.backbone import ema_update
from ssl_rec.objectives import _inplace_softmax
from ssl_rec.objectives._inplace_softmax import softmax_minus_onehot_
from ssl_rec.objectives.base import Objective
from ssl_rec.objectives.contrastive import ProjectionHead
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput
from ssl_rec.views import CorrelatedFieldMask, View


class _QueueContrast(torch.autograd.Function):
    """Mean cross-entropy of ``[q.k, q @ queue^T] / t`` against column 0, in row blocks.

    Each block of query rows gets its logits, their log-softmax and, when ``q`` needs a
    gradient, the gradient rows ``(softmax - onehot) @ [k, queue] / (N t)`` before the next
    block is written: one block-sized buffer instead of an ``[N, 1 + K]`` one, read from
    cache. Backward only scales the stored gradient. The loss is ``F.cross_entropy`` of the
    concatenated logits and the gradient autograd's, to float32 rounding. Only ``q`` gets a
    gradient: keys and queue are constants.
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        q: torch.Tensor,
        k: torch.Tensor,
        queue: torch.Tensor,
        temperature: float,
    ) -> torch.Tensor:
        rows, width = q.shape[0], 1 + queue.shape[0]
        scaled = q / temperature  # 1/t on the queries: no pass over the logits
        positive = (scaled * k).sum(1)
        keys = queue.T.contiguous()  # the product runs faster with it contiguous
        block = max(1, min(rows, _inplace_softmax.BLOCK_LOGITS // width))
        buffer = q.new_empty(block, width)
        grad = q.new_empty(q.shape) if ctx.needs_input_grad[0] else None
        total = q.new_zeros(())
        positive_column = torch.zeros(block, dtype=torch.long, device=q.device)
        for start in range(0, rows, block):
            end = min(rows, start + block)
            logits = buffer[: end - start]
            logits[:, 0] = positive[start:end]
            torch.mm(scaled[start:end], keys, out=logits[:, 1:])
            torch.log_softmax(logits, 1, out=logits)
            total -= logits[:, 0].sum()
            if grad is not None:
                # p - onehot(0): this block's gradient in the logits
                softmax_minus_onehot_(logits, positive_column[: end - start])
                torch.addmm(logits[:, :1] * k[start:end], logits[:, 1:], keys.T,
                             out=grad[start:end])  # fmt: skip
        ctx.grad = None if grad is None else grad.div_(rows * temperature)
        return total / rows

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:  # noqa: ANN001, D102
        out, ctx.grad = ctx.grad.mul_(grad), None
        return out, None, None, None


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
