"""The two DLRMs ``end_to_end.py`` trains side by side, their training steps and phase timers.

Both models are the shipped Criteo DLRM (``configs/ctr/criteo.yaml``): bottom MLP
13 -> 512 -> 256 -> 64, the pairwise dot interaction of the 27 vectors with the dense one
kept beside it (415 features), top MLP 415 -> 512 -> 256, then a linear click unit; 26
tables of ``D = 64`` trained by row-wise Adagrad fused into backward, the dense part by Adam.

- The library's model is a :class:`ssl_rec.lightning.CTRModule` (what ``ssl-rec fit`` trains):
  its forward, ``binary_cross_entropy_with_logits``, ``loss.backward()`` (the tables update
  themselves in it) and ``Adam.step()``. No Trainer: its per-step overhead (logging, hooks)
  is the same whatever the model and is left out of both sides.
- TorchRec's is ``torchrec.models.dlrm.DLRM`` over a ``FusedEmbeddingBagCollection`` (FBGEMM's
  table-batched embeddings with ``EXACT_ROWWISE_ADAGRAD`` fused into backward; no
  ``torchrec.distributed``), the same dense sizes and Adam; its input is a
  ``KeyedJaggedTensor`` built from the same ids each step (its data phase).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks._embedding_cases import OURS, make_ids
from ssl_rec.types import Batch

DIM = 64
N_DENSE = 13
BOTTOM = [512, 256]  # + the D-wide output layer (configs/ctr/criteo.yaml)
TOP = [512, 256]  # + the click unit
TABLE_LR = 0.05
DENSE_LR = 1e-3
EPS = 1e-8  # TableSpec's default row-wise Adagrad epsilon, given to FBGEMM too
FORMATS = ("fp32", "int8_cache5", "int4_cache1")
PHASES = (
    "data",
    "tables_forward",
    "bottom_mlp_forward",
    "interaction_forward",
    "top_mlp_loss_forward",
    "dense_backward",
    "table_update",
    "optimizer",
)


@dataclass
class RawBatch:
    """The rows both libraries start from: ``dense float32[B, 13]``, ``ids int64[B, 26]``,
    ``label float32[B]``."""

    dense: torch.Tensor
    ids: torch.Tensor
    label: torch.Tensor


def make_raw(cards: list[int], batch: int, seed: int) -> RawBatch:
    """Criteo-like rows: Zipf(1.1) ids hashed over each table, log1p-like dense values."""
    rng = np.random.default_rng(1000 + seed)
    dense = torch.from_numpy(np.log1p(rng.exponential(3.0, (batch, N_DENSE))).astype(np.float32))
    label = torch.from_numpy((rng.random(batch) < 0.25).astype(np.float32))
    return RawBatch(dense, make_ids(cards, batch, seed, "criteo"), label)


def backbone_config(fmt: str) -> dict:
    """The ``class_path`` form of the Criteo backbone with tables in ``fmt``."""
    spec = OURS[fmt]("rowwise_adagrad")
    tables = {"precision": spec.precision.value, "optimizer": "rowwise_adagrad",
              "learning_rate": TABLE_LR}  # fmt: skip
    if spec.cached:
        tables["cache_fraction"] = spec.cache_fraction
    return {
        "class_path": "ssl_rec.models.Backbone",
        "init_args": {
            "embedding_dim": DIM,
            "tables": tables,
            "encoder": {
                "class_path": "ssl_rec.models.DLRMEncoder",
                "init_args": {"bottom": list(BOTTOM), "top": list(TOP)},
            },
        },
    }


def schema_dict(cards: list[int]) -> dict:
    """The feature schema of the benchmark's rows (``I1..I13``, ``C1..C26``)."""
    from ssl_rec.schema import CategoricalField, FeatureSchema

    fields = [CategoricalField(f"C{i + 1}", c) for i, c in enumerate(cards)]
    return FeatureSchema([f"I{i + 1}" for i in range(N_DENSE)], fields, "label").to_dict()


