"""Peer CTR implementations on the exact rows and features the library's models see.

The rows come out of the dataset's own data module (:data:`DATA_MODULES`: same split, same
labeled subset for a seed and label fraction, same ids and dense values), so peers and the
library differ only in the model. Peers: ``deepctr-torch`` DeepFM / DCN / xDeepFM (Adam, D = 16,
its default towers; xDeepFM's CIN (64, 64)), scikit-learn logistic regression on one-hot ids
and standardized dense columns, and LightGBM gradient-boosted trees (ids as categorical
features, dense columns as numeric; early stopping and a small grid on validation AUC).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
from collections.abc import Callable

import numpy as np
import torch

from ssl_rec.data.sources.ecommerce import EcommerceDataModule
from ssl_rec.data.sources.movielens import MovieLensDataModule
from ssl_rec.metrics import binary_auc

XDEEPFM_CIN = (64, 64)
PEERS = ("deepctr_deepfm", "deepctr_dcn", "deepctr_xdeepfm", "sklearn_logistic", "lightgbm")
DATA_MODULES = {"movielens": MovieLensDataModule, "ecommerce": EcommerceDataModule}
# LightGBM's grid (num_leaves, learning_rate); rounds stop after LIGHTGBM_PATIENCE rounds
# without a better validation AUC, at most LIGHTGBM_ROUNDS.
LIGHTGBM_GRID = ((15, 0.05), (63, 0.05), (15, 0.2), (63, 0.2))
LIGHTGBM_ROUNDS = 2000
LIGHTGBM_PATIENCE = 50
Arrays = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # split -> dense, sparse, label
Run = tuple[float, Callable[[], float]]
_ARRAYS: dict[tuple[str, float, int, str], tuple[Arrays, list[str], list[int]]] = {}


def _collect(loader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batches = list(loader)
    return (
        np.concatenate([b.dense.numpy() for b in batches]),
        np.concatenate([b.sparse.numpy() for b in batches]),
        np.concatenate([b.label.numpy() for b in batches]),
    )


def arrays(
    dataset: str, fraction: float, seed: int, cache: str
) -> tuple[Arrays, list[str], list[int]]:
    """The labeled training rows of ``(fraction, seed)`` and all val/test rows, as arrays.

    Args:
        dataset: a key of :data:`DATA_MODULES`.
        fraction: labeled fraction of the training rows (the data module's ``label_fraction``).
        seed: seed of the split (the data module's ``split_seed``) and of the labeled subset.
        cache: the data module's ``cache_dir``.

    Returns:
        ``split -> (dense float32[n, n_dense], sparse int64[n, F], label float32[n])``, the
        field names and their cardinalities.

    """
    key = (dataset, fraction, seed, cache)
    if key not in _ARRAYS:
        dm = DATA_MODULES[dataset](
            batch_size=4096, label_fraction=fraction, seed=seed, cache_dir=cache, split_seed=seed
        )
        splits = {
            "train": _collect(dm.train_dataloader()),
            "val": _collect(dm.val_dataloader()),
            "test": _collect(dm.test_dataloader()),
        }
        _ARRAYS[key] = splits, list(dm.schema.field_names), list(dm.schema.cardinalities)
    return _ARRAYS[key]


def _deepctr(
    name: str, data: Arrays, fields: list[str], cards: list[int], seed: int, epochs: int, batch: int
) -> Run:
    from deepctr_torch.inputs import DenseFeat, SparseFeat
    from deepctr_torch.models import DCN, DeepFM, xDeepFM

    cls = {"deepctr_deepfm": DeepFM, "deepctr_dcn": DCN, "deepctr_xdeepfm": xDeepFM}[name]
    columns = [
        SparseFeat(f, vocabulary_size=c, embedding_dim=16)
        for f, c in zip(fields, cards, strict=True)
    ] + [DenseFeat(f"dense_{i}", 1) for i in range(data["train"][0].shape[1])]
    # xDeepFM's default CIN (256, 128) costs ~7x the (64, 64) one on one CPU thread.
    extra = {"cin_layer_size": XDEEPFM_CIN} if name == "deepctr_xdeepfm" else {}
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):
        model = cls(columns, columns, task="binary", device="cpu", seed=seed, **extra)
    model.compile("adam", "binary_crossentropy")

    def inputs(split: str) -> dict[str, np.ndarray]:
        dense, sparse, _ = data[split]
        return {**{f: sparse[:, i] for i, f in enumerate(fields)},
                **{f"dense_{i}": dense[:, i] for i in range(dense.shape[1])}}  # fmt: skip

    best_auc, best_state = -1.0, None
    for _ in range(epochs):
        with contextlib.redirect_stdout(io.StringIO()):  # its per-fit banner
            model.fit(inputs("train"), data["train"][2], batch_size=batch, epochs=1, verbose=0)
        auc = binary_auc(model.predict(inputs("val"), 4096).ravel(), data["val"][2])
        if auc > best_auc:
            best_auc, best_state = auc, copy.deepcopy(model.state_dict())

    def test() -> float:
        model.load_state_dict(best_state)
        return binary_auc(model.predict(inputs("test"), 4096).ravel(), data["test"][2])

    return best_auc, test


def logistic_regression(data: Arrays, c: float) -> Run:
    """The logistic-regression peer: one-hot ids and standardized dense columns, ``C = c``.

    Returns:
        ``(validation AUC, thunk computing the test AUC)``.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    onehot = OneHotEncoder(handle_unknown="ignore").fit(data["train"][1])
    scale = StandardScaler().fit(data["train"][0])

    def features(split: str):
        import scipy.sparse

        dense, sparse, _ = data[split]
        return scipy.sparse.hstack([onehot.transform(sparse), scale.transform(dense)]).tocsr()

    model = LogisticRegression(C=c, max_iter=2000).fit(features("train"), data["train"][2])
    val = binary_auc(model.predict_proba(features("val"))[:, 1], data["val"][2])
    return val, lambda: binary_auc(model.predict_proba(features("test"))[:, 1], data["test"][2])


def _lightgbm_frames(data: Arrays) -> dict:
    """``split -> DataFrame`` of LightGBM's inputs: ids as categoricals, dense as numbers.

    Categories from the training rows; an id first seen later is unknown (NaN) to the trees.
    """
    import pandas as pd

    train_ids = data["train"][1]
    categories = [np.unique(train_ids[:, i]) for i in range(train_ids.shape[1])]

    def frame(split: str):  # noqa: ANN202 - a DataFrame
        dense, sparse, _ = data[split]
        columns = {f"id_{i}": pd.Categorical(sparse[:, i], categories=categories[i])
                   for i in range(sparse.shape[1])}  # fmt: skip
        columns.update({f"dense_{i}": dense[:, i] for i in range(dense.shape[1])})
        return pd.DataFrame(columns)

    return {split: frame(split) for split in data}


def _lightgbm(data: Arrays, frames: dict, num_leaves: int, learning_rate: float, seed: int) -> Run:
    import lightgbm

    model = lightgbm.LGBMClassifier(
        n_estimators=LIGHTGBM_ROUNDS, num_leaves=num_leaves, learning_rate=learning_rate,
        random_state=seed, n_jobs=1, verbose=-1,
    )  # fmt: skip
    model.fit(
        frames["train"], data["train"][2], eval_X=frames["val"], eval_y=data["val"][2],
        eval_metric="auc", callbacks=[lightgbm.early_stopping(LIGHTGBM_PATIENCE, verbose=False)],
    )  # fmt: skip

    def auc(split: str) -> float:
        return binary_auc(model.predict_proba(frames[split])[:, 1], data[split][2])

    return auc("val"), lambda: auc("test")


def unavailable(name: str) -> str | None:
    """Why a peer cannot run here (its package is missing), or ``None``."""
    module = {"sklearn_logistic": "sklearn", "lightgbm": "lightgbm"}.get(name, "deepctr_torch")
    if importlib.util.find_spec(module) is None:
        return (
            f"{module} is not installed (pip install --no-deps deepctr-torch scikit-learn "
            "lightgbm==4.7.0)"
        )
    return None


def peer_runs(
    name: str, dataset: str, fraction: float, seed: int, epochs: int, cache: str, batch: int
) -> dict[str, Run]:
    """Every variant of peer ``name`` for one seed: ``variant -> (val AUC, test thunk)``.

    Args:
        name: one of :data:`PEERS`.
        dataset: a key of :data:`DATA_MODULES`.
        fraction: labeled fraction of the training rows.
        seed: the split's, the labeled subset's and the model's seed.
        epochs: epochs of the deepctr models (the best validation epoch is kept).
        cache: the data module's ``cache_dir``.
        batch: batch size of the deepctr models.

    """
    data, fields, cards = arrays(dataset, fraction, seed, cache)
    if name == "sklearn_logistic":
        return {f"C={c:g}": logistic_regression(data, c) for c in (0.1, 1.0)}
    if name == "lightgbm":
        frames = _lightgbm_frames(data)  # once for the grid
        return {f"num_leaves={leaves}, lr={lr:g}": _lightgbm(data, frames, leaves, lr, seed)
                for leaves, lr in LIGHTGBM_GRID}  # fmt: skip
    variant = "adam lr=1e-3, D=16" + (f", CIN {XDEEPFM_CIN}" if name == "deepctr_xdeepfm" else "")
    return {variant: _deepctr(name, data, fields, cards, seed, epochs, batch)}
