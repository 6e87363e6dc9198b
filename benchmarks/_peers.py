"""Peer CTR implementations on the exact rows and features the library's models see.

The rows come out of :class:`MovieLensDataModule`'s own loaders (same split, same labeled
subset for a seed and label fraction, same ids and dense values), so peers and the library
differ only in the model. Peers: ``deepctr-torch`` DeepFM / DCN / xDeepFM (Adam, D = 16,
its default towers; xDeepFM's CIN (64, 64)) and scikit-learn logistic regression on one-hot ids.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
from collections.abc import Callable

import numpy as np
import torch

from ssl_rec.data.sources.movielens import MovieLensDataModule
from ssl_rec.metrics import binary_auc

XDEEPFM_CIN = (64, 64)
PEERS = ("deepctr_deepfm", "deepctr_dcn", "deepctr_xdeepfm", "sklearn_logistic")
Arrays = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # split -> dense, sparse, label
Run = tuple[float, Callable[[], float]]
_ARRAYS: dict[tuple[float, int, str], tuple[Arrays, list[str], list[int]]] = {}


def _collect(loader) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batches = list(loader)
    return (
        np.concatenate([b.dense.numpy() for b in batches]),
        np.concatenate([b.sparse.numpy() for b in batches]),
        np.concatenate([b.label.numpy() for b in batches]),
    )


def arrays(fraction: float, seed: int, cache: str) -> tuple[Arrays, list[str], list[int]]:
    """The labeled training rows of ``(fraction, seed)`` and all val/test rows, as arrays."""
    key = (fraction, seed, cache)
    if key not in _ARRAYS:
        dm = MovieLensDataModule(
            batch_size=4096, label_fraction=fraction, seed=seed, cache_dir=cache
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
    ] + [DenseFeat("dense_0", 1)]
    # xDeepFM's default CIN (256, 128) costs ~7x the (64, 64) one on one CPU thread.
    extra = {"cin_layer_size": XDEEPFM_CIN} if name == "deepctr_xdeepfm" else {}
    torch.manual_seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):
        model = cls(columns, columns, task="binary", device="cpu", seed=seed, **extra)
    model.compile("adam", "binary_crossentropy")

    def inputs(split: str) -> dict[str, np.ndarray]:
        dense, sparse, _ = data[split]
        return {**{f: sparse[:, i] for i, f in enumerate(fields)}, "dense_0": dense[:, 0]}

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


def _logistic(data: Arrays, c: float) -> Run:
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


def unavailable(name: str) -> str | None:
    """Why a peer cannot run here (its package is missing), or ``None``."""
    module = "deepctr_torch" if name.startswith("deepctr") else "sklearn"
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed (pip install --no-deps deepctr-torch scikit-learn)"
    return None


def peer_runs(
    name: str, fraction: float, seed: int, epochs: int, cache: str, batch: int
) -> dict[str, Run]:
    """Every variant of peer ``name`` for one seed: ``variant -> (val AUC, test thunk)``."""
    data, fields, cards = arrays(fraction, seed, cache)
    if name == "sklearn_logistic":
        return {f"C={c:g}": _logistic(data, c) for c in (0.1, 1.0)}
    variant = "adam lr=1e-3, D=16" + (f", CIN {XDEEPFM_CIN}" if name == "deepctr_xdeepfm" else "")
    return {variant: _deepctr(name, data, fields, cards, seed, epochs, batch)}
