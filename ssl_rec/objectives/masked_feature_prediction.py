"""Masked feature prediction: hide fields, predict their ids from the rest of the row."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ssl_rec._checks import check_at_least, check_positive
from ssl_rec.models.mlp import MLP
from ssl_rec.objectives._candidates import candidate_logits
from ssl_rec.objectives.base import Objective
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput
from ssl_rec.views import RandomFieldMask, View


class MaskedFeaturePrediction(Objective):
    """BERT-style masked-field modelling on tabular rows.

    Devlin et al., "BERT", NAACL 2019, https://arxiv.org/abs/1810.04805 (masked LM), as
    adapted to recommendation features (Yao et al., CIKM 2021,
    https://arxiv.org/abs/2007.12865, Section 3.3). The backbone encodes the row with
    ``[MASK]`` tokens; a query ``[F, D]`` is decoded from its pooled vector and scored
    against the hidden ids. Fields with at most ``full_softmax_max`` ids use a full softmax;
    larger ones a sampled softmax whose negatives are the ids of ``num_candidates``
    in-batch rows, scored with the (shared, trained) embedding tables.

    Args:
        view: how rows are masked/corrupted; ``None`` masks 30% of fields at random.
        full_softmax_max: largest cardinality that gets a full softmax classifier.
        num_candidates: in-batch rows used as negatives for large fields (``C``).
        hidden: width of the query decoder's hidden layer.
        temperature: temperature of the cosine scores of large fields (> 0).

    Example:
        >>> from ssl_rec.models import Backbone
        >>> from ssl_rec.schema import CategoricalField, FeatureSchema
        >>> fields = [CategoricalField("user", 10), CategoricalField("item", 20)]
        >>> backbone = Backbone(FeatureSchema(["price"], fields, "label"), embedding_dim=8)
        >>> batch = Batch(torch.rand(4, 1), torch.randint(1, 10, (4, 2)), None)
        >>> objective = MaskedFeaturePrediction(View(RandomFieldMask(0.3)))
        >>> objective.setup(backbone)
        >>> objective(batch, backbone).loss.shape  # a scalar to minimise
        torch.Size([])

    """

    def __init__(
        self,
        view: View | None = None,
        full_softmax_max: int = 1024,
        num_candidates: int = 256,
        hidden: int = 128,
        temperature: float = 0.1,
    ) -> None:
        super().__init__()
        for key, value in (("num_candidates", num_candidates), ("hidden", hidden)):
            check_at_least("MaskedFeaturePrediction", key, value)
        if full_softmax_max < 0:
            raise ValueError(
                f"MaskedFeaturePrediction.full_softmax_max must be >= 0, got {full_softmax_max}"
            )
        self.temperature = check_positive("MaskedFeaturePrediction", "temperature", temperature)
        self.view = view if view is not None else View(RandomFieldMask(0.3))
        self.full_softmax_max = int(full_softmax_max)
        self.num_candidates = int(num_candidates)
        self.hidden = int(hidden)

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the query decoder and the full-softmax classifiers of small fields."""
        dims = backbone.dims
        cards, dim = dims.cardinalities, dims.embedding_dim
        self.query = MLP(dims.output_dim, [self.hidden, dims.n_fields * dim])
        small = [f for f, c in enumerate(cards) if c <= self.full_softmax_max]
        self.small_fields = small
        self.classifiers = nn.ModuleList(nn.Linear(dim, cards[f]) for f in small)
        large = torch.tensor([c > self.full_softmax_max for c in cards])
        self.register_buffer("large_field", large, persistent=False)

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Cross-entropy of the masked fields' true ids (mean over masked positions)."""
        out = self.view(batch, backbone)
        b, n_fields = batch.sparse.shape
        # Layer-normed input and cosine scores make the loss blind to the scale of the
        # pooled vector and of the embeddings: otherwise both grow during pretraining and
        # the inflated activations stall fine-tuning (row-wise Adagrad state explodes).
        pooled = F.layer_norm(out.rep.pooled, out.rep.pooled.shape[-1:])
        query = rearrange(self.query(pooled), "b (f d) -> b f d", f=n_fields)
        total, correct = query.sum() * 0.0, query.new_zeros(())
        for classifier, f in zip(self.classifiers, self.small_fields, strict=True):
            rows = out.field_mask[:, f].nonzero().squeeze(1)
            if rows.numel():
                logits = classifier(query[rows, f])
                target = batch.sparse[rows, f]
                total = total + F.cross_entropy(logits, target, reduction="sum")
                correct = correct + (logits.argmax(1) == target).sum()
        rows, fields = (out.field_mask & self.large_field).nonzero(as_tuple=True)
        if rows.numel():
            # Second lookup of the unmasked ids: targets and negatives share the tables, so
            # this loss also trains the embeddings (gradients reach them through the lookup).
            emb = F.normalize(backbone.embed(batch.sparse), dim=-1)
            cand = min(self.num_candidates, b)
            logits = candidate_logits(
                F.normalize(query[rows, fields], dim=-1) / self.temperature,
                fields,
                emb[rows, fields],
                batch.sparse[rows, fields],
                emb[:cand],
                batch.sparse[:cand],
            )
            target = torch.zeros_like(rows)
            total = total + F.cross_entropy(logits, target, reduction="sum")
            correct = correct + (logits.argmax(1) == 0).sum()
        n_masked = out.field_mask.sum().clamp_min(1)
        loss = total / n_masked
        return ObjectiveOutput(loss, {"loss": loss.detach(), "accuracy": correct / n_masked})
