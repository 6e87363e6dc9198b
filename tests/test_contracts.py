"""Contracts every objective and every encoder must honour."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import ssl_rec.models as models_module
import ssl_rec.objectives as objectives_module
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.objectives import Objective
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch, EncoderProtocol
from ssl_rec.views import View

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVES = [
    obj
    for name in objectives_module.__all__
    if inspect.isclass(obj := getattr(objectives_module, name))
    and issubclass(obj, Objective)
    and obj is not Objective
]
# One invalid hyperparameter per objective; a new objective must add its own.
BAD_HYPERPARAMETERS = {
    "MaskedFeaturePrediction": {"num_candidates": 0},
    "MaskedDenseReconstruction": {"mask_rate": 1.5},
    "InfoNCE": {"temperature": 0.0},
    "ComplementaryInfoNCE": {"temperature": 0.0},
    "MomentumContrast": {"temperature": -0.1},
    "ReplacedFeatureDetection": {"sample_temperature": 0.0},
    "AdversarialFeatureReplacement": {"tau": 0.0},
    "FeatureAlignment": {"max_rows": 0},
    "FieldUniformity": {"max_rows": 0},
}
CARDS = (4, 9, 30, 200, 2000)


def tiny_backbone() -> Backbone:
    fields = tuple(CategoricalField(f"C{i + 1}", c) for i, c in enumerate(CARDS))
    schema = FeatureSchema(("I1", "I2"), fields, None)

    def encoder(f: int, n: int, d: int) -> DLRMEncoder:
        return DLRMEncoder(f, n, d, bottom=(8,), top=(32,))

    return Backbone(schema, embedding_dim=8, encoder=encoder)


def structured_batch(n: int = 96) -> Batch:
    g = torch.Generator().manual_seed(0)
    cluster = torch.randint(0, 6, (n,), generator=g)
    sparse = torch.stack([1 + (cluster * 5 + torch.randint(0, 2, (n,), generator=g)) % (c - 1)
                          for c in CARDS], 1)  # fmt: skip
    dense = torch.stack([cluster.float() / 3, (cluster % 2).float()], 1)
    return Batch(dense + 0.05 * torch.randn(n, 2, generator=g), sparse)


def restore_buffers(objective: Objective, buffers: dict) -> None:
    """Put back the objective's initial buffers (e.g. MoCo's queue of negatives).

    On a fixed batch the queue would fill with keys of the very same rows, so each step
    restores it: the fixed batch is contrasted against fixed negatives.
    """
    for name, buf in objective.named_buffers():
        if name in buffers and buffers[name].shape == buf.shape:
            buf.copy_(buffers[name])


def measured_loss(objective: Objective, backbone: Backbone, batch: Batch, buffers: dict) -> float:
    """Loss with the views' random streams and the objective's buffers reset."""
    for module in objective.modules():
        if isinstance(module, View):
            module.reseed()
    restore_buffers(objective, buffers)
    with torch.no_grad():
        return float(objective(batch, backbone).loss)


@pytest.mark.parametrize("cls", OBJECTIVES, ids=lambda c: c.__name__)
def test_objective_contract(cls: type[Objective]) -> None:
    torch.manual_seed(0)
    backbone, batch = tiny_backbone(), structured_batch()
    objective = cls()
    objective.setup(backbone)
    buffers = {n: b.clone() for n, b in objective.named_buffers()}
    out = objective(batch, backbone)
    assert torch.isfinite(out.loss) and out.loss.dim() == 0
    assert all(isinstance(k, str) and "/" not in k for k in out.logs)
    before = measured_loss(objective, backbone, batch, buffers)
    generator = {id(p) for p in objective.generator_parameters()}
    params = [p for p in [*backbone.parameters(), *objective.parameters()]
              if p.requires_grad and id(p) not in generator]  # fmt: skip
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(25):
        restore_buffers(objective, buffers)
        loss = objective(batch, backbone).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = measured_loss(objective, backbone, batch, buffers)
    assert after < before, (
        f"{cls.__name__}: loss did not fall on a fixed batch ({before} -> {after})"
    )


@pytest.mark.parametrize("cls", OBJECTIVES, ids=lambda c: c.__name__)
def test_objective_rejects_bad_hyperparameters(cls: type[Objective]) -> None:
    assert cls.__name__ in BAD_HYPERPARAMETERS, f"add a bad hyperparameter for {cls.__name__}"
    ((key, value),) = BAD_HYPERPARAMETERS[cls.__name__].items()
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{key}.*{value}"):
        cls(**{key: value})


ENCODERS = [
    obj
    for name in models_module.__all__
    if inspect.isclass(obj := getattr(models_module, name)) and name.endswith("Encoder")
]
# One invalid hyperparameter per encoder; a new encoder must add its own.
BAD_ENCODER_HYPERPARAMETERS = {
    "DLRMEncoder": {"top": ()},
    "DCNv2Encoder": {"cross_layers": 0},
    "DeepFMEncoder": {"deep": ()},
    "TowerEncoder": {"output_dim": 0},
}


@pytest.mark.parametrize("cls", ENCODERS, ids=lambda c: c.__name__)
def test_encoder_contract(cls: type) -> None:
    torch.manual_seed(0)
    n_fields, n_dense, dim = len(CARDS), 2, 8
    encoder = cls(n_fields, n_dense, dim)
    assert isinstance(encoder, EncoderProtocol)
    batch = structured_batch()
    field_emb = torch.randn(batch.batch_size, n_fields, dim, requires_grad=True)
    pooled, dense_emb = encoder(field_emb, batch.dense)
    assert pooled.shape == (batch.batch_size, encoder.output_dim)
    assert dense_emb is None or dense_emb.shape == (batch.batch_size, dim)
    pooled.square().sum().backward()
    assert field_emb.grad is not None and field_emb.grad.abs().sum() > 0
    # Through a Backbone and a click head, the BCE on a learnable fixed batch must fall.
    backbone = Backbone(tiny_backbone().schema, embedding_dim=dim,
                        encoder=lambda f, n, d: cls(f, n, d))  # fmt: skip
    head = torch.nn.Linear(backbone.dims.output_dim, 1)
    labels = (batch.sparse[:, 0] % 2).float()
    opt = torch.optim.Adam([*backbone.parameters(), *head.parameters()], lr=3e-3)

    def loss() -> torch.Tensor:
        logits = head(backbone(batch).pooled).squeeze(-1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)

    before = float(loss())
    for _ in range(25):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert float(loss()) < before


@pytest.mark.parametrize("cls", ENCODERS, ids=lambda c: c.__name__)
def test_encoder_rejects_bad_hyperparameters(cls: type) -> None:
    assert cls.__name__ in BAD_ENCODER_HYPERPARAMETERS, f"add a bad value for {cls.__name__}"
    ((key, value),) = BAD_ENCODER_HYPERPARAMETERS[cls.__name__].items()
    with pytest.raises(ValueError, match=key):
        cls(len(CARDS), 2, 8, **{key: value})
