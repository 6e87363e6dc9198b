"""Synthetic Criteo-like click data with a known latent structure and known click probability.

Each row has a latent user/context vector ``u = mu[c] + noise`` (``c`` one of
``n_user_clusters`` Gaussian-mixture clusters). Each id of each field belongs to one of
``n_item_clusters`` latent clusters and has latent vector ``v = centroid + small noise``.
A row's id in field ``f`` is drawn by picking a cluster with probability
``softmax(<mu[c], centroid_f> / temperature)`` then an id inside it by Zipf popularity;
"noise" fields ignore ``u``; some fields are often missing (id 0). Dense columns are
Poisson counts whose log-rate is a linear map of ``u``. The click probability is
``sigmoid(b + w.u + sum of <v_f1, v_f2> over a few field pairs + per-id effects + dense
effect)``, with ``b`` calibrated to ``base_ctr``. The label thus depends mainly on ``u``,
observable only through which ids co-occur: unlabeled rows carry label-relevant structure.
Everything is a deterministic function of the :class:`SyntheticConfig` (seed included).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

CRITEO_KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
# Means of Criteo-Kaggle's dense counts, and the fraction missing (rounded).
DENSE_MEANS = (3.5, 105.0, 26.9, 7.3, 18538.0, 116.0, 16.3, 12.5, 106.0, 0.6, 2.7, 1.0, 8.2)
DENSE_MISSING = (0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
FIELD_MISSING = {2: 0.03, 3: 0.03, 11: 0.03, 15: 0.03, 18: 0.44, 19: 0.44, 20: 0.03,
                 21: 0.76, 23: 0.03, 24: 0.44, 25: 0.44}  # fmt: skip
NOISE_FIELDS = (4, 9, 14, 19, 24)
PAIRS = ((3, 9), (23, 25), (6, 14), (9, 23))
# Difficulty of the click model: the weights of the click logit's parts. "easy" lets the
# user-cluster term (what unlabeled co-occurrence reveals) dominate the logit; "hard" gives
# the item-pair interactions and per-id effects, which only labels teach, as much weight.
PRESETS: dict[str, dict[str, float]] = {
    "easy": {"cluster_weight": 6.0, "pair_weight": 0.2, "id_effect_std": 0.02},
    "hard": {"cluster_weight": 2.0, "pair_weight": 1.0, "id_effect_std": 0.08},
}
PAIR_WEIGHT = PRESETS["easy"]["pair_weight"]
ID_EFFECT_STD = PRESETS["easy"]["id_effect_std"]
SYNTHETIC_VERSION = 5  # part of the cache key: bump when the sampled rows change
_PARAMS, _CALIBRATION = 1, 2
SPLIT_STREAMS = {"train": 10, "val": 11, "test": 12}


@dataclass(frozen=True)
class SyntheticConfig:
    """Knobs of the click model; the generated data is a pure function of them.

    Args:
        seed: seed of every random draw (parameters and rows).
        cardinality_scale: Criteo-Kaggle cardinalities are multiplied by this (at least
            ``min_cardinality`` ids per field, plus the reserved id 0).
        min_cardinality: floor of every field's number of ids (Criteo has fields of 3 and 4
            values; a floor above a cache's size keeps every table larger than its cache).
        latent_dim: dimension ``k`` of user and item latent vectors.
        n_user_clusters: Gaussian-mixture components of the user latent ``u``.
        n_item_clusters: latent clusters of ids per field (fewer if a field has fewer ids).
        temperature: softmax temperature of the cluster choice (lower = ids tell more
            about ``u``).
        user_noise: norm of the within-cluster part of ``u`` (invisible in the ids).
        base_ctr: target mean click probability.
        preset: ``"easy"`` or ``"hard"``: default weights of the logit's parts
            (:data:`PRESETS`).
        cluster_weight: norm of the click direction ``w`` applied to the user-cluster
            centroid (``None`` = the preset's).
        pair_weight: weight of each item-pair dot product ``<v_f1, v_f2>`` (``None`` =
            the preset's).
        id_effect_std: standard deviation of the per-id logit effects (``None`` = the
            preset's).

    """

    seed: int = 0
    cardinality_scale: float = 0.001
    min_cardinality: int = 3
    latent_dim: int = 16
    n_user_clusters: int = 32
    n_item_clusters: int = 32
    temperature: float = 0.1
    user_noise: float = 0.15
    base_ctr: float = 0.25
    preset: str = "easy"
    cluster_weight: float | None = None
    pair_weight: float | None = None
    id_effect_std: float | None = None

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(
                f"SyntheticConfig.preset must be one of {tuple(PRESETS)}, got {self.preset!r}"
            )
        checks = {
            "cardinality_scale": (self.cardinality_scale, 1e-9, 1.0),
            "min_cardinality": (self.min_cardinality, 1, 10**8),
            "latent_dim": (self.latent_dim, 2, 256),
            "n_user_clusters": (self.n_user_clusters, 1, 4096),
            "n_item_clusters": (self.n_item_clusters, 1, 4096),
            "temperature": (self.temperature, 1e-3, 100.0),
            "user_noise": (self.user_noise, 0.0, 10.0),
            "base_ctr": (self.base_ctr, 0.01, 0.99),
            **{key: (value, 0.0, 100.0) for key, value in self.difficulty().items()},
        }
        for key, (value, lo, hi) in checks.items():
            if not lo <= value <= hi:
                raise ValueError(f"SyntheticConfig.{key} must be in [{lo}, {hi}], got {value}")

    def difficulty(self) -> dict[str, float]:
        """The logit weights in force: the preset's, overridden by any field set."""
        given = {key: getattr(self, key) for key in PRESETS[self.preset]}
        return {key: PRESETS[self.preset][key] if value is None else float(value)
                for key, value in given.items()}  # fmt: skip

    def to_dict(self) -> dict[str, float | int]:
        """JSON-able form, stored in the schema metadata to rebuild the click model."""
        return asdict(self)


@dataclass(frozen=True)
class SyntheticRows:
    """A block of generated rows (``N`` rows, ``F = 26`` fields, 13 dense columns).

    Args:
        dense: ``int64[N, 13]`` non-negative counts (0 where missing).
        dense_missing: ``bool[N, 13]`` which counts are missing.
        sparse: ``int32[N, F]`` ids in ``0..cardinality-1`` (0 = missing).
        prob: ``float32[N]`` true click probability.
        label: ``float32[N]`` click sampled from ``prob``.
        user_cluster: ``int64[N]`` mixture component of each row's ``u``.

    """

    dense: np.ndarray
    dense_missing: np.ndarray
    sparse: np.ndarray
    prob: np.ndarray
    label: np.ndarray
    user_cluster: np.ndarray


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def cardinalities(scale: float, minimum: int = 3) -> list[int]:
    """Per-field cardinality (including id 0) for a ``cardinality_scale`` and id floor."""
    return [max(minimum, round(c * scale)) + 1 for c in CRITEO_KAGGLE_CARDINALITIES]


class SyntheticClickModel:
    """Draws rows of the model described in the module docstring.

    Args:
        config: the click model's knobs (seed included).

    Example:
        >>> gen = SyntheticClickModel(SyntheticConfig(seed=1))
        >>> rows = gen.rows("train", 0, 1000)
        >>> rows.sparse.shape, gen.item_latents("C3").shape[1]
        ((1000, 26), 16)

    """

    def __init__(self, config: SyntheticConfig) -> None:
        self.config = config
        self.weights = config.difficulty()
        self.cardinalities = cardinalities(config.cardinality_scale, config.min_cardinality)
        k, n_users = config.latent_dim, config.n_user_clusters
        rng = np.random.default_rng([config.seed, _PARAMS])
        self.user_centroids = _unit(rng.standard_normal((n_users, k)))
        weights = 1.0 / np.sqrt(np.arange(1, n_users + 1))
        self.user_weights = rng.permutation(weights / weights.sum())
        self.click_w = _unit(rng.standard_normal(k)) * self.weights["cluster_weight"]
        self.dense_w = _unit(rng.standard_normal((len(DENSE_MEANS), k)))
        self.dense_beta = rng.normal(0.0, 0.05, len(DENSE_MEANS))
        self._fields = [self._field_params(f) for f in range(len(self.cardinalities))]
        self.bias = 0.0
        self.bias = self._calibrate()

    def _field_params(self, f: int) -> dict[str, np.ndarray]:
        cfg = self.config
        rng = np.random.default_rng([cfg.seed, _PARAMS, 100 + f])
        n_ids = self.cardinalities[f] - 1
        n_clusters = min(cfg.n_item_clusters, n_ids)
        centroids = _unit(rng.standard_normal((n_clusters, cfg.latent_dim)))
        if f in NOISE_FIELDS:
            pop = 1.0 / np.arange(1, n_clusters + 1)
            table = np.tile(pop / pop.sum(), (cfg.n_user_clusters, 1))
        else:
            logits = self.user_centroids @ centroids.T / cfg.temperature
            table = np.exp(logits - logits.max(1, keepdims=True))
            table /= table.sum(1, keepdims=True)
        per_cluster = -(-n_ids // n_clusters)
        zipf = 1.0 / np.arange(1, per_cluster + 1) ** 1.1
        latents = np.zeros((n_ids + 1, cfg.latent_dim), np.float32)
        cluster_of = (np.arange(n_ids)) % n_clusters
        noise = rng.standard_normal((n_ids, cfg.latent_dim)) * 0.1 / np.sqrt(cfg.latent_dim)
        latents[1:] = centroids[cluster_of] + noise
        effects = np.concatenate([[0.0], rng.normal(0.0, self.weights["id_effect_std"], n_ids)])
        # Cumulative tables shifted by row index make one searchsorted sample all rows.
        cdf = np.cumsum(table, 1)
        cdf[:, -1] = 1.0
        return {
            "cdf": (cdf + np.arange(cfg.n_user_clusters)[:, None]).ravel(),
            "zipf_cdf": np.cumsum(zipf) / zipf.sum(),
            "n_clusters": np.array(n_clusters),
            "latents": latents,
            "effects": effects.astype(np.float32),
            "missing": np.array(FIELD_MISSING.get(f, 0.0)),
        }

    def item_latents(self, field: str | int) -> np.ndarray:
        """Return the true latent of each id of ``field``: ``float32[cardinality, k]``."""
        f = int(field[1:]) - 1 if isinstance(field, str) else int(field)
        if not 0 <= f < len(self._fields):
            raise ValueError(f"field must be C1..C{len(self._fields)} or 0..25, got {field!r}")
        return self._fields[f]["latents"].copy()

    def item_clusters(self, field: str | int) -> np.ndarray:
        """Latent cluster of every id of ``field``: ``int64[cardinality]`` (-1 for id 0)."""
        f = int(field[1:]) - 1 if isinstance(field, str) else int(field)
        n_ids, k = self.cardinalities[f] - 1, int(self._fields[f]["n_clusters"])
        return np.concatenate([[-1], np.arange(n_ids) % k])

    def latent_truth(self, field: str) -> tuple[np.ndarray, np.ndarray]:
        """``(item_latents(field), item_clusters(field))``: what evaluation compares to."""
        return self.item_latents(field), self.item_clusters(field)

    def _sample_ids(self, rng: np.random.Generator, c: np.ndarray) -> np.ndarray:
        n = c.size
        sparse = np.empty((n, len(self._fields)), np.int32)
        for f, p in enumerate(self._fields):
            k = int(p["n_clusters"])
            n_ids = self.cardinalities[f] - 1
            j = np.searchsorted(p["cdf"], rng.random(n) + c) - c * k
            j = np.minimum(j, k - 1)
            size_j = (n_ids - j + k - 1) // k
            m = np.minimum(np.searchsorted(p["zipf_cdf"], rng.random(n)), size_j - 1)
            ids = 1 + j + m * k
            ids[rng.random(n) < p["missing"]] = 0
            sparse[:, f] = ids
        return sparse

    def _logit(
        self,
        u: np.ndarray,
        sparse: np.ndarray,
        log_dense: np.ndarray,
        parts: dict[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """Click logit ``float64[N]``; ``parts`` (if given) receives each term's share."""
        cluster, dense = u @ self.click_w, log_dense @ self.dense_beta
        z = self.bias + cluster + dense
        pair, ids = np.zeros_like(z), np.zeros_like(z)
        for f1, f2 in PAIRS:
            v1 = self._fields[f1]["latents"][sparse[:, f1]]
            v2 = self._fields[f2]["latents"][sparse[:, f2]]
            term = self.weights["pair_weight"] * np.einsum("nk,nk->n", v1, v2)
            z += term
            pair += term
        for f, p in enumerate(self._fields):
            z += p["effects"][sparse[:, f]]
            ids += p["effects"][sparse[:, f]]
        if parts is not None:
            parts.update(cluster=cluster, pair=pair, id_effects=ids, dense=dense)
        return z

    def _draw(
        self, rng: np.random.Generator, n: int, parts: dict[str, np.ndarray] | None = None
    ) -> SyntheticRows:
        cfg = self.config
        c = rng.choice(cfg.n_user_clusters, size=n, p=self.user_weights)
        noise = rng.standard_normal((n, cfg.latent_dim)) * cfg.user_noise
        u = self.user_centroids[c] + noise / np.sqrt(cfg.latent_dim)
        sparse = self._sample_ids(rng, c)
        rate = np.array(DENSE_MEANS) * np.exp(u @ self.dense_w.T - 0.5)
        dense = rng.poisson(rate)
        missing = rng.random(dense.shape) < np.array(DENSE_MISSING)
        dense[missing] = 0
        # Clicks follow the cluster centroid, not u's within-cluster noise: the noise is
        # seen only dimly through dense counts, so a click model using it would make the
        # recorded probability unreachable from the features (no longer Bayes-optimal).
        logit = self._logit(self.user_centroids[c], sparse, np.log1p(dense), parts)
        prob = (1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        label = (rng.random(n) < prob).astype(np.float32)
        return SyntheticRows(dense, missing, sparse, prob, label, c)

    def _calibrate(self) -> float:
        """Bias ``b`` such that the mean click probability is ``base_ctr`` (bisection)."""
        rows = self._draw(np.random.default_rng([self.config.seed, _CALIBRATION]), 50_000)
        logit0 = np.log(rows.prob) - np.log1p(-rows.prob.astype(np.float64))
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if np.mean(1.0 / (1.0 + np.exp(-(logit0 + mid)))) < self.config.base_ctr:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    def logit_variance(self, n: int = 50_000) -> dict[str, Any]:
        """Where the click logit's variance comes from, over ``n`` rows of a fixed stream.

        Returns:
            ``total``: variance of the logit. ``shares``: ``Cov(term, logit) / total`` of
            each term (``cluster``: ``<w, mu[c]>``; ``pair``: the item-pair dot products;
            ``id_effects``; ``dense``); they sum to 1 exactly, correlated terms splitting
            their covariance. ``variance``: each term's own variance. ``user_cluster_r2``:
            the fraction of the logit's variance explained by the user cluster alone
            (what unlabeled co-occurrence can reveal).

        """
        parts: dict[str, np.ndarray] = {}
        rows = self._draw(np.random.default_rng([self.config.seed, _CALIBRATION]), n, parts)
        z = sum(parts.values())
        centred = z - z.mean()
        total = float(centred @ centred / n)
        shares = {k: float((v - v.mean()) @ centred / n / total) for k, v in parts.items()}
        counts = np.bincount(rows.user_cluster, minlength=self.config.n_user_clusters)
        sums = np.bincount(rows.user_cluster, weights=z, minlength=counts.size)
        means = sums / np.maximum(counts, 1)
        between = float(np.var(means[rows.user_cluster]))
        return {
            "total": total,
            "shares": shares,
            "variance": {k: float(np.var(v)) for k, v in parts.items()},
            "user_cluster_r2": between / total,
        }

    def rows(self, split: str, chunk: int, n: int) -> SyntheticRows:
        """Rows of chunk number ``chunk`` of ``split`` (``"train" | "val" | "test"``).

        Each (split, chunk) has its own random stream, so any chunk can be drawn alone.
        """
        if split not in SPLIT_STREAMS:
            raise ValueError(f"split must be one of {tuple(SPLIT_STREAMS)}, got {split!r}")
        return self._draw(np.random.default_rng([self.config.seed, SPLIT_STREAMS[split], chunk]), n)


def render_ids(field: int, ids: np.ndarray) -> np.ndarray:
    """Criteo-style 8-hex-digit raw value of each id (a bijection per field).

    Args:
        field: field index ``0..F-1``.
        ids: ``int[N]`` ids ``>= 1`` (id 0 is rendered by the caller as missing).

    Returns:
        ``bytes (S8)[N]`` such as ``b"05db9164"``.

    """
    with np.errstate(over="ignore"):
        h = ids.astype(np.uint64) * np.uint64(2654435761) + np.uint64(0x5BD1E995 * (field + 1))
        h = (h & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    shifts = np.arange(28, -4, -4, dtype=np.uint32)
    nibbles = (h[:, None] >> shifts) & np.uint32(0xF)
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)[nibbles]
    return np.ascontiguousarray(digits).view("S8").ravel()
