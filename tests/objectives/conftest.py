from __future__ import annotations

import pytest
import torch

from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

CARDINALITIES = (5, 12, 40, 300, 3000)


def tiny_schema() -> FeatureSchema:
    fields = [CategoricalField(f"C{i + 1}", c) for i, c in enumerate(CARDINALITIES)]
    return FeatureSchema(("I1", "I2", "I3"), tuple(fields), None)


def tiny_backbone(seed: int = 0) -> Backbone:
    def encoder(f: int, n: int, d: int) -> DLRMEncoder:
        return DLRMEncoder(f, n, d, bottom=(8,), top=(32, 16))

    return Backbone(tiny_schema(), embedding_dim=8, encoder=encoder, seed=seed)


def tiny_batch(n: int = 64, seed: int = 0) -> Batch:
    """Rows with structure: every field is a noisy function of a latent cluster."""
    g = torch.Generator().manual_seed(seed)
    cluster = torch.randint(0, 4, (n,), generator=g)
    cols = []
    for c in CARDINALITIES:
        ids = 1 + (cluster * 7 + torch.randint(0, 2, (n,), generator=g)) % (c - 1)
        cols.append(ids)
    dense = cluster.float().unsqueeze(1).repeat(1, 3) * 0.5 + 0.1 * torch.randn(n, 3, generator=g)
    return Batch(dense, torch.stack(cols, 1))


@pytest.fixture
def backbone() -> Backbone:
    return tiny_backbone()


@pytest.fixture
def batch() -> Batch:
    return tiny_batch()


@pytest.fixture
def make_backbone():  # noqa: ANN201 - the factory
    """:func:`tiny_backbone`, for tests that build several backbones."""
    return tiny_backbone


@pytest.fixture
def make_batch():  # noqa: ANN201 - the factory
    """:func:`tiny_batch`, for tests that need a batch of another size."""
    return tiny_batch
