import hashlib

import numpy as np
import pytest

from ssl_rec.data import SyntheticClickModel, SyntheticConfig, SyntheticCTRDataModule
from ssl_rec.data.sources.synthetic_clicks import PRESETS
from ssl_rec.metrics import binary_auc, binary_logloss


def test_determinism():
    a = SyntheticClickModel(SyntheticConfig(seed=5)).rows("train", 1, 2000)
    b = SyntheticClickModel(SyntheticConfig(seed=5)).rows("train", 1, 2000)
    c = SyntheticClickModel(SyntheticConfig(seed=6)).rows("train", 1, 2000)
    for name in ("dense", "sparse", "prob", "label"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.sparse, c.sparse)
    assert not np.array_equal(a.prob, c.prob)


def test_shapes_and_ranges():
    gen = SyntheticClickModel(SyntheticConfig(seed=1))
    rows = gen.rows("val", 0, 5000)
    assert rows.sparse.shape == (5000, 26) and rows.dense.shape == (5000, 13)
    assert (rows.sparse >= 0).all() and (rows.sparse < np.array(gen.cardinalities)).all()
    assert (rows.dense >= 0).all() and (rows.dense[rows.dense_missing] == 0).all()
    assert (rows.sparse[:, 21] == 0).mean() == pytest.approx(0.76, abs=0.03)
    assert gen.item_latents("C3").shape == (gen.cardinalities[2], 16)


def test_oracle_metrics_and_ctr():
    gen = SyntheticClickModel(SyntheticConfig())
    rows = gen.rows("test", 0, 40_000)
    assert rows.label.mean() == pytest.approx(0.25, abs=0.02)
    auc = binary_auc(rows.prob, rows.label)
    assert 0.75 < auc < 0.95
    assert binary_logloss(rows.prob, rows.label) < binary_logloss(
        np.full_like(rows.prob, rows.label.mean()), rows.label
    )


def test_ids_reveal_user_cluster():
    # The latent u must be recoverable from co-occurring ids (the point of pretraining):
    # rows of one user cluster share their most frequent id far more than chance.
    gen = SyntheticClickModel(SyntheticConfig())
    rows = gen.rows("train", 0, 20_000)
    ids = rows.sparse[:, 2]
    same = rows.user_cluster == rows.user_cluster[0]
    top = np.bincount(ids[same]).argmax()
    assert (ids[same] == top).mean() > 5 * max((ids[~same] == top).mean(), 1e-3)
    clusters = gen.item_clusters("C3")
    latents = gen.item_latents("C3")
    d_same = np.linalg.norm(latents[1] - latents[1 + (clusters[1:] == clusters[1]).nonzero()[0][1]])
    d_other = np.linalg.norm(latents[1] - latents[2])
    assert d_same < d_other


def test_binary_auc_exact():
    assert binary_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == 0.75
    assert binary_auc(np.array([0.5, 0.5]), np.array([0, 1])) == 0.5
    rng = np.random.default_rng(0)
    s, y = rng.random(300), rng.random(300) < 0.3
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in s[y] for n in s[~y]])
    assert binary_auc(s, y) == pytest.approx(brute)


def test_datamodule_label_fraction_and_pool(tmp_path):
    kw = {"n_train": 20_000, "n_val": 2_000, "n_test": 2_000, "cache_dir": str(tmp_path)}
    dm = SyntheticCTRDataModule(batch_size=1000, **kw)
    oracle = dm.oracle_metrics("test")
    assert oracle["auc"] > 0.7 and oracle["logloss"] < 0.56
    few = SyntheticCTRDataModule(label_fraction=0.05, batch_size=1000, **kw).train_dataloader()
    more = SyntheticCTRDataModule(label_fraction=0.2, batch_size=1000, **kw).train_dataloader()
    few_ids = np.concatenate([b.row_id.numpy() for b in few])
    more_ids = np.concatenate([b.row_id.numpy() for b in more])
    assert len(few_ids) == 1000 and set(few_ids) <= set(more_ids)
    pool = SyntheticCTRDataModule(use_labels=False, batch_size=1000, **kw).train_dataloader()
    batches = list(pool)
    assert all(b.label is None for b in batches) and sum(b.batch_size for b in batches) == 20_000
    gen = dm.click_model()
    expected = SyntheticClickModel(SyntheticConfig()).item_latents(2)
    assert np.array_equal(gen.item_latents(2), expected)
    assert dm.vocabulary.id_values("C1")[0].as_py() == "<missing>"


@pytest.mark.parametrize(
    ("key", "value"), [("temperature", 0.0), ("base_ctr", 1.5), ("cardinality_scale", 2.0)]
)
def test_bad_config(key, value):
    with pytest.raises(ValueError, match=f"{key} must be in"):
        SyntheticConfig(**{key: value})


def test_bad_datamodule_args(tmp_path):
    with pytest.raises(ValueError, match="label_fraction must be in \\(0, 1\\], got 0"):
        SyntheticCTRDataModule(label_fraction=0.0)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1 or 'auto', got 0"):
        SyntheticCTRDataModule(batch_size=0)
    with pytest.raises(ValueError, match="n_train must be in"):
        SyntheticCTRDataModule(n_train=0)
    with pytest.raises(ValueError, match="eval_batch_size must be >= 1 or null, got 0"):
        SyntheticCTRDataModule(eval_batch_size=0)


