"""Scoring per-field queries against id embeddings: sampled softmax with in-batch negatives.

Large vocabularies cannot afford a full softmax over their tables (which are not dense
parameters anyway: see ``ssl_rec.hardware``). The candidates of a field are the ids the
batch's first ``C`` rows hold in that field, i.e. a sample from the field's unigram
distribution; the true id is put at index 0 and candidates equal to it are masked out.

Positions are grouped by field and scored with one matmul per field, so nothing of size
``[M, C, D]`` (masked positions x candidates x dim, hundreds of MB per batch) is built.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def by_field(
    x: torch.Tensor, fields: torch.Tensor, fn: Callable[[torch.Tensor, int], torch.Tensor]
) -> torch.Tensor:
    """Apply ``fn(x[fields == f], f)`` per field and return the results in ``x``'s row order.

    Args:
        x: ``[M, ...]`` per-position inputs.
        fields: ``int64[M]`` field of each position.
        fn: maps ``(rows of x of one field, field index)`` to ``[rows, ...]``.

    Returns:
        ``[M, ...]`` the concatenated outputs, rows in the original order.

    """
    if fields.numel() == 0:
        return fn(x, 0)
    order = torch.argsort(fields, stable=True)
    counts = torch.bincount(fields, minlength=1).tolist()
    blocks, start = [], 0
    for f, n in enumerate(counts):
        if n:
            blocks.append(fn(x[order[start : start + n]], f))
            start += n
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return torch.cat(blocks)[inverse]


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
        ``float32[M, 1 + C]``; candidates holding the true id are ``-inf``.

    """
    pos = (query * target_emb).sum(-1, keepdim=True)
    neg = by_field(query, fields, lambda q, f: q @ cand_emb[:, f].T)
    same = by_field(target_ids, fields, lambda t, f: cand_ids[:, f].unsqueeze(0) == t[:, None])
    # In place: ``neg`` is a fresh tensor that no backward reads (one temporary fewer).
    return torch.cat([pos, neg.masked_fill_(same, float("-inf"))], dim=1)


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
