"""A tiny stand-in backbone with quantized tables, so export tests need no training stack."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import BackboneDims, Batch, Representation


class FakeEmbedding(nn.Module):
    """INT8 row-wise storage whose ``rows`` dequantizes, like the real embedding collection."""

    def __init__(self, schema: FeatureSchema, dim: int, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.field_names = schema.field_names
        self.codes, self.scale, self.bias = [], [], []
        for card in schema.cardinalities:
            w = torch.randn(card, dim, generator=g)
            lo, hi = w.min(1, keepdim=True).values, w.max(1, keepdim=True).values
            scale = (hi - lo) / 255
            self.codes.append(torch.round((w - lo) / scale).to(torch.uint8))
            self.scale.append(scale)
            self.bias.append(lo)

    def rows(self, field: str, ids: torch.Tensor) -> torch.Tensor:
        f = self.field_names.index(field)
        return self.codes[f][ids].float() * self.scale[f][ids] + self.bias[f][ids]

    def forward(self, sparse: torch.Tensor, field_mask: torch.Tensor | None = None) -> torch.Tensor:
        emb = torch.stack([self.rows(n, sparse[:, i]) for i, n in enumerate(self.field_names)], 1)
        if field_mask is not None:
            emb = emb.masked_fill(field_mask.unsqueeze(-1), 0.0)
        return emb


class FakeBackbone(nn.Module):
    """Implements ``BackboneProtocol`` with a mean-pooling "encoder"."""

    def __init__(self, schema: FeatureSchema, dim: int = 8) -> None:
        super().__init__()
        self.schema = schema
        self.embedding = FakeEmbedding(schema, dim)
        self.vocabulary = None
        self.dims = BackboneDims(schema.n_fields, schema.n_dense, dim, dim,
                                 tuple(schema.cardinalities))  # fmt: skip

    def embed(self, sparse: torch.Tensor, field_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.embedding(sparse, field_mask)

    def encode(self, field_emb: torch.Tensor, dense: torch.Tensor) -> tuple[torch.Tensor, None]:
        return field_emb.mean(1) + dense.mean(1, keepdim=True), None

    def entity_vectors(self, field: str, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding.rows(field, ids)

    def embed_dense(self, dense: torch.Tensor, numeric_mask: torch.Tensor | None = None):
        return dense.new_zeros(dense.shape[0], 0, self.dims.embedding_dim)

    def dense_bins(self, dense: torch.Tensor) -> torch.Tensor:
        return torch.zeros(dense.shape[0], 0, dtype=torch.long)

    def standardize_dense(self, dense: torch.Tensor) -> torch.Tensor:
        return dense

    def unstandardize_dense(self, standardized: torch.Tensor) -> torch.Tensor:
        return standardized

    def clone_encoder(self) -> nn.Module:
        return nn.Identity()

    def update_encoder_copy(self, target: nn.Module, momentum: float) -> None:
        pass

    def forward(self, batch: Batch, field_mask: torch.Tensor | None = None) -> Representation:
        field_emb = self.embed(batch.sparse, field_mask)
        return Representation(field_emb, self.encode(field_emb, batch.dense)[0])


@pytest.fixture
def schema() -> FeatureSchema:
    return FeatureSchema(("I1",), (CategoricalField("C1", 50), CategoricalField("C2", 7)), "label")


@pytest.fixture
def backbone(schema: FeatureSchema) -> FakeBackbone:
    return FakeBackbone(schema)


def make_batches(schema: FeatureSchema, n: int, batch_size: int = 64, seed: int = 0) -> list[Batch]:
    rng = np.random.default_rng(seed)
    sparse = np.stack([rng.integers(0, c, n) for c in schema.cardinalities], 1)
    dense = rng.random((n, schema.n_dense)).astype(np.float32)
    label = (rng.random(n) < 0.3).astype(np.float32)
    return [
        Batch(
            torch.from_numpy(dense[i : i + batch_size]),
            torch.from_numpy(sparse[i : i + batch_size]),
            torch.from_numpy(label[i : i + batch_size]),
            torch.arange(i, min(i + batch_size, n)),
        )
        for i in range(0, n, batch_size)
    ]


@pytest.fixture
def batches_of():
    """``make_batches`` for tests (an installed package named ``tests`` shadows this folder)."""
    return make_batches
