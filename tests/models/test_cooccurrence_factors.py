"""Co-occurrence factors: two fields' id pairs counted, factored, slopes in the wide term."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from test_id_counts import _pair_counts as _pairs
from test_logistic_fit import CARDINALITIES, _module, _Rows, _StartLogits, _trainer

from ssl_rec.data import id_occurrences
from ssl_rec.data.id_occurrences import count_id_pairs
from ssl_rec.data.storage import SPARSE
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.wide_prefit import WIDE_INVERSE_STRENGTHS
from ssl_rec.metrics import binary_auc
from ssl_rec.models import CooccurrenceFactors, WideTerm
from ssl_rec.models.logistic_fit import fit_logistic
from ssl_rec.models.wide import default_factor_fields
from ssl_rec.quantize.serving_wide import ServingWide
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch


def test_factors_separate_groups_of_ids_that_occur_together():
    # users 0-5 meet items 0-3 only, users 6-11 items 4-8 only, with uneven counts
    rng = np.random.default_rng(0)
    users = rng.integers(0, 12, 4000)
    items = np.where(users < 6, rng.integers(0, 4, 4000), rng.integers(4, 9, 4000))
    left, right, count = _pairs(np.stack([users, items], 1))
    factors = CooccurrenceFactors(CARDINALITIES, (0, 1), rank=2, seed=3)
    assert not factors.fitted and factors.width == 4
    assert torch.equal(factors(torch.tensor([[1, 2]])), torch.zeros(1, 4))  # unset: nothing
    factors.set_counts(left, right, count)
    assert factors.fitted
    rows = torch.tensor(np.stack([users, items], 1))
    columns = factors(rows).double()
    # standardized over the counted rows (each row once)
    torch.testing.assert_close(columns.mean(0), torch.zeros(4, dtype=torch.float64), atol=1e-5,
                               rtol=0)  # fmt: skip
    torch.testing.assert_close(columns.std(0, unbiased=False), torch.ones(4, dtype=torch.float64),
                               atol=1e-5, rtol=0)  # fmt: skip
    # the two blocks are the top two components: some user column splits the groups cleanly
    user_factors = factors.left.numpy()
    split = [abs(user_factors[:6, k].mean() - user_factors[6:, k].mean())
             / (user_factors[:6, k].std() + user_factors[6:, k].std() + 1e-9)
             for k in range(2)]  # fmt: skip
    assert max(split) > 3
    items_ = factors.right.numpy()

    def distance(i: int, j: int) -> float:
        return float(np.linalg.norm(items_[i] - items_[j]))

    assert max(distance(0, 1), distance(4, 5)) < min(distance(0, 4), distance(1, 5))
    # the same counts give the same factors (a seeded SVD); a repeated pair adds up
    again = CooccurrenceFactors(CARDINALITIES, (0, 1), rank=2, seed=3)
    again.set_counts(np.concatenate([left, left[:1]]), np.concatenate([right, right[:1]]),
                     np.concatenate([count, [0]]))  # fmt: skip
    assert torch.equal(again.left, factors.left) and torch.equal(again.right, factors.right)


def test_factors_beyond_a_fields_ids_stay_zero_and_bad_counts_are_refused():
    factors = CooccurrenceFactors([3, 2], (1, 0), rank=4)
    factors.set_counts(np.array([0, 1, 1]), np.array([0, 1, 2]), np.array([5, 1, 2]))
    assert torch.equal(factors.left[:, 2:], torch.zeros(2, 2))  # field 1 has 2 ids: rank 2
    assert factors.left[:, :2].abs().sum() > 0
    with pytest.raises(ValueError, match="2 left ids, 3 right ids"):
        factors.set_counts(np.array([0, 1]), np.array([0, 1, 2]), np.array([5, 1, 2]))
    with pytest.raises(ValueError, match=r"a right id outside \[0, 3\)"):
        factors.set_counts(np.array([0]), np.array([3]), np.array([1]))
    with pytest.raises(ValueError, match="negative"):
        factors.set_counts(np.array([0]), np.array([0]), np.array([-1]))
    with pytest.raises(ValueError, match="two different fields of 2"):
        CooccurrenceFactors([3, 2], (0, 0), rank=1)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        CooccurrenceFactors([3, 2], (0, 1), rank=0)
    assert default_factor_fields([5, 40, 7, 40]) == (1, 3)
    assert default_factor_fields([5]) is None  # one field: no pair


def test_count_id_pairs_counts_every_table_in_slices(monkeypatch):
    rng = np.random.default_rng(1)
    blocks = [rng.integers(0, 9, (n, 3)) for n in (50, 31)]

    def table(block: np.ndarray) -> pa.Table:
        flat = pa.array(block.astype(np.int32).reshape(-1))
        return pa.table({SPARSE: pa.FixedSizeListArray.from_arrays(flat, block.shape[1])})

    monkeypatch.setattr(id_occurrences, "_CHUNK_ROWS", 7)  # pairs met in several slices add up
    left, right, count = count_id_pairs([table(b) for b in blocks], [9, 9, 9], (2, 0))
    both = np.concatenate(blocks)
    expected = _pairs(both[:, [2, 0]])
    for got, want in zip((left, right, count), expected, strict=True):
        assert np.array_equal(got, want)
    assert count.sum() == len(both)
    with pytest.raises(ValueError, match="id pair counts, table 0 from row 49: row 1, field 1"):
        count_id_pairs([table(np.concatenate([blocks[0], [[0, 9, 0]]]))], [9, 9, 9], (0, 1))
    empty = count_id_pairs([], [9, 9, 9], (0, 1))
    assert all(len(a) == 0 for a in empty)


class _PairedRows(_Rows):
    """Rows whose users and items meet in two groups, labels as in ``_Rows``."""

    def __init__(self, seed: int = 4) -> None:
        super().__init__(seed)
        for rows in (self.train, self.val):
            sparse = rows[0]
            sparse[:, 1] = torch.where(sparse[:, 0] < 6, sparse[:, 1] % 4, 4 + sparse[:, 1] % 5)

    def id_pair_counts(self, fields: tuple[int, int]) -> tuple[np.ndarray, ...]:
        return _pairs(self.train[0].numpy()[:, list(fields)])


def _chosen_regression(data: _Rows, factors: CooccurrenceFactors) -> tuple[bool, object]:
    """The regression the wide term's start chooses on validation: with or without factors."""
    (sparse, dense, label), (v_sparse, v_dense, v_label) = data.train, data.val
    fits, aucs = {}, {}
    for with_factors in (False, True):  # on a tie, without
        scale = 1.0 if with_factors else 0.0
        columns = torch.cat([dense, scale * factors(sparse)], 1)
        v_columns = torch.cat([v_dense, scale * factors(v_sparse)], 1)
        for c in WIDE_INVERSE_STRENGTHS:
            fit = fit_logistic(sparse, columns, label, CARDINALITIES, c)
            fits[with_factors, c] = fit, fit.logits(v_sparse, v_columns)
            aucs[with_factors, c] = binary_auc(fits[with_factors, c][1], v_label)
    best = max(aucs, key=aucs.get)
    return best[0], fits[best]


