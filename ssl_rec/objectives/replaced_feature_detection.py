"""ELECTRA-style replaced feature detection with a jointly trained small generator."""

from __future__ import annotations

import torch

from ssl_rec._checks import check_at_least, check_nonnegative, check_positive
from ssl_rec.objectives._candidates import gumbel_argmax
from ssl_rec.objectives._replacement import (
    Proposal,
    detection_loss,
    propose,
    replace_ids,
    replacement_heads,
)
from ssl_rec.objectives.base import Objective
from ssl_rec.types import BackboneProtocol, Batch, ObjectiveOutput
from ssl_rec.views import RandomFieldMask, View


class ReplacedFeatureDetection(Objective):
    """Detect which fields a small generator replaced (ELECTRA for tabular rows).

    A small generator fills masked fields with sampled ids; the backbone, as the
    discriminator, predicts for every field whether its id was replaced.

    Clark et al., "ELECTRA: Pre-training Text Encoders as Discriminators Rather Than
    Generators", ICLR 2020, https://arxiv.org/abs/2003.10555 (Section 2: joint loss
    ``L_MLM + lambda L_Disc``, samples are not back-propagated through). The generator
    reads the shared embeddings without gradient and samples from in-batch candidate ids,
    so replacements follow each field's marginal distribution and get harder as the
    generator learns the co-occurrence structure. Positions where the generator samples
    the true id count as original, as in ELECTRA.

    Args:
        view: which fields the generator re-fills; ``None`` masks 30% at random.
        generator_weight: weight of the generator's masked-LM loss (>= 0).
        generator_hidden: hidden width of the generator MLP.
        num_candidates: in-batch rows whose ids the generator may propose.
        sample_temperature: temperature of the generator's sampling (> 0).

    """

    def __init__(
        self,
        view: View | None = None,
        generator_weight: float = 1.0,
        generator_hidden: int = 64,
        num_candidates: int = 256,
        sample_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        name = "ReplacedFeatureDetection"
        self.generator_weight = check_nonnegative(name, "generator_weight", generator_weight)
        self.sample_temperature = check_positive(name, "sample_temperature", sample_temperature)
        self.generator_hidden = check_at_least(name, "generator_hidden", generator_hidden)
        self.num_candidates = check_at_least(name, "num_candidates", num_candidates)
        self.view = view if view is not None else View(RandomFieldMask(0.3))

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the generator and the per-field discriminator head."""
        self.generator, self.discriminator = replacement_heads(
            backbone.dims, self.generator_hidden, self.num_candidates
        )

    def propose(self, batch: Batch, backbone: BackboneProtocol) -> tuple[Batch, Proposal]:
        """Corrupt/mask ``batch`` with the view and score replacement candidates."""
        return propose(self.view, self.generator, batch, backbone)

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Discriminator BCE (balanced) plus ``generator_weight`` times the generator's MLM."""
        batch, proposal = self.propose(batch, backbone)
        with torch.no_grad():
            gen = self.view.rng(batch.sparse.device)
            choice = gumbel_argmax(proposal.logits, gen, self.sample_temperature)
        corrupted = replace_ids(batch.sparse, proposal, choice)
        rep = backbone(batch.with_features(sparse=corrupted))
        d_loss, logs = detection_loss(
            self.discriminator(rep.pooled, rep.field_emb), corrupted != batch.sparse
        )
        g_loss = proposal.mlm_loss(consume=True)  # the logits' last reader
        loss = d_loss + self.generator_weight * g_loss
        logs.update(
            loss=loss.detach(), detection_loss=d_loss.detach(), generator_mlm=g_loss.detach()
        )
        return ObjectiveOutput(loss, logs)
