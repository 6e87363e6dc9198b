"""Id count features: counted on the rows a fit reads, a slope per field in the wide term."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from test_logistic_fit import CARDINALITIES, _module, _Rows, _StartLogits, _trainer

from ssl_rec.data import TabularDataModule, id_occurrences
from ssl_rec.data.arrow_data_module import labeled_subset
from ssl_rec.data.id_occurrences import count_ids
from ssl_rec.data.loader import fixed_list_to_numpy
from ssl_rec.data.storage import SPARSE
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.wide_prefit import WIDE_INVERSE_STRENGTHS
from ssl_rec.metrics import binary_auc
from ssl_rec.models.id_counts import IdCountFeatures
from ssl_rec.models.logistic_fit import fit_logistic


def test_count_features_are_standardized_log_counts_over_the_counted_rows():
    counts = [np.array([0, 1, 4, 20]), np.array([5, 5, 5])]
    features = IdCountFeatures([4, 3])
    assert not features.fitted
    assert torch.equal(features(torch.tensor([[2, 1]])), torch.zeros(1, 2))  # unset: nothing
    features.set_counts(counts)
    assert features.fitted
    # each counted row once: the feature of field 0 over its 25 rows has mean 0 and std 1
    rows = torch.tensor(np.repeat(np.arange(4), counts[0]))
    column = features(torch.stack([rows, torch.zeros_like(rows)], 1))[:, 0].double()
    assert column.mean().abs() < 1e-6 and column.std(unbiased=False) == pytest.approx(1, abs=1e-6)
    values = features(torch.tensor([[0, 0], [1, 1], [2, 2], [3, 0]]))
    assert values[:, 0].diff().gt(0).all()  # more occurrences, larger feature
    assert torch.equal(values[:, 1], torch.zeros(4))  # one count for every row: no signal
    with pytest.raises(ValueError, match="field 1: shape"):
        features.set_counts([counts[0], np.ones(4)])
    with pytest.raises(ValueError, match="negative"):
        features.set_counts([counts[0], np.array([1, -1, 0])])
    with pytest.raises(ValueError, match="1 fields for a model of 2"):
        features.set_counts(counts[:1])


def test_count_ids_counts_every_table_in_slices(monkeypatch, capsys):
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, c, (n, len(CARDINALITIES))) % np.array(CARDINALITIES)
           for n, c in ((50, 9), (31, 9))]  # fmt: skip

    def table(block: np.ndarray) -> pa.Table:
        flat = pa.array(block.astype(np.int32).reshape(-1))
        return pa.table({SPARSE: pa.FixedSizeListArray.from_arrays(flat, block.shape[1])})

    monkeypatch.setattr(id_occurrences, "_CHUNK_ROWS", 7)
    got = count_ids([table(b) for b in ids], CARDINALITIES)
    both = np.concatenate(ids)
    for f, c in enumerate(CARDINALITIES):
        assert np.array_equal(got[f], np.bincount(both[:, f], minlength=c))
    assert "id counts" not in capsys.readouterr().err  # a small table: no bar
    # a large one has a bar (plain lines in a log), closed before an error propagates
    monkeypatch.setattr(id_occurrences, "_BAR_MIN_ROWS", 10)
    again = count_ids([table(b) for b in ids], CARDINALITIES)
    assert all(np.array_equal(a, b) for a, b in zip(again, got, strict=True))
    assert "id counts: 81 rows in" in capsys.readouterr().err.splitlines()[-1]
    with pytest.raises(ValueError, match=r"table 0 from row 49: row 1, field 1: id 9 outside "
                       r"the allowed range 0\.\.8"):  # fmt: skip
        count_ids([table(np.concatenate([ids[0], [[0, 9]]]))], CARDINALITIES)
    assert "id counts: 49 rows in" in capsys.readouterr().err.splitlines()[-1]


def _pair_counts(sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pair counts of fields 0 and 1 of ``sparse`` by brute force."""
    pairs, count = np.unique(sparse[:, :2], axis=0, return_counts=True)
    return pairs[:, 0], pairs[:, 1], count