class _EvenPairs(_PairedRows):
    """Every user meets every item once: factors constant over the rows, so all zero."""

    def id_pair_counts(self, fields: tuple[int, int]) -> tuple[np.ndarray, ...]:
        users, items = np.meshgrid(*(np.arange(CARDINALITIES[f]) for f in fields), indexing="ij")
        return users.reshape(-1), items.reshape(-1), np.ones(users.size, np.int64)


@pytest.mark.parametrize(("data", "uses_factors"), [(_PairedRows, True), (_EvenPairs, False)])
def test_wide_factors_start_at_the_regression_chosen_with_or_without_them(data, uses_factors):
    data, start = data(), _StartLogits()
    module = _module(wide=True, wide_init="logistic", wide_factors=2)
    assert module.wide.factors.fields == (0, 1)  # the two fields with the most ids
    _trainer(1, start).fit(module, datamodule=data)
    factors = CooccurrenceFactors(CARDINALITIES, (0, 1), rank=2)
    factors.set_counts(*data.id_pair_counts((0, 1)))
    torch.testing.assert_close(module.wide.factors.left, factors.left)
    with_factors, (chosen, logits) = _chosen_regression(data, factors)
    assert module.provenance["wide_fit"]["factors"] is with_factors is uses_factors
    torch.testing.assert_close(start.logits, logits, atol=1e-4, rtol=0)
    assert torch.equal(module.wide.factor_weight.weight.reshape(-1), chosen.dense[1:])
    assert bool(chosen.dense[1:].abs().sum() > 0) is uses_factors  # left out: zero slopes
    assert not module.wide.factor_weight.weight.requires_grad  # held with the rest of the term


