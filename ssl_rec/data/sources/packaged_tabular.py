"""The base of datasets read from files an installed package ships (MovieLens-100k, reviews).

A subclass names the package, the task's columns and where its split files are
(:meth:`PackagedTabularDataModule.prepared_splits`, usually :func:`cached_seeded_splits`,
which writes them once into the cache); the class hands them to the tabular pipeline
(:class:`TabularDataModule`, ``min_frequency=1``) and adds the package version to the cache
inputs.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from ssl_rec._io import atomic_directory
from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.batch_rule import BatchSize
from ssl_rec.data.preprocess import PreprocessOptions
from ssl_rec.data.sources.seeded_split import write_seeded_splits
from ssl_rec.data.sources.tabular import TabularDataModule
from ssl_rec.data.storage import default_cache_dir
from ssl_rec.schema import FeatureSchema


def cached_seeded_splits(
    name: str, table: Callable[[], pa.Table], split_seed: int, cache_dir: str | None
) -> Path:
    """Directory ``<cache root>/<name>-split<split_seed>`` of ``train/valid/test.parquet``.

    Written once, atomically (:func:`write_seeded_splits` of ``table()``, which is only
    called when the directory does not exist yet).

    Args:
        name: cache name of the dataset, including what its rows depend on (versions).
        table: reads all rows of the dataset.
        split_seed: seed of the 80/10/10 permutation split.
        cache_dir: cache root (default ``$SSL_REC_CACHE`` or ``~/.cache/ssl_rec``).

    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / f"{name}-split{split_seed}"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        with atomic_directory(path) as tmp:
            write_seeded_splits(table(), tmp, split_seed)
    return path


class PackagedTabularDataModule(ArrowDataModule):
    """CTR data from a package's files, split by a seed and preprocessed as tabular data.

    A subclass sets ``cache_kind``, ``source_package``, ``label_column``, ``dense_columns``
    and ``categorical_columns`` and defines :meth:`prepared_splits`. Every training value
    keeps its own id (``min_frequency=1``); missing values and values first seen in
    validation or test get id 0.

    Args:
        batch_size: rows per training batch, or ``"auto"`` (chosen from the training rows).
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root (default ``$SSL_REC_CACHE`` or ``~/.cache/ssl_rec``).
        split_seed: seed of the 80/10/10 split of the rows.
        eval_batch_size: rows per validation, test and predict batch (default
            ``batch_size``); evaluation keeps no activations for backward, so it can be
            much larger than a small labeled subset's training batch.
        unlabeled_per_batch: unlabeled training rows (label NaN) added to each training
            batch, per labeled row: semi-supervised training with ``label_fraction < 1``
            (:class:`~ssl_rec.data.ArrowDataModule`); ``0`` trains on labeled rows only.

    """

    source_package: str = ""
    """Distribution name of the package shipping the files (its version is a cache input)."""
    label_column: str = ""
    dense_columns: tuple[str, ...] = ()
    categorical_columns: tuple[str, ...] = ()

    def __init__(
        self,
        batch_size: BatchSize = 1024,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        split_seed: int = 0,
        eval_batch_size: int | None = None,
        unlabeled_per_batch: float = 0.0,
    ) -> None:
        super().__init__(**self._base_arguments(locals()))
        self._record_hparams(locals())
        path = self.prepared_splits(split_seed, cache_dir)
        options = PreprocessOptions(min_frequency=1)
        self._tabular = TabularDataModule(
            str(path), self.label_column, list(self.dense_columns),
            list(self.categorical_columns), options, cache_dir=cache_dir,
        )  # fmt: skip

    @staticmethod
    def prepared_splits(split_seed: int, cache_dir: str | None) -> Path:
        """Directory of the dataset's ``train/valid/test.parquet`` split files."""
        raise NotImplementedError

    def cache_inputs(self) -> dict[str, Any]:
        """The tabular inputs plus the package version the rows come from."""
        return {**self._tabular.cache_inputs(), "package": self.source_package,
                "version": importlib.metadata.version(self.source_package)}  # fmt: skip

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Preprocess the split files into ``out_dir`` (the tabular pipeline)."""
        return self._tabular.build(out_dir, final_dir)