def test_evaluation_batches_have_their_own_size(tmp_path):
    kw = {"n_train": 3_000, "n_val": 2_500, "n_test": 2_500, "cache_dir": str(tmp_path)}
    dm = SyntheticCTRDataModule(batch_size=256, eval_batch_size=1000, label_fraction=0.5, **kw)
    train = [b.batch_size for b in dm.train_dataloader()]
    assert max(train) == 256 and sum(train) == 1_500
    for loader in (dm.val_dataloader(), dm.test_dataloader(), dm.predict_dataloader()):
        assert [b.batch_size for b in loader] == [1000, 1000, 500]
    default = SyntheticCTRDataModule(batch_size=256, **kw).val_dataloader()
    assert {b.batch_size for b in default} == {256, 2_500 % 256}


def _digest(rows) -> str:
    h = hashlib.sha256()
    for name in ("dense", "dense_missing", "sparse", "prob", "label", "user_cluster"):
        h.update(np.ascontiguousarray(getattr(rows, name)).tobytes())
    return h.hexdigest()


def test_easy_preset_rows_unchanged():
    # Digest of rows drawn before difficulty became parameters: the default ("easy") must
    # keep every row bit for bit, so cached data and published figures stay valid.
    config = SyntheticConfig(seed=2, cardinality_scale=0.0005)
    rows = SyntheticClickModel(config).rows("val", 1, 3000)
    assert _digest(rows) == "b74fb7728fc4417b2647aff51de6dd4cbd93e0ba0525fc975df05e90cfd4e263"
    explicit = SyntheticConfig(seed=2, cardinality_scale=0.0005, preset="easy",
                               cluster_weight=6.0, pair_weight=0.2, id_effect_std=0.02)  # fmt: skip
    assert _digest(SyntheticClickModel(explicit).rows("val", 1, 3000)) == _digest(rows)


def test_presets_differ_and_overrides_apply():
    easy, hard = SyntheticConfig(), SyntheticConfig(preset="hard")
    assert easy.difficulty() == PRESETS["easy"] and hard.difficulty() == PRESETS["hard"]
    assert hard.difficulty()["pair_weight"] >= 1.0 and hard.difficulty()["id_effect_std"] >= 0.08
    a = SyntheticClickModel(easy).rows("test", 0, 2000)
    b = SyntheticClickModel(hard).rows("test", 0, 2000)
    assert not np.array_equal(a.prob, b.prob)
    tweaked = SyntheticConfig(preset="hard", pair_weight=2.0).difficulty()
    assert tweaked == {**PRESETS["hard"], "pair_weight": 2.0}
    with pytest.raises(ValueError, match="preset must be one of \\('easy', 'hard'\\), got 'x'"):
        SyntheticConfig(preset="x")
    with pytest.raises(ValueError, match="pair_weight must be in"):
        SyntheticConfig(pair_weight=-1.0)


@pytest.mark.parametrize("preset", ["easy", "hard"])
def test_logit_variance_decomposition_sums_to_total(preset):
    gen = SyntheticClickModel(SyntheticConfig(preset=preset))
    prob = gen.rows("train", 0, 20_000).prob.astype(np.float64)
    logit = np.log(prob) - np.log1p(-prob)
    report = gen.logit_variance(20_000)
    assert set(report["shares"]) == {"cluster", "pair", "id_effects", "dense"}
    assert sum(report["shares"].values()) == pytest.approx(1.0, abs=1e-9)
    assert report["total"] == pytest.approx(np.var(logit), rel=0.1)
    # Uncorrelated terms: shares equal own variance / total; the sum of own variances
    # cannot exceed the total by much (only the small pair/cluster covariance).
    own = sum(report["variance"].values())
    assert own == pytest.approx(report["total"], rel=0.25)


def test_hard_preset_is_not_dominated_by_the_user_cluster():
    easy = SyntheticClickModel(SyntheticConfig()).logit_variance()
    hard = SyntheticClickModel(SyntheticConfig(preset="hard")).logit_variance()
    assert easy["shares"]["cluster"] > 0.9
    assert hard["shares"]["cluster"] <= 0.5 and hard["user_cluster_r2"] <= 0.5
    assert hard["shares"]["pair"] + hard["shares"]["id_effects"] >= 0.4


def test_datamodule_preset_and_metadata(tmp_path):
    kw = {"n_train": 2_000, "n_val": 500, "n_test": 500, "cache_dir": str(tmp_path)}
    dm = SyntheticCTRDataModule(preset="hard", batch_size=500, **kw)
    meta = dm.schema.metadata
    assert meta["difficulty"] == PRESETS["hard"] and meta["synthetic"]["preset"] == "hard"
    assert sum(meta["logit_variance"]["shares"].values()) == pytest.approx(1.0, abs=1e-9)
    assert dm.click_model().weights == PRESETS["hard"]
    easy = SyntheticCTRDataModule(batch_size=500, **kw)
    assert easy.schema.metadata["difficulty"] == PRESETS["easy"]
    assert easy.oracle_metrics("test")["auc"] != dm.oracle_metrics("test")["auc"]
    with pytest.raises(ValueError, match="preset must be one of"):
        SyntheticCTRDataModule(preset="medium", **kw)


def test_min_cardinality_floors_every_field():
    floored = SyntheticClickModel(SyntheticConfig(cardinality_scale=0.0002, min_cardinality=50))
    plain = SyntheticClickModel(SyntheticConfig(cardinality_scale=0.0002))
    assert min(plain.cardinalities) == 4 and min(floored.cardinalities) == 51
    rows = floored.rows("train", 0, 5000)
    assert (rows.sparse.max(axis=0) < np.array(floored.cardinalities)).all()
    assert rows.sparse.max(axis=0).min() > 3  # the floored small fields use their new ids
    with pytest.raises(ValueError, match="min_cardinality"):
        SyntheticConfig(min_cardinality=0)
