"""The LightningDataModule base shared by the synthetic, Criteo and tabular data modules.

A data source is a subclass that says what its cache entry depends on
(:meth:`ArrowDataModule.cache_inputs`) and how to write it (:meth:`ArrowDataModule.build`);
this class finds or builds the entry, opens the memory-mapped splits and hands out
:class:`BatchLoader` s. ``schema`` is available right after ``__init__``: its first access
builds or finds the cached entry, so LightningCLI can link ``data.schema`` to the model at
instantiation.

Data given to a trained model is encoded with the model's vocabularies:
:meth:`ArrowDataModule.use_vocabulary` makes the entry depend on them (a separate cache
entry) and the source encode with them instead of fitting its own.
"""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytorch_lightning as pl
import torch

from ssl_rec.data.batch_rule import (
    AUTO,
    AUTO_EVAL_BATCH_SIZE,
    BatchSize,
    auto_batch_size,
    check_batch_size,
)
from ssl_rec.data.dense_fit import fit_split_dense_statistics
from ssl_rec.data.dense_transforms import AUTO_TRANSFORM, TRANSFORMS_KEY
from ssl_rec.data.id_occurrences import count_id_pairs, count_ids
from ssl_rec.data.loader import BatchLoader
from ssl_rec.data.semi_supervised_loader import (
    SemiSupervisedLoader,
    check_unlabeled_per_batch,
    unlabeled_features,
    with_unlabeled_rest,
)
from ssl_rec.data.storage import (
    LABEL,
    cached_build,
    default_cache_dir,
    open_split,
    verify_entry_files,
)
from ssl_rec.schema import FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.vocab import DENSE_STATISTICS_KEY, DenseStatistics, Vocabularies, find_vocabularies

_SUBSET_STREAM = 7
log = logging.getLogger(__name__)


def labeled_subset(n: int, label_fraction: float, seed: int) -> np.ndarray:
    """Sorted ``int64[k]`` ids of the labeled training rows, ``k = max(1, round(f * n))``.

    Seeded and nested: a smaller fraction's rows are a subset of a larger one's.
    """
    k = max(1, round(label_fraction * n))
    perm = np.random.default_rng([seed, _SUBSET_STREAM]).permutation(n)
    return np.sort(perm[:k])