def test_wide_factors_travel_with_the_weights(tmp_path):
    module = _module(wide=True, wide_init="logistic", wide_factors=2)
    trainer = _trainer(1)
    trainer.fit(module, datamodule=_PairedRows())
    # the factors travel with the weights: a loaded model neither needs nor recounts them
    path = tmp_path / "factors.ckpt"
    trainer.save_checkpoint(path)
    loaded = CTRModule.load_from_checkpoint(path)
    assert loaded.wide.factors.fitted and loaded.hparams.wide_factors == 2
    assert torch.equal(loaded.wide.factors.right, module.wide.factors.right)
    _trainer(2).fit(loaded, datamodule=_Rows(seed=40), ckpt_path=path)  # no id_pair_counts
    assert torch.equal(loaded.wide.factors.right, module.wide.factors.right)


def test_wide_factors_check_their_settings_and_need_a_data_module_that_counts():
    assert _module(wide_factors=4).wide is None  # part of the wide term: nothing without it
    schema = FeatureSchema(["price"], [CategoricalField("user", 12)], "label")
    one_field = CTRModule(_module().hparams.backbone, schema.to_dict(), wide=True, wide_factors=4)
    assert one_field.wide.factors is None  # a shipped default on a one-field table: no pair
    named = _module(wide=True, wide_factors=1, wide_factor_fields=["item", "user"])
    assert named.wide.factors.fields == (1, 0)
    with pytest.raises(ValueError, match=r"two different fields of \['user', 'item'\]"):
        _module(wide=True, wide_factors=1, wide_factor_fields=["user", "shop"])
    with pytest.raises(ValueError, match="wide_factors must be >= 0"):
        _module(wide=True, wide_factors=-1)
    with pytest.raises(ValueError, match="needs a data module with id_pair_counts"):
        _trainer(1).fit(_module(wide=True, wide_factors=2), datamodule=_Rows())
    zero = _module(wide=True, wide_factors=2)  # wide_init zero: factored, slopes trained
    _trainer(1).fit(zero, datamodule=_PairedRows())
    assert zero.wide.factors.fitted and zero.wide.factor_weight.weight.abs().sum() > 0


def test_serving_wide_folds_the_factor_and_count_slopes_into_the_ids():
    wide = WideTerm(["user", "item"], CARDINALITIES, 1, id_counts=True, factor_rank=3,
                    factor_fields=(1, 0))  # fmt: skip
    rows = _PairedRows().train[0].numpy()
    wide.counts.set_counts([np.bincount(rows[:, f], minlength=c)
                            for f, c in enumerate(CARDINALITIES)])  # fmt: skip
    wide.factors.set_counts(*_pairs(rows[:, [1, 0]]))
    with torch.no_grad():
        wide.count_weight.weight.copy_(torch.tensor([[0.7, -1.3]]))
        wide.factor_weight.weight.copy_(torch.randn(1, 6))
        wide.dense.weight.fill_(0.25)
    wide.ids.load_weights([torch.randn(c, 1) for c in CARDINALITIES])
    sparse = torch.stack([torch.arange(9) % c for c in CARDINALITIES], 1)
    dense = torch.randn(9, 1)
    with torch.no_grad():
        expected = wide(sparse, dense)
        columns = wide.linear_columns(sparse, dense)
    assert columns.shape == (9, 1 + 2 + 6)
    served = ServingWide.from_wide(wide)(sparse, Batch(dense, sparse).dense)
    torch.testing.assert_close(served, expected)
    # load_linear_weights inverts the column layout
    weights = torch.arange(9.0)
    wide.load_linear_weights(weights)
    assert torch.equal(wide.factor_weight.weight.reshape(-1), weights[3:])
    assert torch.equal(wide.count_weight.weight.reshape(-1), weights[1:3])
