"""Softmax cross-entropy computed in its logits' own storage.

The objectives' logits are large (a ``[2B, 2B]`` similarity matrix, ``[M, 1 + C]``
candidate scores: tens to hundreds of MB per step) and each is read once by the loss. Here
the log-probabilities overwrite the logits and backward overwrites them with the gradient,
so a step keeps one such tensor instead of four and passes over it fewer times.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Logits handled at once by the objectives that go through theirs in row blocks (MoCo's
# queue contrast, NT-Xent): about 8 MB, so a block's log-softmax, softmax and gradient
# products read it from cache, not memory. 1.6x faster than one pass over all rows at
# N = 1024 x 16,385 (MoCo) and 4,096 x 4,096 (NT-Xent) on one core; a quarter and twice
# the size were slower.
BLOCK_LOGITS = 1 << 21


def log_softmax_nll_(
    logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """``F.cross_entropy(logits, target, reduction=...)``, overwriting ``logits float32[N, K]``.

    ``logits`` then holds its row-wise log-probabilities (what :func:`softmax_minus_onehot_`
    turns into the gradient): the same values as ``F.cross_entropy``, computed by the same
    operations, without a second ``[N, K]`` tensor.
    """
    torch.log_softmax(logits, 1, out=logits)
    return F.nll_loss(logits, target, reduction=reduction)


def softmax_minus_onehot_(log_probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The summed cross-entropy's gradient in the logits, ``softmax - onehot(target)``, in place.

    ``log_probs float32[N, K]`` (from :func:`log_softmax_nll_`) is overwritten and returned.
    """
    # softmax(log p) = p: the softmax kernel's exponential takes -inf (an excluded class)
    # at full speed, where exp_ slows down several-fold on rows that hold one.
    torch.softmax(log_probs, 1, out=log_probs)
    log_probs[torch.arange(target.shape[0], device=target.device), target] -= 1.0
    return log_probs


class _ConsumedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        logits: torch.Tensor,
        target: torch.Tensor,
        reduction: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.mark_dirty(logits)
        loss = log_softmax_nll_(logits, target, reduction)
        ctx.log_probs, ctx.target = logits, target
        ctx.scale = 1.0 / max(target.shape[0], 1) if reduction == "mean" else 1.0
        return loss, logits

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # noqa: ANN001, D102
        out = softmax_minus_onehot_(ctx.log_probs, ctx.target)
        ctx.log_probs = None
        return out.mul_(grad * ctx.scale), None, None


def consumed_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """``F.cross_entropy(logits, target, reduction=...)`` that uses up ``logits``.

    Args:
        logits: ``float32[N, K]``, differentiable; afterwards it holds log-probabilities and,
            after backward, the gradient: nothing else may read it (it is a fresh tensor of
            the caller's).
        target: ``int64[N]`` class of each row.
        reduction: ``"mean"`` or ``"sum"``.

    Returns:
        the scalar loss (the same value as ``F.cross_entropy``).

    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    if not (torch.is_grad_enabled() and logits.requires_grad):
        return log_softmax_nll_(logits, target, reduction)
    loss, _ = _ConsumedCrossEntropy.apply(logits, target, reduction)
    return loss


class _EntropyAndCrossEntropy(torch.autograd.Function):
    """Mean entropy of ``softmax(logits)`` and mean cross-entropy, one backward pass.

    The forward is the plain formulation's (to rounding); the backward writes
    ``p * (g_ce - g_h * (log p + H)) - g_ce * onehot`` (over ``M`` rows) in one buffer
    instead of differentiating ``exp``, ``nan_to_num``, the product and ``log_softmax``
    one by one.
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        logits: torch.Tensor,
        target: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = logits.log_softmax(1)
        probs = logits.softmax(1)  # = exp(log_probs); exp slows down on -inf, softmax does not
        finite = log_probs.nan_to_num(neginf=0.0)
        row_entropy = -(probs * finite).sum(1)
        ctx.save_for_backward(probs, finite, row_entropy, target)
        return row_entropy.mean(), F.nll_loss(log_probs, target)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(  # noqa: D102
        ctx,  # noqa: ANN001
        grad_entropy: torch.Tensor,
        grad_ce: torch.Tensor,
    ) -> tuple[torch.Tensor, None]:
        probs, finite, row_entropy, target = ctx.saved_tensors
        m = max(target.shape[0], 1)
        out = finite.add_(row_entropy[:, None]).mul_(-grad_entropy / m).add_(grad_ce / m)
        out.mul_(probs)
        out[torch.arange(target.shape[0], device=target.device), target] -= grad_ce / m
        return out, None


def entropy_and_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean entropy (nats) of ``softmax(logits float32[M, K])`` and ``F.cross_entropy``.

    ``-inf`` logits (impossible classes) add nothing to the entropy. Both scalars have the
    values of the plain formulation (the entropy to rounding); their gradients are computed
    together.
    """
    if torch.is_grad_enabled() and logits.requires_grad:
        return _EntropyAndCrossEntropy.apply(logits, target)
    log_probs = logits.log_softmax(1)
    entropy = -(log_probs.exp() * log_probs.nan_to_num(neginf=0.0)).sum(1).mean()
    return entropy, F.nll_loss(log_probs, target)
