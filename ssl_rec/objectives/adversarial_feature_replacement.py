"""GAN-style feature replacement: the generator is trained to fool the discriminator."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ssl_rec._checks import check_at_least, check_nonnegative, check_positive
from ssl_rec.objectives._candidates import gumbel_argmax, gumbel_noise
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


class AdversarialFeatureReplacement(Objective):
    """Replaced feature detection whose generator is trained adversarially.

    Goodfellow et al., "Generative Adversarial Nets", NeurIPS 2014,
    https://arxiv.org/abs/1406.2661; discrete samples are made differentiable with the
    straight-through Gumbel-softmax (Jang et al., ICLR 2017, https://arxiv.org/abs/1611.01144):
    the chosen candidate's embedding enters the discriminator exactly, gradients reach the
    generator's logits. ELECTRA (Clark et al. 2020, Section 3.2) found adversarial
    generators hard to train; the stability measures here are an entropy bonus (keeps
    proposals diverse), a masked-LM term (keeps them plausible), a generator step only
    every ``generator_interval`` batches, and gradient clipping in ``PretrainModule``.

    The generator always replaces (it may not propose the true id), so the discriminator
    sees a fixed rate of replaced fields.

    Args:
        view: which fields are replaced; ``None`` masks 30% at random.
        generator_interval: discriminator steps per generator step (>= 1).
        entropy_weight: weight of the generator's entropy bonus (>= 0).
        mlm_weight: weight of the generator's masked-LM term (>= 0).
        tau: Gumbel-softmax temperature (> 0).
        generator_hidden: hidden width of the generator MLP.

    """

    def __init__(
        self,
        view: View | None = None,
        generator_interval: int = 1,
        entropy_weight: float = 0.01,
        mlm_weight: float = 0.5,
        tau: float = 1.0,
        generator_hidden: int = 64,
    ) -> None:
        super().__init__()
        name = "AdversarialFeatureReplacement"
        self.entropy_weight = check_nonnegative(name, "entropy_weight", entropy_weight)
        self.mlm_weight = check_nonnegative(name, "mlm_weight", mlm_weight)
        self.tau = check_positive(name, "tau", tau)
        self.generator_interval = check_at_least(name, "generator_interval", generator_interval)
        self.generator_hidden = check_at_least(name, "generator_hidden", generator_hidden)
        self.view = view if view is not None else View(RandomFieldMask(0.3))

    def setup(self, backbone: BackboneProtocol) -> None:
        """Build the generator and the per-field discriminator head."""
        self.generator, self.discriminator = replacement_heads(
            backbone.dims, self.generator_hidden, num_candidates=256
        )

    def generator_parameters(self) -> list[nn.Parameter]:
        """Return the generator MLP's parameters (stepped by their own optimizer)."""
        return list(self.generator.parameters())

    def _propose(
        self, batch: Batch, backbone: BackboneProtocol
    ) -> tuple[Batch, Proposal, torch.Generator]:
        """The view's batch, the generator's proposal and the stream its noise is drawn from.

        Column 0 (the true id) is never sampled, so every masked field is replaced.
        """
        batch, proposal = propose(self.view, self.generator, batch, backbone)
        return batch, proposal, self.view.rng(batch.sparse.device)

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Discriminator (backbone + detection head) loss on generator samples."""
        with torch.no_grad():
            batch, proposal, gen = self._propose(batch, backbone)
            choice = gumbel_argmax(proposal.logits, gen, exclude_first=True)
        corrupted = replace_ids(batch.sparse, proposal, choice)
        rep = backbone(batch.with_features(sparse=corrupted))
        loss, logs = detection_loss(
            self.discriminator(rep.pooled, rep.field_emb), corrupted != batch.sparse
        )
        logs["loss"] = loss.detach()
        return ObjectiveOutput(loss, logs)

    def generator_loss(self, batch: Batch, backbone: BackboneProtocol) -> ObjectiveOutput:
        """Make the discriminator call the replacements original (straight-through Gumbel)."""
        batch, proposal, gen = self._propose(batch, backbone)
        noisy = proposal.logits + gumbel_noise(proposal.logits.shape, gen, batch.sparse.device)
        noisy[:, 0] = float("-inf")
        soft = (noisy / self.tau).softmax(1)
        hard = torch.zeros_like(soft).scatter_(1, soft.max(1).indices[:, None], 1.0)
        choice = hard - soft.detach() + soft
        new_emb = proposal.mix(choice)
        with torch.no_grad():
            field_emb = backbone.embed(batch.sparse)
        field_emb = field_emb.index_put((proposal.rows, proposal.fields), new_emb)
        pooled, _ = backbone.encode(field_emb, batch.dense)
        logits = self.discriminator(pooled, field_emb)[proposal.rows, proposal.fields]
        fool = F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits))
        entropy, mlm = proposal.entropy_and_mlm_loss()
        loss = fool - self.entropy_weight * entropy + self.mlm_weight * mlm
        logs = {"fool": fool.detach(), "entropy": entropy.detach(), "generator_mlm": mlm.detach()}
        return ObjectiveOutput(loss, logs)
