"""Masked feature prediction: hide fields, predict their ids from the rest of the row."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ssl_rec._checks import check_at_least, check_positive
from ssl_rec.models.mlp import MLP
from ssl_rec.objectives._candidates import candidate_logits
from ssl_rec.objectives._inplace_softmax import consumed_cross_entropy
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
    in-batch rows, scored with the (shared, trained) embedding tables. A backbone that embeds
    its dense columns as tokens (``dense_encoding: quantile_tokens | periodic_tokens``) has
    them masked by the view too; their target is the column's quantile bin of the training
    split (``backbone.dense_bins``), predicted with a full softmax per column.

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
        self.query = MLP(dims.output_dim, [self.hidden, dims.n_tokens * dim])
        small = [f for f, c in enumerate(cards) if c <= self.full_softmax_max]
        self.small_fields = small
        self.register_buffer("small_field_index", torch.tensor(small, dtype=torch.long),
                             persistent=False)  # fmt: skip
        self.classifiers = nn.ModuleList(nn.Linear(dim, cards[f]) for f in small)
        large = torch.tensor([c > self.full_softmax_max for c in cards])
        self.register_buffer("large_field", large, persistent=False)
        self.bin_classifier: nn.Parameter | None = None
        if dims.n_numeric_tokens:
            scale = dim**-0.5
            shape = (dims.n_numeric_tokens, dim, dims.numeric_bins)
            self.bin_classifier = nn.Parameter(torch.randn(shape) * scale)
            self.bin_bias = nn.Parameter(torch.zeros(dims.n_numeric_tokens, dims.numeric_bins))

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Cross-entropy of the masked fields' true ids (mean over masked positions)."""
        out = self.view(batch, backbone)
        b, n_fields = batch.sparse.shape
        # Layer-normed input and cosine scores make the loss blind to the scale of the
        # pooled vector and of the embeddings: otherwise both grow during pretraining and
        # the inflated activations stall fine-tuning (row-wise Adagrad state explodes).
        pooled = F.layer_norm(out.rep.pooled, out.rep.pooled.shape[-1:])
        query = rearrange(self.query(pooled), "b (t d) -> b t d", d=backbone.dims.embedding_dim)
        total, correct = query.sum() * 0.0, query.new_zeros(())
        if self.small_fields:
            # One gather of every masked small-field query (field-major, rows ascending: the
            # positions and order of a per-field loop), so backward scatters into [B, T, D]
            # once rather than once per field.
            small = out.field_mask[:, self.small_fields]
            slot, rows = small.t().nonzero(as_tuple=True)
            fields = self.small_field_index[slot]
            counts = torch.bincount(slot, minlength=len(self.small_fields)).tolist()
            queries, targets = query[rows, fields], batch.sparse[rows, fields]
            blocks = zip(self.classifiers, queries.split(counts), targets.split(counts),
                         strict=True)  # fmt: skip
            for classifier, q, target in blocks:
                if target.numel():
                    logits = classifier(q)
                    total = total + F.cross_entropy(logits, target, reduction="sum")
                    correct = correct + (logits.argmax(1) == target).sum()
        rows, fields = (out.field_mask & self.large_field).nonzero(as_tuple=True)
        if rows.numel():
            # Second lookup of the unmasked ids: targets and negatives share the tables, so
            # this loss also trains the embeddings (gradients reach them through the lookup).
            # Normalized per vector, only the rows the logits read.
            emb = backbone.embed(batch.sparse)
            cand = min(self.num_candidates, b)
            logits = candidate_logits(
                F.normalize(query[rows, fields], dim=-1) / self.temperature,
                fields,
                F.normalize(emb[rows, fields], dim=-1),
                batch.sparse[rows, fields],
                F.normalize(emb[:cand], dim=-1),
                batch.sparse[:cand],
            )
            correct = correct + (logits.max(1).indices == 0).sum()
            target = torch.zeros_like(rows)
            total = total + consumed_cross_entropy(logits, target, reduction="sum")
        n_masked = out.field_mask.sum()
        logs: dict[str, torch.Tensor | float] = {}
        if self.bin_classifier is not None and out.numeric_mask is not None:
            numeric_total, numeric_correct, n_numeric = self._numeric_loss(
                batch, backbone, query[:, n_fields:], out.numeric_mask
            )
            total, correct = total + numeric_total, correct + numeric_correct
            n_masked = n_masked + n_numeric
            logs["numeric_accuracy"] = numeric_correct / n_numeric.clamp_min(1)
        n_masked = n_masked.clamp_min(1)
        loss = total / n_masked
        return ObjectiveOutput(
            loss, {"loss": loss.detach(), "accuracy": correct / n_masked, **logs}
        )

    def _numeric_loss(
        self,
        batch: Batch,
        backbone: BackboneProtocol,
        query: torch.Tensor,
        numeric_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Summed CE and hits of the masked numeric tokens' bins, and how many were masked."""
        rows, cols = numeric_mask.nonzero(as_tuple=True)
        n = rows.new_tensor(rows.numel())
        if not rows.numel():
            return query.sum() * 0.0, query.new_zeros(()), n
        logits = torch.einsum("md,mdk->mk", query[rows, cols], self.bin_classifier[cols])
        logits = logits + self.bin_bias[cols]
        target = backbone.dense_bins(batch.dense)[rows, cols]
        total = F.cross_entropy(logits, target, reduction="sum")
        return total, (logits.argmax(1) == target).sum().to(query.dtype), n
