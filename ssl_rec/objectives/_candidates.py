"""Scoring per-field queries against id embeddings: sampled softmax with in-batch negatives.

Large vocabularies cannot afford a full softmax over their tables (which are not dense
parameters anyway: see ``ssl_rec.hardware``). The candidates of a field are the ids the
batch's first ``C`` rows hold in that field, i.e. a sample from the field's unigram
distribution; the true id is put at index 0 and candidates equal to it are masked out.
"""

from __future__ import annotations

import torch


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
    neg = torch.einsum("md,cmd->mc", query, cand_emb[:, fields])
    same = cand_ids[:, fields].T == target_ids.unsqueeze(1)
    return torch.cat([pos, neg.masked_fill(same, float("-inf"))], dim=1)


def gumbel_noise(
    shape: torch.Size, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Draw standard Gumbel noise from ``generator``.

    ``torch.nn.functional.gumbel_softmax`` takes no generator, so seeded runs draw it here.
    """
    u = torch.rand(shape, generator=generator, device=device).clamp(1e-9, 1.0 - 1e-9)
    return -torch.log(-torch.log(u))
