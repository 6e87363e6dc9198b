"""A small DLRM CTR model whose labels follow its own FP32 predictions, so NE is meaningful."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ssl_rec.models import Backbone, CTRHead, DLRMEncoder
from ssl_rec.quantize import Architecture, FloatCTR, ModelBuilder, Rows
from ssl_rec.schema import CategoricalField, FeatureSchema

CARDS = [3, 40, 300, 500]


def _encoder(n_fields: int, n_dense: int, dim: int) -> DLRMEncoder:
    return DLRMEncoder(n_fields, n_dense, dim, bottom=[16], top=[32, 16])


@pytest.fixture(scope="module")
def source() -> FloatCTR:
    torch.manual_seed(0)
    schema = FeatureSchema(
        ["I1", "I2"], [CategoricalField(f"C{i}", c) for i, c in enumerate(CARDS)], "label"
    )
    backbone = Backbone(schema, embedding_dim=8, encoder=_encoder, seed=0)
    with torch.no_grad():  # larger rows than the N(0, 0.05) init, so quantization shows
        for f, card in enumerate(CARDS):
            backbone.embedding.tables.load_float(f, torch.randn(card, 8))
    head = CTRHead(backbone.dims.output_dim, [])
    encoder = {"class_path": "ssl_rec.models.DLRMEncoder",
               "init_args": {"bottom": [16], "top": [32, 16]}}  # fmt: skip
    return FloatCTR.from_backbone(backbone, head, Architecture(8, encoder, []))


def make_rows(source: FloatCTR, n: int, seed: int) -> Rows:
    """Rows whose labels are drawn from the FP32 model's own probabilities."""
    gen = torch.Generator().manual_seed(seed)
    dense = torch.rand(n, 2, generator=gen) * 3
    sparse = torch.stack([torch.randint(0, c, (n,), generator=gen) for c in CARDS], 1)
    fp32 = ModelBuilder(source).build(source.fp32_plan())
    with torch.no_grad():
        prob = torch.sigmoid(fp32(dense, sparse))
    return Rows(dense, sparse, torch.bernoulli(prob, generator=gen))


@pytest.fixture(scope="module")
def fresh_rows() -> Callable[[FloatCTR, int, int], Rows]:
    """A factory of new labelled rows, for tests that need a second, unseen slice."""
    return make_rows


@pytest.fixture(scope="module")
def rows(source: FloatCTR) -> Rows:
    return make_rows(source, 4096, seed=1)
