"""Representation health: effective rank of sets of known rank; collapse seen by all three."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ssl_rec.evaluation import effective_rank, representation_health


def test_a_rank_one_set_has_effective_rank_one() -> None:
    rng = np.random.default_rng(0)
    direction = rng.normal(size=16)
    vectors = rng.normal(size=(500, 1)) * direction  # every row on one line
    assert effective_rank(vectors) == pytest.approx(1.0, abs=1e-6)


def test_an_isotropic_gaussian_has_nearly_full_effective_rank() -> None:
    vectors = np.random.default_rng(1).normal(size=(20_000, 32))
    assert 31.0 < effective_rank(vectors) <= 32.0


def test_equal_singular_values_give_the_count_and_unequal_ones_the_entropy() -> None:
    assert effective_rank(np.diag([3.0, 3.0, 3.0, 0.0])) == pytest.approx(3.0)
    p = np.array([3.0, 1.0]) / 4.0
    assert effective_rank(np.diag([3.0, 1.0])) == pytest.approx(math.exp(-(p * np.log(p)).sum()))


def test_a_low_rank_set_is_counted_by_its_rank_whatever_the_width() -> None:
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(4_000, 4)) @ rng.normal(size=(4, 64))  # rank 4 in 64 dims
    assert 2.0 < effective_rank(vectors) <= 4.0 + 1e-6


def test_centering_removes_the_common_offset() -> None:
    rng = np.random.default_rng(3)
    offset = 100.0 * np.ones(8)
    vectors = offset + rng.normal(size=(5_000, 8))  # one huge shared direction + isotropic noise
    assert effective_rank(vectors) < 2.0
    assert effective_rank(vectors, center=True) > 7.5


def test_effective_rank_of_nothing_is_zero_and_bad_input_is_refused() -> None:
    assert effective_rank(np.zeros((10, 4))) == 0.0
    with pytest.raises(ValueError, match=r"\[n, H\]"):
        effective_rank(np.ones(5))
    with pytest.raises(ValueError, match="non-finite"):
        effective_rank(np.array([[1.0, np.nan]]))


def test_health_tells_a_collapsed_representation_from_a_spread_one(
    backbone, schema, batches_of
) -> None:
    spread = representation_health(backbone, batches_of(schema, 600), max_rows=500, seed=1)

    def collapsed_encode(field_emb: torch.Tensor, dense: torch.Tensor) -> tuple:
        return torch.ones(len(field_emb), 8) + 1e-6 * field_emb.mean(1), None

    backbone.encode = collapsed_encode  # every row maps to (nearly) one point
    collapsed = representation_health(backbone, batches_of(schema, 600), max_rows=500, seed=1)
    assert spread["rows"] == collapsed["rows"] == 500 and spread["dim"] == 8
    assert collapsed["effective_rank"] < 1.01 < 4.0 < spread["effective_rank"]
    assert collapsed["uniformity"] > -1e-3 and spread["uniformity"] < -1.0
    assert collapsed["alignment"] < 1e-6 < spread["alignment"] <= 4.0


def test_health_restores_training_mode_and_refuses_bad_input(backbone, schema, batches_of) -> None:
    backbone.train()
    out = representation_health(backbone, batches_of(schema, 300), max_rows=1000, mask_prob=0.5)
    assert backbone.training and out["rows"] == 300 and out["dim"] == 8
    assert 1.0 <= out["effective_rank"] <= 8.0 and out["alignment"] > 0.0
    with pytest.raises(ValueError, match="mask_prob"):
        representation_health(backbone, batches_of(schema, 10), mask_prob=1.0)
    with pytest.raises(ValueError, match="at least 2 rows"):
        representation_health(backbone, batches_of(schema, 1))
