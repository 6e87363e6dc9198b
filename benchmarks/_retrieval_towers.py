"""The library's two-tower variants on the retrieval split: build, train, score every epoch.

A variant is a :class:`TowerConfig`; :func:`tower_runs` trains it with the library's
``RetrievalModule`` (its ``training_step`` and optimizers, a plain loop without a Trainer:
on 105 steps an epoch the Trainer's hooks would cost more than the steps), scores the whole
catalogue for the validation and test users after every epoch and keeps the epoch of best
validation recall@10 (its test figures are read, never used to choose).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np
import torch

from benchmarks._retrieval_peers import RetrievalSplit, split_metrics
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import RetrievalModule
from ssl_rec.models import TowerEncoder, TwoTowerModel
from ssl_rec.objectives import ComplementaryInfoNCE, InfoNCE, SampledSoftmax
from ssl_rec.types import Batch

QUERY_FIELDS = ["user_id", "gender", "occupation", "age_decade", "zip3", "age"]
ITEM_FIELDS = ["movie_id", "genres", "release_year"]
RICH_ITEM_FIELDS = [*ITEM_FIELDS, "genre_1", "genre_2", "genre_3", "release_decade"]


@dataclass(frozen=True)
class TowerConfig:
    """One two-tower variant (``precision``: ``fp32`` or ``int8`` with a 5% FP32 cache).

    The item-side self-supervision (on when ``ssl_weight > 0``): ``ssl_views`` is
    ``complementary`` (:class:`ComplementaryInfoNCE`: the two views mask complementary
    field sets, no projection head, Yao et al. 2021) or ``independent`` (:class:`InfoNCE`:
    two independent correlated-feature masks and a projection head); ``ssl_items`` and
    ``ssl_batch_size`` are ``RetrievalModule``'s (which items it sees);
    ``item_pretrain_epochs`` first epochs train the item tower alone with the self-supervision
    on uniformly drawn catalogue items (``RetrievalModule.item_pretraining_step``), within
    ``epochs``. ``item_fields``:
    ``basic`` (movie, genre set, year) or ``rich`` (plus the first three genres one by one and
    the decade).
    """

    embedding_dim: int = 32
    hidden: tuple[int, ...] = (64,)
    output_dim: int = 32
    temperature: float = 0.1
    uniform_negatives: int = 1024
    log_q: str = "counts"
    epochs: int = 20
    learning_rate: float = 3e-3
    table_learning_rate: float = 0.05
    precision: str = "fp32"
    ssl_weight: float = 0.0
    ssl_temperature: float = 0.2
    ssl_views: str = "complementary"
    ssl_items: str = "uniform"
    ssl_batch_size: int = 0
    item_pretrain_epochs: int = 0
    item_fields: str = "rich"
    batch_size: int = 512
    notes: dict = field(default_factory=dict, compare=False)

    def label(self) -> str:
        """A short, unique description of the variant."""
        parts = {k: v for k, v in asdict(self).items() if k != "notes"}
        return ",".join(f"{k}={v}" for k, v in parts.items())


def build(config: TowerConfig, dm, seed: int) -> RetrievalModule:
    """A ``RetrievalModule`` of ``config`` on ``dm``'s schema, catalogue and history."""
    torch.manual_seed(seed)
    cache = {"cache_fraction": 0.05} if config.precision != "fp32" else {}
    tables = TableSpec(precision=config.precision, optimizer="rowwise_adagrad",
                       learning_rate=config.table_learning_rate, **cache)  # fmt: skip

    encoder = partial(TowerEncoder, hidden=list(config.hidden), output_dim=config.output_dim)
    items = RICH_ITEM_FIELDS if config.item_fields == "rich" else ITEM_FIELDS
    towers = partial(TwoTowerModel, query_fields=QUERY_FIELDS, item_fields=items,
                     embedding_dim=config.embedding_dim, tables=tables, query_encoder=encoder,
                     item_encoder=encoder, seed=seed)  # fmt: skip
    objectives = {}
    if config.ssl_weight > 0 and config.ssl_views == "complementary":
        objectives = {"cfm": ComplementaryInfoNCE(temperature=config.ssl_temperature, seed=seed)}
    elif config.ssl_weight > 0:
        objectives = {"cfm": InfoNCE(projection_dim=config.output_dim, hidden=64,
                                     temperature=config.ssl_temperature)}  # fmt: skip
    module = RetrievalModule(
        towers, dm.schema.to_dict(), loss=SampledSoftmax(temperature=config.temperature),
        uniform_negatives=config.uniform_negatives, log_q=config.log_q, item_objectives=objectives,
        item_weights={"cfm": config.ssl_weight} if objectives else None,
        learning_rate=config.learning_rate, ssl_items=config.ssl_items,
        ssl_batch_size=config.ssl_batch_size, ssl_seed=seed,
    )  # fmt: skip
    module.use_data(dm)
    return module


@torch.no_grad()
def catalogue_scores(module: RetrievalModule, rows: Batch) -> np.ndarray:
    """``float32[U, N]`` inner products of ``rows``' queries with every catalogue item."""
    module.eval()
    try:
        items = module.towers.encode_items(module.catalogue.items)
        return (module(rows) @ items.T).float().numpy()
    finally:
        module.train()


def tower_runs(config: TowerConfig, dm, split: RetrievalSplit, seed: int) -> dict:
    """Train ``config`` with ``seed``; the figures of its best validation epoch.

    Returns:
        ``{"val": metrics, "test": metrics, "epoch": best epoch (1-based)}``.

    """
    warnings.filterwarnings("ignore", ".*self.log.*")
    warnings.filterwarnings("ignore", ".*self.trainer.*")
    module = build(config, dm, seed)
    optimizer = module.configure_optimizers()
    dm.batch_size, dm.seed = config.batch_size, seed
    val_rows, test_rows = dm.rows("val"), dm.rows("test")
    best = {"val": {"recall_at_10": -1.0}}
    module.train()
    for epoch in range(1, config.epochs + 1):
        dm.seed = seed * 1000 + epoch  # a new shuffle every epoch
        pretraining = epoch <= config.item_pretrain_epochs
        for step, batch in enumerate(dm.train_dataloader()):
            loss = module.item_pretraining_step(batch) if pretraining else \
                module.training_step(batch, step)  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        val = split_metrics(catalogue_scores(module, val_rows), split, "val")
        if val["recall_at_10"] > best["val"]["recall_at_10"]:
            test = split_metrics(catalogue_scores(module, test_rows), split, "test")
            best = {"val": val, "test": test, "epoch": epoch}
    return best