class LibraryDLRM:
    """A :class:`CTRModule` with its Adam, stepped as ``ssl-rec fit`` steps it."""

    def __init__(self, cards: list[int], fmt: str) -> None:
        from ssl_rec.lightning import CTRModule

        torch.manual_seed(0)
        self.module = CTRModule(backbone_config(fmt), schema_dict(cards), learning_rate=DENSE_LR)
        self.module.train()
        self.optimizer = self.module.configure_optimizers()

    def step(self, raw: RawBatch) -> float:
        """One training step; the loss."""
        batch = Batch(raw.dense, raw.ids, raw.label)
        loss = F.binary_cross_entropy_with_logits(self.module(batch), batch.label)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def phases(self, raw: RawBatch, clock: Callable[[], float]) -> dict[str, float]:
        """One step split into :data:`PHASES` (seconds of ``clock``); the table output is
        detached so its update (the tables' fused backward) is timed on its own."""
        backbone, head = self.module.backbone, self.module.head
        enc = backbone.encoder
        marks = [clock()]
        batch = Batch(raw.dense, raw.ids, raw.label)
        marks.append(clock())
        field_emb = backbone.embed(batch.sparse)
        marks.append(clock())
        tokens = field_emb.detach().requires_grad_()
        dense_emb = enc.bottom(batch.dense)
        marks.append(clock())
        pairs = enc.interaction(torch.cat([dense_emb.unsqueeze(1), tokens], dim=1))
        marks.append(clock())
        logits = head(enc.top(torch.cat([dense_emb, pairs], dim=1)))
        loss = F.binary_cross_entropy_with_logits(logits, batch.label)
        marks.append(clock())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        marks.append(clock())
        field_emb.backward(tokens.grad)
        marks.append(clock())
        self.optimizer.step()
        marks.append(clock())
        return dict(zip(PHASES, np.diff(marks).tolist(), strict=True))

    def eval_lookup(self, raw: RawBatch) -> None:
        """The validation lookup of the tables alone (eval mode, no grad)."""
        tables = self.module.backbone.embedding.tables
        tables.eval()
        with torch.no_grad():
            tables(raw.ids)
        tables.train()


class TorchRecDLRM:
    """``torchrec.models.dlrm.DLRM`` with FBGEMM's fused row-wise Adagrad tables and Adam."""

    def __init__(self, cards: list[int]) -> None:
        import torchrec.optim as trec_optim
        from torchrec.models.dlrm import DLRM
        from torchrec.modules.embedding_configs import EmbeddingBagConfig
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

        torch.manual_seed(0)
        self.keys = [f"C{i + 1}" for i in range(len(cards))]
        tables = [
            EmbeddingBagConfig(
                name=f"t_{k}", embedding_dim=DIM, num_embeddings=c, feature_names=[k]
            )  # fmt: skip
            for k, c in zip(self.keys, cards, strict=True)
        ]
        ebc = FusedEmbeddingBagCollection(
            tables=tables,
            optimizer_type=trec_optim.RowWiseAdagrad,
            optimizer_kwargs={"lr": TABLE_LR, "eps": EPS},
        )
        self.model = DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=N_DENSE,
            dense_arch_layer_sizes=[*BOTTOM, DIM],
            over_arch_layer_sizes=[*TOP, 1],
        ).train()
        dense = [p for n, p in self.model.named_parameters() if not n.startswith("sparse_arch")]
        self.optimizer = torch.optim.Adam(dense, lr=DENSE_LR)
        self._kjt = KeyedJaggedTensor
        self._lengths: torch.Tensor | None = None

    def features(self, ids: torch.Tensor):  # noqa: ANN201 - a KeyedJaggedTensor
        """The ``KeyedJaggedTensor`` of ``ids int64[B, F]`` (one id per feature and sample)."""
        values = ids.t().contiguous().view(-1)
        if self._lengths is None or self._lengths.numel() != values.numel():
            self._lengths = torch.ones(values.numel(), dtype=torch.int32)
        return self._kjt(keys=self.keys, values=values, lengths=self._lengths)

    def step(self, raw: RawBatch) -> float:
        """One training step; the loss."""
        features = self.features(raw.ids)
        logits = self.model(raw.dense, features).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, raw.label)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def phases(self, raw: RawBatch, clock: Callable[[], float]) -> dict[str, float]:
        """As :meth:`LibraryDLRM.phases`."""
        m = self.model
        marks = [clock()]
        features = self.features(raw.ids)
        marks.append(clock())
        sparse = m.sparse_arch(features)
        marks.append(clock())
        tokens = sparse.detach().requires_grad_()
        dense = m.dense_arch(raw.dense)
        marks.append(clock())
        joined = m.inter_arch(dense, tokens)
        marks.append(clock())
        loss = F.binary_cross_entropy_with_logits(m.over_arch(joined).squeeze(-1), raw.label)
        marks.append(clock())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        marks.append(clock())
        sparse.backward(tokens.grad)
        marks.append(clock())
        self.optimizer.step()
        marks.append(clock())
        return dict(zip(PHASES, np.diff(marks).tolist(), strict=True))


def phase_breakdown(
    models: dict[str, LibraryDLRM | TorchRecDLRM], batches: list[RawBatch], passes: int
) -> dict[str, dict[str, float]]:
    """Median milliseconds of each phase per model; the models take turns batch by batch.

    Wall-clock time (``perf_counter``): with two threads the phases' parallel regions are
    timed as they run. ``total`` is the median of the per-step sums.
    """
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    for p in range(passes):
        for i, raw in enumerate(batches):
            for name, model in models.items():
                seconds = model.phases(raw, time.perf_counter)
                if p or i:  # the first step of the first pass warms the detached path up
                    runs[name].append(seconds)
    out = {}
    for name, measured in runs.items():
        ms = {k: 1e3 * float(np.median([m[k] for m in measured])) for k in PHASES}
        ms["total"] = 1e3 * float(np.median([sum(m.values()) for m in measured]))
        out[name] = ms
    return out
