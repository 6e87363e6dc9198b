"""Scoring per-field queries against id embeddings: sampled softmax with in-batch negatives.

Large vocabularies cannot afford a full softmax over their tables (which are not dense
parameters anyway: see ``ssl_rec.hardware``). The candidates of a field are the ids the
batch's first ``C`` rows hold in that field, i.e. a sample from the field's unigram
distribution; the true id is put at index 0 and candidates equal to it are masked out.

Positions are grouped by field and scored with one matmul per field, so nothing of size
``[M, C, D]`` (masked positions x candidates x dim, hundreds of MB per batch) is built.
"""

from __future__ import annotations

import torch


def field_groups(fields: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """``(field, positions)`` for each field present in ``fields int64[M]``, in field order.

    ``positions`` are ascending indices into ``fields`` (a stable sort).
    """
    order = torch.argsort(fields, stable=True)
    counts = torch.bincount(fields, minlength=1).tolist()
    groups, start = [], 0
    for f, n in enumerate(counts):
        if n:
            groups.append((f, order[start : start + n]))
            start += n
    return groups


class _CandidateLogits(torch.autograd.Function):
    """:func:`candidate_logits` with one output buffer and a per-field backward.

    Autograd of the per-field products, their concatenation and reordering keeps several
    ``[M, C]`` copies and, per field, zero-fills a ``[M, D]`` and a ``[C, F, D]`` gradient;
    here each field's block is written into the output once and its gradient read back once
    (the same values: each product and mask is the one of the plain formulation).
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        query: torch.Tensor,
        target_emb: torch.Tensor,
        cand_emb: torch.Tensor,
        fields: torch.Tensor,
        target_ids: torch.Tensor,
        cand_ids: torch.Tensor,
    ) -> torch.Tensor:
        groups = field_groups(fields)
        out = query.new_empty(query.shape[0], 1 + cand_emb.shape[0])
        out[:, 0] = (query * target_emb).sum(-1)
        neg = out[:, 1:]
        for f, rows in groups:
            block = query[rows] @ cand_emb[:, f].T
            block.masked_fill_(cand_ids[:, f] == target_ids[rows, None], float("-inf"))
            neg.index_copy_(0, rows, block)
        ctx.groups = groups
        ctx.save_for_backward(query, target_emb, cand_emb, target_ids, cand_ids)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # noqa: ANN001, D102
        query, target_emb, cand_emb, target_ids, cand_ids = ctx.saved_tensors
        need_query, need_target, need_cand = ctx.needs_input_grad[:3]
        pos = grad[:, :1]
        grad_query = pos * target_emb if need_query else None
        grad_target = pos * query if need_target else None
        grad_cand = torch.zeros_like(cand_emb) if need_cand else None
        if need_query or need_cand:
            for f, rows in ctx.groups:
                block = grad.index_select(0, rows)[:, 1:]  # whole rows: a copy per row
                block.masked_fill_(cand_ids[:, f] == target_ids[rows, None], 0.0)
                if need_query:
                    grad_query.index_add_(0, rows, block @ cand_emb[:, f])
                if need_cand:
                    # The operand order of autograd's matmul backward: the same GEMM, so the
                    # same rounding on every CPU (a transposed product rounds differently on some).
                    grad_cand[:, f] = (query[rows].T @ block).T
        return grad_query, grad_target, grad_cand, None, None, None


def candidate_logits(
    query: torch.Tensor,
    fields: torch.Tensor,
    target_emb: torch.Tensor,
    target_ids: torch.Tensor,
    cand_emb: torch.Tensor,
    cand_ids: torch.Tensor,
) -> torch.Tensor:
    """Logits of the true id (column 0) against in-batch candidates (columns 1..C).

    Args:
        query: ``float32[M, D]`` one query per selected (row, field) position.
        fields: ``int64[M]`` field of each position.
        target_emb: ``float32[M, D]`` embedding of each position's true id.
        target_ids: ``int64[M]`` true ids.
        cand_emb: ``float32[C, F, D]`` candidate embeddings (all fields of ``C`` rows).
        cand_ids: ``int64[C, F]`` candidate ids.

    Returns:
        ``float32[M, 1 + C]``; candidates holding the true id are ``-inf``. Differentiable
        in ``query``, ``target_emb`` and ``cand_emb``.

    """
    return _CandidateLogits.apply(query, target_emb, cand_emb, fields, target_ids, cand_ids)


class _CandidateMix(torch.autograd.Function):
    """:func:`candidate_mix`: each field's block multiplied and written once, both ways.

    Autograd of per-field products on ``weights[rows]`` zero-fills and accumulates an
    ``[M, C]`` gradient once per field; here each field's rows of it are written once.
    """

    @staticmethod
    def forward(  # noqa: D102
        ctx,  # noqa: ANN001
        weights: torch.Tensor,
        fields: torch.Tensor,
        target_emb: torch.Tensor,
        cand_emb: torch.Tensor,
    ) -> torch.Tensor:
        groups = field_groups(fields)
        rest = target_emb.new_empty(target_emb.shape)
        for f, rows in groups:
            rest.index_copy_(0, rows, weights.index_select(0, rows)[:, 1:] @ cand_emb[:, f])
        ctx.groups = groups
        ctx.save_for_backward(target_emb, cand_emb)
        return weights[:, :1] * target_emb + rest

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:  # noqa: ANN001, D102
        target_emb, cand_emb = ctx.saved_tensors
        out = grad.new_empty(grad.shape[0], 1 + cand_emb.shape[0])
        out[:, 0] = (grad * target_emb).sum(1)
        rest = out[:, 1:]
        for f, rows in ctx.groups:
            rest.index_copy_(0, rows, grad[rows] @ cand_emb[:, f].T)
        return out, None, None, None


def candidate_mix(
    weights: torch.Tensor, fields: torch.Tensor, target_emb: torch.Tensor, cand_emb: torch.Tensor
) -> torch.Tensor:
    """Weighted sums of the columns' embeddings of :func:`candidate_logits`: ``float32[M, D]``.

    Args:
        weights: ``float32[M, 1 + C]`` (differentiable) column 0 = the true id, then the
            candidates.
        fields: ``int64[M]`` field of each position.
        target_emb: ``float32[M, D]`` embedding of each position's true id (a constant).
        cand_emb: ``float32[C, F, D]`` candidate embeddings (a constant).

    """
    if fields.numel() == 0:
        return weights[:, :1] * target_emb
    return _CandidateMix.apply(weights, fields, target_emb, cand_emb)


def gumbel_noise(
    shape: torch.Size, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Draw standard Gumbel noise from ``generator``.

    ``torch.nn.functional.gumbel_softmax`` takes no generator, so seeded runs draw it here.
    """
    u = torch.rand(shape, generator=generator, device=device).clamp_(1e-9, 1.0 - 1e-9)
    # In place: the same operations and values as -log(-log(u)) without three temporaries
    # of the logits' size (tens of MB per batch, each paying fresh pages).
    return u.log_().neg_().log_().neg_()


def gumbel_argmax(
    logits: torch.Tensor,
    generator: torch.Generator,
    temperature: float = 1.0,
    exclude_first: bool = False,
    rows_per_draw: int = 1024,
) -> torch.Tensor:
    """Gumbel-max samples ``argmax(logits / temperature + G)`` per row: ``int64[M]``.

    ``logits float32[M, K]``; ``exclude_first`` never picks column 0. The noise is drawn
    ``rows_per_draw`` rows at a time and each block's maximum taken while it is in cache:
    on CPU, where a generator's stream does not depend on how a draw is split, the same
    noise and choices as one ``[M, K]`` draw (:func:`gumbel_noise`), without its
    ``[M, K]`` temporaries.
    """
    out = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for start in range(0, logits.shape[0], rows_per_draw):
        block = logits[start : start + rows_per_draw]
        noisy = gumbel_noise(block.shape, generator, block.device)
        noisy.add_(block if temperature == 1.0 else block / temperature)
        if exclude_first:
            noisy[:, 0] = float("-inf")
        out[start : start + rows_per_draw] = noisy.max(1).indices
    return out
