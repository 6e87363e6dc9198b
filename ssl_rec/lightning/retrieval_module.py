"""RetrievalModule: two towers trained by sampled softmax, with item-side self-supervision."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from torch import nn

from ssl_rec._checks import check_at_least, check_choice, check_nonnegative, check_positive
from ssl_rec.evaluation.item_catalogue import ItemCatalogue
from ssl_rec.evaluation.retrieval_export import export_retrieval
from ssl_rec.evaluation.retrieval_metrics import tail_items
from ssl_rec.lightning.module_config import build_objectives, instantiate_config, module_hparams
from ssl_rec.lightning.objective_set import (
    check_objectives,
    log_objective,
    weighted_objective_loss,
)
from ssl_rec.lightning.ssl_item_sampler import SslItems, SslItemSampler
from ssl_rec.models.backbone import as_schema
from ssl_rec.models.two_tower import TwoTowerModel
from ssl_rec.objectives.base import Objective
from ssl_rec.objectives.item_frequency import StreamingItemFrequency, counts_log_q
from ssl_rec.objectives.sampled_softmax import SampledSoftmax, mixed_log_q
from ssl_rec.types import Batch
from ssl_rec.vocab import Vocabularies

TowersFactory = Callable[[dict], TwoTowerModel]
VOCABULARY_KEY, SCALING_KEY = "vocabulary", "dense_scaling"
LogQSource = Literal["streaming", "counts", "none"]


class RetrievalModule(pl.LightningModule):
    """Candidate retrieval: ``loss = softmax(batch) + sum_i weight_i * item_objective_i``.

    Each training batch holds one positive ``(query, item)`` pair per row. The loss is
    :class:`~ssl_rec.objectives.SampledSoftmax` over the batch's items (plus
    ``uniform_negatives`` items drawn from the catalogue when one is set), corrected by the
    log of each item's sampling rate (streamed from the batches, or from training counts
    given to :meth:`use_item_counts`). Item objectives are ordinary
    :mod:`ssl_rec.objectives` applied to the item tower, which is a ``Backbone``, on the items
    ``ssl_items`` picks: e.g. ``ComplementaryInfoNCE`` on items drawn uniformly from the
    catalogue, as in Yao et al., "Self-supervised Learning for Large-scale Item
    Recommendations", CIKM 2021.

    A data module that offers ``catalogue()`` (full-schema rows, one per item),
    ``history()`` and ``train_positives()`` (``int64[P, 2]`` user and item ids) gives the
    catalogue at ``setup``, its tail being the 80% least popular items of
    ``train_positives()``. Validation logs the softmax loss and, once there is a catalogue,
    ``val/recall@k`` and ``val/ndcg@k`` of each validation row's held-out item ranked
    against the whole catalogue, the user's training items excluded (the user is the
    query tower's ``user_field``).

    Args:
        towers: factory ``schema_dict -> TwoTowerModel`` or its ``class_path`` dict.
        schema: the data's feature schema dict; the CLI links it from ``data.schema``.
        loss: the sampled softmax (default temperature 0.05, log-Q on).
        log_q: ``streaming`` estimates item sampling rates online; ``counts`` takes them from
            the data module's ``train_positives()`` (or :meth:`use_item_counts`); ``none``
            skips the correction.
        uniform_negatives: catalogue items drawn uniformly per batch as extra negatives.
        item_objectives: name -> objective on the item tower (instances or class_path dicts).
        item_weights: name -> weight of each item objective (default 1).
        ssl_items: which items the item objectives see: ``batch`` (the training batch's,
            popularity-skewed), ``uniform`` (drawn uniformly from the catalogue, as in Yao et
            al. 2021, which reaches the tail) or ``mixed`` (half each); see
            :class:`~ssl_rec.lightning.ssl_item_sampler.SslItemSampler`. ``uniform`` and
            ``mixed`` need a catalogue.
        ssl_batch_size: items per step for the item objectives (0: the training batch's size).
        ssl_seed: seed of the ``uniform``/``mixed`` draws.
        item_pretrain_epochs: first epochs that train the item tower alone, with the item
            objectives on catalogue items drawn uniformly (``ssl_batch_size`` per step, else
            the training batch's size) and no interaction: pretraining without interactions.
            The sampled softmax starts after them. Needs item objectives and a catalogue.
        user_field: the query tower's categorical column that identifies a user (default its
            first one), for seen-item exclusion.
        k: cut-off of the validation metrics.
        learning_rate: Adam learning rate of the dense parameters (> 0).
        weight_decay: Adam weight decay (>= 0).

    """

    def __init__(
        self,
        towers: TowersFactory,
        schema: dict | None = None,
        loss: SampledSoftmax | None = None,
        log_q: LogQSource = "streaming",
        uniform_negatives: int = 0,
        item_objectives: dict[str, Objective] | None = None,
        item_weights: dict[str, float] | None = None,
        ssl_items: SslItems = "batch",
        ssl_batch_size: int = 0,
        ssl_seed: int = 0,
        item_pretrain_epochs: int = 0,
        user_field: str | None = None,
        k: int = 10,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        if schema is None:
            raise ValueError("RetrievalModule needs `schema` (the CLI links it from data.schema)")
        owner = "RetrievalModule"
        check_choice(owner, "log_q", log_q, ("streaming", "counts", "none"))
        check_at_least(owner, "uniform_negatives", uniform_negatives, 0)
        check_at_least(owner, "k", k)
        check_positive(owner, "learning_rate", learning_rate)
        check_nonnegative(owner, "weight_decay", weight_decay)
        check_at_least(owner, "item_pretrain_epochs", item_pretrain_epochs, 0)
        if item_pretrain_epochs and not item_objectives:
            raise ValueError(
                f"{owner}.item_pretrain_epochs={item_pretrain_epochs} needs item_objectives "
                "(the pretraining trains the item tower with them)"
            )
        factory = (instantiate_config(towers, TowersFactory, f"{owner}.towers")
                   if isinstance(towers, Mapping) else towers)  # fmt: skip
        objectives = build_objectives(item_objectives or {}, owner)
        self.item_weights = check_objectives(
            objectives, item_weights, owner, "item_weights", required=False
        )
        schema = as_schema(schema).to_dict()
        if isinstance(loss, Mapping):  # as the checkpoint's hyperparameters record it
            loss = instantiate_config(loss, SampledSoftmax, f"{owner}.loss")
        loss = loss if loss is not None else SampledSoftmax()
        self.save_hyperparameters(module_hparams(
            self, towers=towers, schema=schema, loss=loss, log_q=log_q,
            uniform_negatives=uniform_negatives, item_objectives=objectives,
            item_weights=item_weights, ssl_items=ssl_items, ssl_batch_size=ssl_batch_size,
            ssl_seed=ssl_seed, item_pretrain_epochs=item_pretrain_epochs,
            user_field=user_field, k=k,
            learning_rate=learning_rate, weight_decay=weight_decay,
        ))  # fmt: skip
        self.towers = factory(schema)
        self.schema = self.towers.schema
        self.loss = loss
        self.item_objectives = nn.ModuleDict(objectives)
        self.ssl_sampler = SslItemSampler(ssl_items, ssl_batch_size, ssl_seed)
        for objective in self.item_objectives.values():
            objective.setup(self.towers.item_tower)
        items = self.towers.schema.field(self.towers.item_id_field).cardinality
        streaming = log_q == "streaming"
        self.frequency = StreamingItemFrequency(buckets=items) if streaming else None
        self._counts_log_q: torch.Tensor | None = None
        query_fields = self.towers.query_schema.field_names
        self.user_field = query_fields[0] if user_field is None else user_field
        if self.user_field not in query_fields:
            raise ValueError(
                f"RetrievalModule.user_field={self.user_field!r} is not a categorical column "
                f"of the query tower {query_fields}"
            )
        self.catalogue: ItemCatalogue | None = None
        self.vocabulary: Vocabularies | None = None
        self.dense_scaling: dict[str, tuple[float, float]] = {}
        self._item_vectors: torch.Tensor | None = None
        self._val_sums: dict[str, float] = {}

    def use_item_counts(self, counts: torch.Tensor, batch_size: int) -> None:
        """Take the log-Q correction from training counts ``int64[N_ids]`` instead."""
        self._counts_log_q = counts_log_q(counts, batch_size)

    def set_catalogue(self, catalogue: ItemCatalogue) -> None:
        """Items to draw uniform negatives from and to rank in validation."""
        self.catalogue = catalogue

    def setup(self, stage: str) -> None:
        """Take the catalogue (and, for ``log_q: counts``, item counts) from the data module.

        Also its ``vocabulary`` and ``dense_scaling`` where it has them (they travel in the
        checkpoint and the export, so a served model takes raw values).
        """
        self.use_data(getattr(self.trainer, "datamodule", None))

    def use_data(self, data: Any) -> None:
        """:meth:`setup` from a data module given directly (e.g. to export a checkpoint)."""
        self.use_data_encoding(data)
        if not callable(getattr(data, "catalogue", None)):
            if self.hparams.log_q == "counts" and self._counts_log_q is None:
                raise ValueError("RetrievalModule.log_q='counts' needs data with train_positives")
            return
        rows, positives = data.catalogue(), data.train_positives()
        ids = self.towers.item_ids(rows)
        n_ids = self.towers.schema.field(self.towers.item_id_field).cardinality
        counts = torch.bincount(positives[:, 1], minlength=n_ids)
        if self.catalogue is None:
            catalogue = ItemCatalogue(self.towers.item_batch(rows), ids, data.history(),
                                      tail_items(counts[ids], 0.8))  # fmt: skip
            self.set_catalogue(catalogue)
        if self.hparams.log_q == "counts" and self._counts_log_q is None:
            self.use_item_counts(counts, int(data.batch_size))

    def use_data_encoding(self, data: Any) -> None:
        """Adopt ``data.vocabulary`` and ``data.dense_scaling`` when the module has none.

        Raises:
            ValueError: the module has a vocabulary (from its checkpoint) and the data was
                encoded with another one.

        """
        scaling = getattr(data, "dense_scaling", None)
        if not self.dense_scaling and isinstance(scaling, Mapping):
            self.dense_scaling = {k: (float(m), float(s)) for k, (m, s) in scaling.items()}
        vocabulary = getattr(data, "vocabulary", None)
        if not isinstance(vocabulary, Vocabularies):
            return
        if self.vocabulary is None:
            vocabulary.check_schema(self.schema, "the data module's vocabulary")
            self.vocabulary = vocabulary
        elif self.vocabulary.disagreeing(vocabulary):
            bad = self.vocabulary.disagreeing(vocabulary)[:10]
            raise ValueError(
                f"the data was encoded with other vocabularies than the model's (fields {bad}): "
                "the table changed since training"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the vocabulary and dense scaling in the checkpoint (plain tensors, numbers)."""
        if self.vocabulary is not None:
            checkpoint[VOCABULARY_KEY] = self.vocabulary.to_state()
        checkpoint[SCALING_KEY] = {k: list(v) for k, v in self.dense_scaling.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore what :meth:`on_save_checkpoint` kept."""
        state = checkpoint.get(VOCABULARY_KEY)
        if state is not None:
            self.vocabulary = Vocabularies.from_state(state, "the retrieval checkpoint")
        scaling = checkpoint.get(SCALING_KEY) or {}
        self.dense_scaling = {k: (float(m), float(s)) for k, (m, s) in scaling.items()}

    def export(self, directory: str, overwrite: bool = False, index: str = "auto") -> Path:
        """Write the query tower, the catalogue's FAISS index and the vocabularies.

        See :func:`~ssl_rec.evaluation.export_retrieval`; ``index`` is a FAISS factory string
        or ``auto`` (exact up to 20k items).
        """
        if self.catalogue is None:
            raise ValueError("RetrievalModule.export needs a catalogue (set_catalogue or data)")
        cat = self.catalogue
        return export_retrieval(
            self.towers, cat.items, cat.item_ids, directory, overwrite,
            vocabulary=self.vocabulary, dense_scaling=self.dense_scaling, index=index,
        )  # fmt: skip

    def forward(self, batch: Batch) -> torch.Tensor:
        """Unit query vectors ``float32[B, H]`` of a full-schema ``batch``."""
        return self.towers.encode_queries(batch)

    def _item_log_q(self, ids: torch.Tensor) -> torch.Tensor | None:
        if self._counts_log_q is not None:
            return self._counts_log_q.to(ids.device)[ids]
        if self.frequency is not None:
            return self.frequency.log_q(ids)
        return None

    def _softmax(self, batch: Batch, stage: str) -> torch.Tensor:
        ids = self.towers.item_ids(batch)
        if stage == "train" and self.frequency is not None:
            self.frequency.update(ids)
        query, items = self.towers(batch)
        log_q = self._item_log_q(ids)
        negatives = negative_ids = negative_log_q = None
        m = int(self.hparams.uniform_negatives)
        if m and self.catalogue is not None:
            cat = self.catalogue
            rows = torch.randint(len(cat), (m,))
            negatives = self.towers.encode_items(cat.items.rows(rows).to(self.device))
            negative_ids = cat.item_ids[rows].to(self.device)
            negative_log_q = self._item_log_q(negative_ids)
            if log_q is not None and negative_log_q is not None:
                log_q = mixed_log_q(log_q, m, len(cat))
                negative_log_q = mixed_log_q(negative_log_q, m, len(cat))
        out = self.loss(query, items, ids, log_q, negatives, negative_ids, negative_log_q)
        log_objective(self, stage, "softmax", out.logs, batch.batch_size)
        return out.loss

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        """Softmax loss plus the weighted item objectives on the batch's items.

        In the first ``item_pretrain_epochs`` epochs: :meth:`item_pretraining_step`.
        """
        if self.current_epoch < self.hparams.item_pretrain_epochs:
            return self.item_pretraining_step(batch)
        total = self._softmax(batch, "train")
        if self.item_objectives:
            total = total + self._item_loss(self.ssl_item_batch(batch), batch.batch_size)
        self.log("train/loss", total, prog_bar=True, batch_size=batch.batch_size)
        return total

    def _item_loss(self, items: Batch, batch_size: int) -> torch.Tensor:
        """The weighted item objectives on item-tower rows ``items`` (each logged)."""
        return weighted_objective_loss(
            self, self.item_objectives, self.item_weights, items, self.towers.item_tower,
            "train", batch_size, noun="item objective",
        )  # fmt: skip

    def item_pretraining_step(self, batch: Batch) -> torch.Tensor:
        """The item objectives alone, on catalogue items (:meth:`pretraining_items`).

        No interaction enters: ``batch`` only sets the number of items per step when
        ``ssl_batch_size`` is 0. Raises ``ValueError`` without item objectives.
        """
        if not self.item_objectives:
            raise ValueError("RetrievalModule.item_pretraining_step needs item_objectives")
        total = self._item_loss(self.pretraining_items(batch.batch_size), batch.batch_size)
        self.log("train/loss", total, prog_bar=True, batch_size=batch.batch_size)
        return total

    def pretraining_items(self, batch_size: int) -> Batch:
        """Item-tower rows of one pretraining step: distinct catalogue items, uniformly.

        ``ssl_batch_size`` of them (else ``batch_size``), from the item sampler's generator.

        Raises:
            ValueError: there is no catalogue.

        """
        if self.catalogue is None:
            raise ValueError(
                "RetrievalModule.item_pretrain_epochs pretrains on the item catalogue: give data "
                "with catalogue() or call set_catalogue"
            )
        size = self.ssl_sampler.size or batch_size
        rows = self.ssl_sampler.uniform_rows(len(self.catalogue), size)
        return self.catalogue.items.rows(rows).to(self.device)

    def ssl_item_batch(self, batch: Batch) -> Batch:
        """The item-tower rows the item objectives see this step (:class:`SslItemSampler`).

        Raises:
            ValueError: ``ssl_items`` is ``uniform`` or ``mixed`` and there is no catalogue.

        """
        items = self.towers.item_batch(batch)
        if self.ssl_sampler.source != "batch" and self.catalogue is None:
            raise ValueError(
                f"RetrievalModule.ssl_items={self.ssl_sampler.source!r} draws from the item "
                "catalogue: give data with catalogue() or call set_catalogue"
            )
        n_items = 0 if self.catalogue is None else len(self.catalogue)
        keep, rows = self.ssl_sampler.catalogue_rows(n_items, items.batch_size)
        if not len(rows):
            return items.head(keep)
        drawn = self.catalogue.items.rows(rows).to(items.sparse.device)
        if not keep:
            return drawn
        head = items.head(keep)
        return Batch(torch.cat([head.dense, drawn.dense]), torch.cat([head.sparse, drawn.sparse]))

    def on_validation_epoch_start(self) -> None:
        """Encode the catalogue once for the epoch's rankings."""
        self._val_sums = {}
        self._item_vectors = None
        if self.catalogue is not None:
            self._item_vectors = self.towers.encode_items(self.catalogue.items.to(self.device))

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        """Softmax loss; recall/NDCG of each row's item against the catalogue."""
        self._softmax(batch, "val")
        if self._item_vectors is None:
            return
        users = batch.sparse[:, self.towers.schema.field_index(self.user_field)]
        got = self.catalogue.rank(self(batch), self._item_vectors, users,
                                  self.towers.item_ids(batch), self.hparams.k)  # fmt: skip
        for prefix in ("", "tail_"):
            n = got.get(f"{prefix}users", 0.0)
            if not n:
                continue
            for metric in (f"{prefix}recall@{self.hparams.k}", f"{prefix}ndcg@{self.hparams.k}"):
                self._val_sums[metric] = self._val_sums.get(metric, 0.0) + got[metric] * n
            self._val_sums[f"{prefix}users"] = self._val_sums.get(f"{prefix}users", 0.0) + n

    def on_validation_epoch_end(self) -> None:
        """Log the epoch's ranking metrics (means over validation rows)."""
        sums = self._val_sums
        for metric, value in sums.items():
            if metric.endswith("users"):
                continue
            users = sums["tail_users" if metric.startswith("tail_") else "users"]
            self.log(f"val/{metric}", value / users, prog_bar=not metric.startswith("tail_"))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam over the dense parameters (the tables update themselves in backward)."""
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.Adam(
            params, lr=self.hparams.learning_rate, weight_decay=self.hparams.weight_decay
        )