class ArrowDataModule(pl.LightningDataModule):
    """Loaders over a cache entry of preprocessed splits.

    Args:
        batch_size: rows per training batch ``B``, or ``"auto"``: chosen from the number of
            training rows once they are known (:func:`ssl_rec.data.batch_rule.auto_batch_size`).
        label_fraction: train on this seeded fraction of the labeled training rows
            (nested: a smaller fraction is a subset of a larger one).
        use_labels: ``False`` yields ``label=None`` batches of all training rows (pretraining).
        seed: seed of the shuffle and of the labeled subset.
        cache_dir: cache root; default ``$SSL_REC_CACHE`` or ``~/.cache/ssl_rec``.
        drop_last: drop the last incomplete training batch.
        eval_batch_size: rows per validation, test and predict batch (default
            ``batch_size``; with ``batch_size="auto"``: ``AUTO_EVAL_BATCH_SIZE``); evaluation
            keeps no activations for backward, so it can be much larger than a small labeled
            subset's training batch.
        unlabeled_per_batch: semi-supervised batches: each training batch of ``B`` labeled
            rows also carries ``round(unlabeled_per_batch * B)`` training rows outside the
            labeled subset, label NaN (:class:`~ssl_rec.data.SemiSupervisedLoader`); ``0``
            (default) trains on labeled rows only. Needs ``use_labels`` and
            ``label_fraction < 1``.

    """

    def __init__(
        self,
        batch_size: BatchSize = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        drop_last: bool = False,
        eval_batch_size: int | None = None,
        unlabeled_per_batch: float = 0.0,
    ) -> None:
        super().__init__()
        batch_size = check_batch_size(type(self).__name__, "batch_size", batch_size)
        if eval_batch_size is not None and eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1 or null, got {eval_batch_size}")
        auto_eval = AUTO_EVAL_BATCH_SIZE if batch_size == AUTO else batch_size
        self.eval_batch_size = eval_batch_size or auto_eval
        if not 0.0 < label_fraction <= 1.0:
            raise ValueError(f"label_fraction must be in (0, 1], got {label_fraction}")
        self.batch_size, self.label_fraction = batch_size, label_fraction
        self.use_labels, self.seed, self.drop_last = use_labels, seed, drop_last
        self.unlabeled_per_batch = check_unlabeled_per_batch(
            unlabeled_per_batch, use_labels, label_fraction
        )
        self.cache_dir = Path(os.path.expanduser(cache_dir)) if cache_dir else default_cache_dir()
        self._entry: tuple[Path, FeatureSchema] | None = None
        self._splits: dict[str, datasets.Dataset] = {}
        self._given_vocabulary: Vocabularies | None = None
        self._vocabulary: Vocabularies | None = None

    @staticmethod
    def _base_arguments(init_locals: dict[str, Any], **overrides: Any) -> dict[str, Any]:
        """The keyword arguments of this class's ``__init__`` out of a source's ``locals()``.

        A source passes its own arguments of the same names (``batch_size`` ..
        ``unlabeled_per_batch``) on unchanged: ``super().__init__(**self._base_arguments(
        locals()))``. One it does not take keeps this class's default (a source without
        ``drop_last`` never drops); ``overrides`` replace values.
        """
        names = inspect.signature(ArrowDataModule.__init__).parameters
        shared = {k: v for k, v in init_locals.items() if k in names and k != "self"}
        return shared | overrides

    def _record_hparams(self, init_locals: dict[str, Any]) -> None:
        """Save the constructor arguments as plain values (checkpoints load weights-only).

        ``_class_path`` follows LightningCLI's convention, so ``ssl-rec export`` /
        ``evaluate-embeddings`` rebuild the data module from a checkpoint alone; an existing
        ``path`` is recorded absolute, so they do so from any working directory.
        """
        cls = type(self)
        hparams: dict[str, Any] = {"_class_path": f"{cls.__module__}.{cls.__qualname__}"}
        hparams |= {
            k: asdict(v) if is_dataclass(v) and not isinstance(v, type) else v
            for k, v in init_locals.items()
            if k not in ("self", "__class__")
        }
        path = hparams.get("path")
        if isinstance(path, str | os.PathLike) and os.path.exists(path):
            # A checkpoint's commands run from any directory: a relative data path would not.
            hparams["path"] = os.path.abspath(path)
        self.save_hyperparameters(hparams)

    # The source interface: a data source is a subclass defining these three members.
    cache_kind: str = ""
    """Prefix of the cache entries (``"criteo"``, ``"tabular"``, ``"synthetic"``)."""

    def cache_inputs(self) -> dict[str, Any]:
        """Everything the preprocessed data depends on (file fingerprints, options), JSON-able."""
        raise NotImplementedError

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Write each split's shards (``<split>/*.arrow``) into ``out_dir``; return the schema.

        Paths stored in the schema must use ``final_dir``, where ``out_dir`` is renamed to.
        """
        raise NotImplementedError

    def _build(self) -> tuple[Path, FeatureSchema]:
        def build(out_dir: Path, final_dir: Path) -> FeatureSchema:
            schema = self.build(out_dir, final_dir)
            schema.metadata.setdefault("source", self.cache_kind)
            # Every source's training rows, after its transform: never validation or test.
            stats = fit_split_dense_statistics(out_dir, schema.dense)
            schema.metadata[DENSE_STATISTICS_KEY] = None if stats is None else stats.to_dict()
            return schema

        inputs = self.cache_inputs()
        if self._given_vocabulary is not None:
            inputs = {**inputs, "vocabulary": self._given_vocabulary.fingerprints()}
        return cached_build(self.cache_dir, self.cache_kind, inputs, build)

    @property
    def given_vocabulary(self) -> Vocabularies | None:
        """The vocabularies set by :meth:`use_vocabulary` (sources encode with them) or ``None``."""
        return self._given_vocabulary

    def use_vocabulary(self, vocabulary: Vocabularies | None) -> None:
        """Encode the data with a model's ``vocabulary`` instead of fitting one (``None``: fit).

        Values it does not know get id 0 and are counted per split and field
        (``schema.metadata["unseen_values"]``, and a log line); the schema's fields and
        cardinalities become the vocabulary's. Splits already opened are reopened.
        """
        if vocabulary is not None and self._given_vocabulary is not None:
            if not vocabulary.disagreeing(self._given_vocabulary):
                return
        self._given_vocabulary = vocabulary
        self._entry, self._splits, self._vocabulary = None, {}, None

    @property
    def vocabulary(self) -> Vocabularies | None:
        """The vocabularies the splits are encoded with (given, or fit by preprocessing).

        ``None`` for an entry written without one (ids are then their own values).
        """
        if self._given_vocabulary is not None:
            return self._given_vocabulary
        if self._vocabulary is None:
            entry = self.data_dir
            self._vocabulary = find_vocabularies(
                entry, self.schema, lambda file: verify_entry_files(entry, [file])
            )
        return self._vocabulary

    @property
    def dense_statistics(self) -> DenseStatistics | None:
        """Mean, std and quantile edges of each dense column over the training split.

        Fitted when the entry is built, after the source's transform; ``None`` when the
        training split is empty (rows encoded for a trained model, which brings its own)
        or the data has no dense column.
        """
        return DenseStatistics.from_schema_metadata(self.schema.metadata)

    @property
    def schema(self) -> FeatureSchema:
        """The data's :class:`FeatureSchema` (first access preprocesses or generates)."""
        if self._entry is None:
            self._entry = self._build()
            self._record_dense_transforms(self._entry[1])
        return self._entry[1]

    @property
    def dense_transforms(self) -> dict[str, str] | None:
        """Each dense column's transform (``None``: the entry did not record them)."""
        return self.schema.metadata.get(TRANSFORMS_KEY)

    def _record_dense_transforms(self, schema: FeatureSchema) -> None:
        """Put ``dense_transform: auto``'s per-column choice into the hyper-parameters.

        A checkpoint saves them, so its commands transform new rows (which may hold no
        training rows to decide from) as the model's were.
        """
        options = self.hparams.get("preprocess")
        resolved = schema.metadata.get(TRANSFORMS_KEY)
        auto = isinstance(options, dict) and options.get("dense_transform") == AUTO_TRANSFORM
        if auto and resolved:
            options["dense_transform"] = dict(resolved)

    @property
    def data_dir(self) -> Path:
        """The cache entry: ``<split>/*.arrow`` shards, ``schema.json``, ``vocabulary.arrow``."""
        self.schema  # noqa: B018 - builds the entry
        return self._entry[0]

    def prepare_data(self) -> None:
        """Build the cache entry (once per node; later calls find it)."""
        self.schema  # noqa: B018

    def __str__(self) -> str:
        """``ClassName(<cache entry or cache dir>)``: never builds or opens the data.

        LightningDataModule's ``__str__`` calls every dataloader, and jsonargparse formats the
        arguments of a failed link with it: a failing preprocessing ran once per loader more.
        """
        return f"{type(self).__name__}({self._entry[0] if self._entry else self.cache_dir})"

    def split_table(self, split: str) -> pa.Table:
        """Return the memory-mapped Arrow table of ``split``."""
        if split not in self._splits:
            self._splits[split] = open_split(self.data_dir, split)
        return self._splits[split].data.table

    def split_labeled(self, split: str) -> bool:
        """Whether ``split`` has labels."""
        return LABEL in self.split_table(split).column_names

    def _shard(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return int(trainer.global_rank), int(trainer.world_size)

    def _loader(self, split: str, train: bool) -> BatchLoader:
        table, row_ids = self.split_table(split), None
        with_labels = self.split_labeled(split) and (self.use_labels or not train)
        if train and self.use_labels:
            if not self.split_labeled(split):
                raise ValueError(f"use_labels=True but split {split!r} has no labels")
            n = table.num_rows
            table, row_ids = self._labeled_training_rows(table)
            if row_ids is not None:
                self._say_once(
                    "training on %d of %d labeled rows (label_fraction=%g)",
                    len(row_ids), n, self.label_fraction,
                )  # fmt: skip
        rank, world = self._shard()
        size = self._train_batch_size(table.num_rows // world) if train else self.eval_batch_size
        return BatchLoader(
            table, size, shuffle=train, seed=self.seed,
            drop_last=self.drop_last and train, with_labels=with_labels, row_ids=row_ids,
            rank=rank, world_size=world,
        )  # fmt: skip

    def _labeled_training_rows(self, table: pa.Table) -> tuple[pa.Table, np.ndarray | None]:
        """The training split's rows a supervised fit reads, and their ids (``None``: all)."""
        if self.label_fraction >= 1.0:
            return table, None
        row_ids = labeled_subset(table.num_rows, self.label_fraction, self.seed)
        return table.take(pa.array(row_ids)), row_ids

    def _train_batch_size(self, rows: int) -> int:
        """``batch_size``, or the rule's choice for ``rows`` training rows of this process."""
        if self.batch_size != AUTO:
            return int(self.batch_size)
        size = auto_batch_size(rows)
        self._say_once(
            "batch_size auto: %d for %d training rows (%d batches per epoch)",
            size, rows, -(-rows // size),
        )  # fmt: skip
        return size

    def _say_once(self, message: str, *args: object) -> None:
        """Log ``message % args`` at INFO unless this data module already has.

        A loader built again (a model reading the labeled rows before the trainer does) says
        nothing new.
        """
        said = self.__dict__.setdefault("_said", set())
        text = message % args
        if text not in said:
            said.add(text)
            log.info(text)

    def _counted_tables(self) -> list[pa.Table]:
        """The rows a fit reads, where its ids are counted.

        The labeled training rows (``label_fraction``'s subset); with ``unlabeled_per_batch``
        or ``use_labels`` off, every training row and those of a separate unlabeled file.
        """
        table = self.split_table("train")
        if self.use_labels and not self.unlabeled_per_batch:
            return [self._labeled_training_rows(table)[0]]
        extra = self.unlabeled_file_rows()
        return [table] if extra is None else [table, extra]

    def id_counts(self) -> list[np.ndarray]:
        """``int64[cardinality_f]`` occurrences of each id of each field in the rows a fit reads.

        The rows of :meth:`_counted_tables`: the labeled ones, or all of them in a
        semi-supervised fit or pretraining.
        """
        counts = count_ids(self._counted_tables(), self.schema.cardinalities)
        self._say_once(
            "id counts: over %s training rows", f"{int(counts[0].sum()) if counts else 0:,}"
        )
        return counts

    def id_pair_counts(self, fields: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(left, right, count)``: how often fields ``a`` and ``b``'s ids occur together.

        Over the rows :meth:`id_counts` counts; see
        :func:`~ssl_rec.data.id_occurrences.count_id_pairs`.
        """
        left, right, count = count_id_pairs(
            self._counted_tables(), self.schema.cardinalities, fields
        )
        names = self.schema.field_names
        self._say_once(
            "id pair counts: %s pairs of %s and %s over %s training rows",
            f"{len(count):,}", names[fields[0]], names[fields[1]], f"{int(count.sum()):,}",
        )  # fmt: skip
        return left, right, count

    def labeled_train_dataloader(self) -> BatchLoader:
        """The labeled training rows alone, shuffled.

        ``train_dataloader`` without the unlabeled rows a semi-supervised one mixes in.

        Raises:
            ValueError: ``use_labels`` is off or the training split has no labels.

        """
        if not self.use_labels:
            raise ValueError("labeled_train_dataloader needs use_labels=True")
        return self._loader("train", train=True)

    def train_dataloader(self) -> BatchLoader | SemiSupervisedLoader:
        """Return shuffled training batches (labeled subset, or all rows unlabeled).

        With ``unlabeled_per_batch > 0``, each batch also carries rows of the rest of the
        training split, label NaN.
        """
        extra = self.unlabeled_file_rows()
        if extra is not None and not self.use_labels:
            return self._pretraining_loader(extra)
        loader = self._loader("train", train=True)
        if not self.unlabeled_per_batch:
            return loader
        table = self.split_table("train")
        # The labeled loader's row ids are the subset it took (None: every row is labeled).
        labeled = loader.row_ids if loader.row_ids is not None else np.arange(table.num_rows)
        return with_unlabeled_rest(table, labeled, loader, self.unlabeled_per_batch, extra)

    def unlabeled_file_rows(self) -> pa.Table | None:
        """Rows of a separate unlabeled file, encoded with this data's vocabulary, or ``None``.

        A source with such a file (``TabularDataModule(unlabeled_path=...)``) overrides it; the
        rows join the semi-supervised pool, or the training rows when ``use_labels`` is off.
        """
        return None

    def _pretraining_loader(self, extra: pa.Table) -> BatchLoader:
        """Unlabeled batches of the training split's rows followed by ``extra``'s."""
        table = self.split_table("train")
        # Zero-copy: the loader reads blocks across chunks, so both stay memory-mapped.
        both = pa.concat_tables([unlabeled_features(table), unlabeled_features(extra)])
        rank, world = self._shard()
        return BatchLoader(
            both, self._train_batch_size(both.num_rows // world), shuffle=True,
            seed=self.seed, drop_last=self.drop_last, with_labels=False, rank=rank,
            world_size=world,
        )  # fmt: skip

    def val_dataloader(self) -> BatchLoader:
        """Return validation batches in file order."""
        return self._loader("val", train=False)

    def test_dataloader(self) -> BatchLoader:
        """Return test batches in file order."""
        return self._loader("test", train=False)

    def predict_dataloader(self) -> BatchLoader:
        """Return test batches in file order."""
        return self._loader("test", train=False)

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        """Move a :class:`Batch` with ``Batch.to`` (Lightning cannot rebuild frozen dataclasses)."""
        if isinstance(batch, Batch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def raw_columns(self, split: str, columns: list[str]) -> pa.Table:
        """Input columns (raw values) of ``split``'s rows, in the order the loaders yield them.

        Used to key predictions by the input's own ids. Raises ``ValueError`` when the
        source has no raw rows (synthetic data) or bad rows were skipped (rows and input
        lines no longer line up).
        """
        skipped = self.schema.metadata.get("splits", {}).get(split, {}).get("skipped_rows", 0)
        if skipped:
            raise ValueError(
                f"{skipped} bad rows of the {split!r} split were skipped, so its rows no longer "
                f"line up with the input's; fix them (on_bad_row='raise') to get columns {columns}"
            )
        return self.read_raw_columns(split, list(columns))

    def read_raw_columns(self, split: str, columns: list[str]) -> pa.Table:
        """Source hook of :meth:`raw_columns`: sources reading files override it."""
        raise ValueError(
            f"{type(self).__name__} keeps no raw input columns (asked for {columns}); "
            "write predictions without keys"
        )

    def oracle_metrics(self, split: str) -> dict[str, float] | None:
        """``{"auc", "logloss", ...}`` of the true click probabilities, or ``None``."""
        return None
