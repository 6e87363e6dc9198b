from __future__ import annotations

import pytest
import torch

from ssl_rec.types import Batch
from ssl_rec.views import (
    CorrelatedFieldMask,
    DenseNoise,
    FeatureSwap,
    IdDropout,
    RandomFieldMask,
    View,
    feature_swap,
    field_mutual_information,
    field_ranking,
    id_dropout,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def correlated_sparse(n: int = 4000) -> torch.Tensor:
    """Fields 0-1 copy one latent, 2-3 another, 4 is independent noise."""
    g = gen(1)
    a = torch.randint(1, 20, (n,), generator=g)
    b = torch.randint(1, 20, (n,), generator=g)
    noise = torch.randint(1, 20, (n,), generator=g)
    return torch.stack([a, a * 3 % 23, b, b * 5 % 29, noise], 1)


@pytest.mark.parametrize("rate", [0.0, 0.2, 0.5, 1.0])
def test_random_field_mask_rate_and_shape(rate: float) -> None:
    mask = RandomFieldMask(rate)(torch.zeros(2000, 10, dtype=torch.long), gen())
    assert mask.shape == (2000, 10) and mask.dtype == torch.bool
    assert abs(mask.float().mean().item() - rate) < 0.02


def test_views_are_deterministic_given_seed() -> None:
    sparse = torch.randint(1, 50, (64, 6), generator=gen())
    batch = Batch(torch.randn(64, 3, generator=gen()), sparse)

    def view() -> View:
        corruptions = [IdDropout(0.2), FeatureSwap(0.2), DenseNoise(0.1, 0.2)]
        return View(RandomFieldMask(0.4), corruptions, seed=3)

    (b1, m1), (b2, m2) = view().corrupt(batch), view().corrupt(batch)
    assert torch.equal(m1, m2) and torch.equal(b1.sparse, b2.sparse)
    assert torch.equal(b1.dense, b2.dense)
    b3, m3 = View(RandomFieldMask(0.4), seed=4).corrupt(batch)
    assert not torch.equal(m1, m3)


def test_id_dropout_only_writes_zero() -> None:
    sparse = torch.randint(1, 50, (1000, 8), generator=gen())
    out = id_dropout(sparse, 0.3, gen())
    changed = out != sparse
    assert (out[changed] == 0).all()
    assert abs(changed.float().mean().item() - 0.3) < 0.03


def test_feature_swap_keeps_column_values_from_batch() -> None:
    sparse = torch.arange(400).view(100, 4)  # each column holds its own value range
    out = feature_swap(sparse, 0.5, gen())
    for f in range(4):
        assert set(out[:, f].tolist()) <= set(sparse[:, f].tolist())
    assert 0.3 < (out != sparse).float().mean().item() < 0.55


def test_dense_noise_masks_and_perturbs() -> None:
    batch = Batch(torch.ones(500, 4), torch.zeros(500, 2, dtype=torch.long))
    out = DenseNoise(std=0.0, mask_rate=0.5)(batch, gen())
    assert set(out.dense.unique().tolist()) == {0.0, 1.0}
    noisy = DenseNoise(std=0.1)(batch, gen())
    assert abs(noisy.dense.std().item() - 0.1) < 0.02


def test_mutual_information_finds_correlated_fields() -> None:
    mi = field_mutual_information(correlated_sparse())
    assert torch.allclose(mi, mi.T)
    assert mi[0, 1] > 5 * mi[0, 4] and mi[2, 3] > 5 * mi[2, 4]
    ranking = field_ranking(correlated_sparse())
    assert ranking[0, :2].tolist() == [0, 1] and ranking[3, :2].tolist() == [3, 2]


def test_correlated_mask_masks_groups() -> None:
    masker = CorrelatedFieldMask(rate=0.4, fit_rows=1000)
    sparse = correlated_sparse()
    mask = masker(sparse, gen())
    assert (mask.sum(1) == 2).all()
    pairs = {tuple(torch.nonzero(row).flatten().tolist()) for row in mask}
    assert pairs <= {(0, 1), (2, 3), (4, 0), (4, 1), (4, 2), (4, 3), (0, 4), (1, 4), (2, 4), (3, 4)}
    assert {(0, 1), (2, 3)} <= pairs
    assert masker.ranking.shape == (5, 5)  # frozen after fit_rows


@pytest.mark.parametrize(
    ("make", "key", "value"),
    [
        (lambda v: RandomFieldMask(v), "RandomFieldMask.rate", 1.5),
        (lambda v: CorrelatedFieldMask(v), "CorrelatedFieldMask.rate", -0.1),
        (lambda v: IdDropout(v), "IdDropout.rate", 2.0),
        (lambda v: FeatureSwap(v), "FeatureSwap.rate", -1.0),
        (lambda v: DenseNoise(0.1, v), "DenseNoise.mask_rate", 1.1),
        (lambda v: DenseNoise(v), "DenseNoise.std", -0.5),
        (lambda v: View(embedding_dropout=v), "View.embedding_dropout", 1.0),
    ],
)
def test_bad_rates_name_key_and_value(make, key: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"{key}.*{value}"):
        make(value)