def test_data_module_counts_the_ids_and_pairs_of_the_rows_its_fit_reads(tmp_path, write_clicks):
    """The labeled subset of a supervised fit; every training row of a semi-supervised one."""
    write_clicks(tmp_path / "clicks.csv", n=1000)

    def data(**kwargs) -> TabularDataModule:  # noqa: ANN003
        return TabularDataModule(str(tmp_path / "clicks.csv"), "clicked", ["price"],
                                 ["user", "item"], cache_dir=str(tmp_path / "cache"), seed=3,
                                 **kwargs)  # fmt: skip

    supervised = data(label_fraction=0.2)
    # a supervised fit never reads an unlabeled file, so its counting does not encode one
    supervised.unlabeled_file_rows = lambda: pytest.fail("unlabeled rows read")
    ids = fixed_list_to_numpy(supervised.split_table("train").column(SPARSE))
    labeled = ids[labeled_subset(len(ids), 0.2, 3)]
    cards = supervised.schema.cardinalities
    for f, count in enumerate(supervised.id_counts()):
        assert np.array_equal(count, np.bincount(labeled[:, f], minlength=cards[f]))
    for got, want in zip(supervised.id_pair_counts((0, 1)), _pair_counts(labeled), strict=True):
        assert np.array_equal(got, want)
    for semi in (data(label_fraction=0.2, unlabeled_per_batch=1.0), data(use_labels=False)):
        for f, count in enumerate(semi.id_counts()):
            assert np.array_equal(count, np.bincount(ids[:, f], minlength=cards[f]))
        for got, want in zip(semi.id_pair_counts((0, 1)), _pair_counts(ids), strict=True):
            assert np.array_equal(got, want)


class _CountedRows(_Rows):
    def id_counts(self) -> list[np.ndarray]:
        sparse = self.train[0].numpy()
        return [np.bincount(sparse[:, f], minlength=c) for f, c in enumerate(CARDINALITIES)]


def test_wide_counts_start_at_the_regression_on_ids_dense_and_counts(tmp_path):
    data, start = _CountedRows(), _StartLogits()
    module = _module(wide=True, wide_init="logistic", wide_counts=True)
    trainer = _trainer(1, start)
    trainer.fit(module, datamodule=data)
    features = IdCountFeatures(CARDINALITIES)
    features.set_counts(data.id_counts())
    (sparse, dense, label), (v_sparse, v_dense, v_label) = data.train, data.val
    columns = torch.cat([dense, features(sparse)], 1)
    v_columns = torch.cat([v_dense, features(v_sparse)], 1)
    fits = {c: fit_logistic(sparse, columns, label, CARDINALITIES, c)
            for c in WIDE_INVERSE_STRENGTHS}  # fmt: skip
    aucs = {c: binary_auc(f.logits(v_sparse, v_columns), v_label) for c, f in fits.items()}
    chosen = fits[max(aucs, key=aucs.get)]
    torch.testing.assert_close(start.logits, chosen.logits(v_sparse, v_columns), atol=1e-4,
                               rtol=0)  # fmt: skip
    assert torch.equal(module.wide.count_weight.weight.reshape(-1), chosen.dense[1:])
    assert chosen.dense[1:].abs().sum() > 0
    assert not module.wide.count_weight.weight.requires_grad  # held with the rest of the term

    # the counts travel with the weights: a loaded model neither needs nor recounts them
    path = tmp_path / "counts.ckpt"
    trainer.save_checkpoint(path)
    loaded = CTRModule.load_from_checkpoint(path)
    assert loaded.wide.counts.fitted
    assert torch.equal(loaded.wide.counts.values, module.wide.counts.values)
    _trainer(2).fit(loaded, datamodule=_Rows(seed=40), ckpt_path=path)  # no id_counts there
    assert torch.equal(loaded.wide.counts.values, module.wide.counts.values)


def test_wide_counts_need_a_wide_term_and_a_data_module_that_counts():
    assert _module(wide_counts=True).wide is None  # part of the wide term: nothing without it
    module = _module(wide=True, wide_counts=True)
    with pytest.raises(ValueError, match="needs a data module with id_counts"):
        _trainer(1).fit(module, datamodule=_Rows())
    zero = _module(wide=True, wide_counts=True)  # wide_init zero: counted, slopes trained
    _trainer(1).fit(zero, datamodule=_CountedRows())
    assert zero.wide.counts.fitted and zero.wide.count_weight.weight.abs().sum() > 0
