"""Generator and discriminator heads shared by the replaced-feature objectives."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ssl_rec.models.mlp import MLP
from ssl_rec.objectives._candidates import candidate_logits, candidate_mix
from ssl_rec.objectives._inplace_softmax import consumed_cross_entropy, entropy_and_cross_entropy
from ssl_rec.types import BackboneDims, BackboneProtocol, Batch
from ssl_rec.views import View


@dataclass(frozen=True)
class Proposal:
    """The generator's scores for the masked positions of a batch.

    Args:
        rows, fields: ``int64[M]`` masked positions.
        logits: ``float32[M, 1 + C]`` column 0 = true id, then the in-batch candidates.
        true_ids: ``int64[M]`` the id of column 0 at each position.
        true_emb: ``float32[M, D]`` (detached) embedding of column 0 at each position.
        row_ids: ``int64[C, F]`` ids of the ``C`` candidate rows (columns 1..C).
        row_emb: ``float32[C, F, D]`` (detached) embeddings of the candidate rows.

    """

    rows: torch.Tensor
    fields: torch.Tensor
    logits: torch.Tensor
    true_ids: torch.Tensor
    true_emb: torch.Tensor
    row_ids: torch.Tensor
    row_emb: torch.Tensor

    def chosen_ids(self, choice: torch.Tensor) -> torch.Tensor:
        """Id of column ``choice int64[M]`` at each position: ``int64[M]``."""
        cand = self.row_ids[(choice - 1).clamp_min(0), self.fields]
        return torch.where(choice == 0, self.true_ids, cand)

    def mix(self, weights: torch.Tensor) -> torch.Tensor:
        """Weighted sum of the columns' embeddings, ``weights float32[M, 1 + C]`` -> ``[M, D]``."""
        return candidate_mix(weights, self.fields, self.true_emb, self.row_emb)

    def mlm_loss(self, consume: bool = False) -> torch.Tensor:
        """Cross-entropy of the true id (column 0): the generator's masked-LM loss.

        ``consume``: compute it in the logits' storage (nothing may read them afterwards).
        """
        if not self.rows.numel():
            return self.logits.sum()
        target = torch.zeros_like(self.rows)
        if consume:
            return consumed_cross_entropy(self.logits, target)
        return F.cross_entropy(self.logits, target)

    def entropy_and_mlm_loss(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean entropy of the proposal distributions (nats) and :meth:`mlm_loss`."""
        if not self.rows.numel():
            zero = self.logits.sum()
            return zero, zero
        return entropy_and_cross_entropy(self.logits, torch.zeros_like(self.rows))


class FieldGenerator(nn.Module):
    """A small masked-field model proposing replacement ids.

    Reads the (detached) embeddings of the masked row and its dense features, decodes one
    query per field and scores it against the true id and the ids of ``num_candidates``
    in-batch rows (see ``_candidates``), so proposals follow the data's marginals.

    Shape:
        ``field_emb float32[B, F, D]``, ``dense float32[B, n_dense]`` -> :class:`Proposal`.
    """

    def __init__(self, n_fields: int, n_dense: int, dim: int, hidden: int, num_candidates: int):
        super().__init__()
        self.mlp = MLP(n_fields * dim + n_dense, [hidden, n_fields * dim])
        self.num_candidates = num_candidates

    def forward(
        self,
        masked_emb: torch.Tensor,
        dense: torch.Tensor,
        emb: torch.Tensor,
        sparse: torch.Tensor,
        field_mask: torch.Tensor,
    ) -> Proposal:
        """Score candidates for the ``True`` positions of ``field_mask bool[B, F]``."""
        b, n_fields, dim = emb.shape
        flat = torch.cat([rearrange(masked_emb, "b f d -> b (f d)"), dense], 1)
        query = rearrange(self.mlp(flat), "b (f d) -> b f d", f=n_fields, d=dim)
        rows, fields = field_mask.nonzero(as_tuple=True)
        c = min(self.num_candidates, b)
        logits = candidate_logits(
            query[rows, fields],
            fields,
            emb[rows, fields],
            sparse[rows, fields],
            emb[:c],
            sparse[:c],
        )
        return Proposal(rows, fields, logits, sparse[rows, fields], emb[rows, fields],
                        sparse[:c], emb[:c])  # fmt: skip


class ReplacementDiscriminator(nn.Module):
    """Per-field "was this id replaced?" logits from the backbone's representation.

    An MLP over the row's pooled vector and all its field tokens, so it can check each
    token against the others (the backbone's pooled vector alone need not say *which*
    field is inconsistent).

    Shape:
        ``pooled float32[B, H]``, ``field_emb float32[B, F, D]`` -> ``float32[B, F]``.
    """

    def __init__(self, in_dim: int, n_fields: int, dim: int, hidden: int = 128) -> None:
        super().__init__()
        self.mlp = MLP(in_dim + n_fields * dim, [hidden, n_fields])

    def forward(self, pooled: torch.Tensor, field_emb: torch.Tensor) -> torch.Tensor:
        """Return the replacement logits."""
        return self.mlp(torch.cat([pooled, rearrange(field_emb, "b f d -> b (f d)")], 1))


def replacement_heads(
    dims: BackboneDims, generator_hidden: int, num_candidates: int
) -> tuple[FieldGenerator, ReplacementDiscriminator]:
    """The generator and the per-field discriminator head for a backbone of ``dims``."""
    generator = FieldGenerator(
        dims.n_fields, dims.n_dense, dims.embedding_dim, generator_hidden, num_candidates
    )
    discriminator = ReplacementDiscriminator(dims.output_dim, dims.n_fields, dims.embedding_dim)
    return generator, discriminator


def propose(
    view: View, generator: FieldGenerator, batch: Batch, backbone: BackboneProtocol
) -> tuple[Batch, Proposal]:
    """Corrupt/mask ``batch`` with ``view`` and score replacement candidates.

    The generator reads the backbone's embeddings without gradient: its loss never trains
    the backbone (as in ELECTRA, samples are not back-propagated through).
    """
    batch, mask = view.corrupt(batch)
    with torch.no_grad():
        masked_emb = backbone.embed(batch.sparse, mask)
        emb = backbone.embed(batch.sparse)
    return batch, generator(masked_emb, batch.dense, emb, batch.sparse, mask)


def replace_ids(sparse: torch.Tensor, proposal: Proposal, choice: torch.Tensor) -> torch.Tensor:
    """Write the chosen candidate (``choice int64[M]`` column indices) into ``sparse``."""
    out = sparse.clone()
    out[proposal.rows, proposal.fields] = proposal.chosen_ids(choice)
    return out


def detection_loss(logits: torch.Tensor, replaced: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """Balanced BCE of the discriminator (replaced and original positions weigh half each).

    Balancing keeps the rare "replaced" class from being ignored when few fields are masked.
    """
    target = replaced.float()
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    pos = replaced.float()
    n_pos, n_neg = pos.sum().clamp_min(1.0), (1 - pos).sum().clamp_min(1.0)
    loss = 0.5 * ((bce * pos).sum() / n_pos + (bce * (1 - pos)).sum() / n_neg)
    pred = logits > 0
    logs = {
        "detection_accuracy": (pred == replaced).float().mean(),
        "replaced_recall": ((pred & replaced).float().sum() / n_pos),
        "replaced_fraction": pos.mean(),
    }
    return loss, logs
