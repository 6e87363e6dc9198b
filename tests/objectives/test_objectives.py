from __future__ import annotations

import pytest
import torch

from ssl_rec.metrics import alignment, uniformity
from ssl_rec.models import Backbone
from ssl_rec.objectives import (
    AdversarialFeatureReplacement,
    InfoNCE,
    MaskedDenseReconstruction,
    MaskedFeaturePrediction,
    MomentumContrast,
    ReplacedFeatureDetection,
    nt_xent,
)
from ssl_rec.objectives._candidates import candidate_logits
from ssl_rec.schema import FeatureSchema
from ssl_rec.views import RandomFieldMask, View


def reference_nt_xent(z1: torch.Tensor, z2: torch.Tensor, t: float) -> torch.Tensor:
    """Loop version of SimCLR's loss, Eq. 1, averaged over the 2B anchors."""
    z = torch.nn.functional.normalize(torch.cat([z1, z2]), dim=1)
    n, losses = z1.shape[0], []
    for i in range(2 * n):
        j = (i + n) % (2 * n)
        sims = [torch.exp(z[i] @ z[k] / t) for k in range(2 * n) if k != i]
        losses.append(-torch.log(torch.exp(z[i] @ z[j] / t) / sum(sims)))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("t", [0.1, 0.5, 1.0])
def test_nt_xent_matches_reference(t: float) -> None:
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    torch.testing.assert_close(nt_xent(z1, z2, t), reference_nt_xent(z1, z2, t))


def test_alignment_and_uniformity_analytic() -> None:
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert alignment(z, z).item() == pytest.approx(0.0)
    assert alignment(z, -z).item() == pytest.approx(4.0)
    # Two orthogonal unit vectors: squared distance 2, so log(exp(-2 * 2)) = -4.
    assert uniformity(z).item() == pytest.approx(-4.0)


def test_candidate_logits_puts_truth_first_and_masks_duplicates() -> None:
    emb = torch.eye(3).unsqueeze(1).repeat(1, 2, 1)  # [C=3, F=2, D=3]
    cand_ids = torch.tensor([[5, 1], [6, 2], [5, 3]])
    logits = candidate_logits(
        emb[0, 0:1], torch.tensor([0]), emb[0, 0:1], torch.tensor([5]), emb, cand_ids
    )
    assert logits.shape == (1, 4)
    assert logits[0, 0] == 1.0 and torch.isinf(logits[0, 1]) and torch.isinf(logits[0, 3])
    assert logits[0, 2] == 0.0


def test_masked_feature_prediction_uses_both_softmax_paths(backbone, batch) -> None:
    objective = MaskedFeaturePrediction(View(RandomFieldMask(1.0)), full_softmax_max=40)
    objective.setup(backbone)
    assert objective.small_fields == [0, 1, 2]
    assert objective.large_field.tolist() == [False, False, False, True, True]
    out = objective(batch, backbone)
    assert torch.isfinite(out.loss) and 0.0 <= float(out.logs["accuracy"]) <= 1.0


def test_masked_feature_prediction_no_mask_gives_zero_loss(backbone, batch) -> None:
    objective = MaskedFeaturePrediction(View(RandomFieldMask(0.0)))
    objective.setup(backbone)
    out = objective(batch, backbone)
    assert out.loss.item() == 0.0 and out.loss.requires_grad


def test_dense_reconstruction_needs_dense_columns(backbone) -> None:
    objective = MaskedDenseReconstruction()
    no_dense = Backbone(FeatureSchema((), backbone.schema.categorical, None), embedding_dim=8)
    with pytest.raises(ValueError, match="dense columns"):
        objective.setup(no_dense)


def test_momentum_contrast_queue_and_key_encoder(backbone, batch) -> None:
    objective = MomentumContrast(queue_size=100, momentum=0.5)
    objective.setup(backbone)
    key_before = [p.clone() for p in objective.key_encoder.parameters()]
    objective(batch, backbone)
    assert int(objective.queue_ptr) == 64
    objective(batch, backbone)
    assert int(objective.queue_ptr) == 28  # wrapped around
    assert all(not p.requires_grad for p in objective.key_encoder.parameters())
    # online == key at start, so the EMA leaves the key encoder unchanged until training
    key_after = list(objective.key_encoder.parameters())
    assert all(torch.equal(a, b) for a, b in zip(key_before, key_after, strict=True))
    objective.eval()
    objective(batch, backbone)
    assert int(objective.queue_ptr) == 28  # no enqueue in eval


def test_replaced_feature_detection_replaces_masked_fields_only(backbone, batch) -> None:
    objective = ReplacedFeatureDetection(View(RandomFieldMask(0.5), seed=0))
    objective.setup(backbone)
    out = objective(batch, backbone)
    assert 0.1 < float(out.logs["replaced_fraction"]) < 0.6
    assert torch.isfinite(out.loss)
    nothing_masked = ReplacedFeatureDetection(View(RandomFieldMask(0.0)))
    nothing_masked.setup(backbone)
    assert float(nothing_masked(batch, backbone).logs["replaced_fraction"]) == 0.0


def test_adversarial_generator_loss_trains_the_generator_not_the_tables(backbone, batch) -> None:
    objective = AdversarialFeatureReplacement(View(RandomFieldMask(0.5), seed=0))
    objective.setup(backbone)
    tables = {k: v.clone() for k, v in backbone.state_dict().items() if k.endswith("store")}
    out = objective.generator_loss(batch, backbone)
    out.loss.backward()
    # Gradients reach every generator parameter (straight-through Gumbel) ...
    assert all(p.grad is not None and p.grad.abs().sum() > 0
               for p in objective.generator_parameters())  # fmt: skip
    # ... and the generator's loss never updates the embedding tables (fused optimizer).
    after = backbone.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in tables.items())
    fwd = objective(batch, backbone)
    assert float(fwd.logs["replaced_fraction"]) > 0.4  # always replaces the masked fields


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: InfoNCE(temperature=0.0), r"InfoNCE.temperature must be > 0, got 0.0"),
        (lambda: MomentumContrast(temperature=-1), r"MomentumContrast.temperature"),
        (lambda: MomentumContrast(momentum=1.5), r"MomentumContrast.momentum.*1.5"),
        (lambda: MaskedDenseReconstruction(mask_rate=1.2), r"mask_rate.*1.2"),
        (lambda: MaskedFeaturePrediction(num_candidates=0), r"num_candidates"),
        (lambda: ReplacedFeatureDetection(generator_weight=-1), r"generator_weight"),
        (lambda: AdversarialFeatureReplacement(tau=0), r"tau"),
        (lambda: AdversarialFeatureReplacement(generator_interval=0), r"generator_interval"),
        (lambda: MaskedFeaturePrediction(View(RandomFieldMask(-0.2))), r"rate.*-0.2"),
    ],
)
def test_bad_hyperparameters_raise(make, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


def test_view_with_embedding_dropout_encodes(backbone, batch) -> None:
    out = View(RandomFieldMask(0.3), embedding_dropout=0.5, seed=0)(batch, backbone)
    assert out.rep.pooled.shape == (batch.batch_size, backbone.dims.output_dim)
    assert out.field_mask.shape == batch.sparse.shape
