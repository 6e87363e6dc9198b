"""The three data modules: synthetic (built-in default), Criteo files, and any table."""

from __future__ import annotations

import re
from pathlib import Path

from ssl_rec.datamodules.base import ArrowDataModule
from ssl_rec.datamodules.criteo import read_criteo
from ssl_rec.datamodules.preprocess import Layout, PartReader, PreprocessOptions, preprocess
from ssl_rec.datamodules.raw import RawPart
from ssl_rec.datamodules.schema import (
    CRITEO_CATEGORICAL,
    CRITEO_DENSE,
    CRITEO_LABEL,
    FeatureSchema,
)
from ssl_rec.datamodules.storage import SPLITS, cached_build, file_fingerprint
from ssl_rec.datamodules.synthetic import GENERATOR_VERSION, SyntheticConfig, SyntheticGenerator
from ssl_rec.datamodules.synthetic_splits import generator_from_schema, write_synthetic_splits
from ssl_rec.datamodules.tabular import (
    SPLIT_NAMES,
    column_names,
    find_split_files,
    read_tabular,
)


class SyntheticCTRDataModule(ArrowDataModule):
    """Generated Criteo-like data with known click probabilities and latent structure.

    Args:
        n_train: training rows (the unlabeled pool with ``use_labels=False``).
        n_val: validation rows.
        n_test: test rows.
        generator: generator knobs (seed, cardinality scale, latent sizes, base CTR).
        batch_size: rows per batch.
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed (the data's own seed is ``generator.seed``).
        cache_dir: cache root (default ``$SSL_REC_CACHE`` or ``~/.cache/ssl_rec``).
        drop_last: drop the last incomplete training batch.

    Example:
        >>> dm = SyntheticCTRDataModule(n_train=200_000)  # doctest: +SKIP
        >>> dm.schema.cardinalities[:3], dm.oracle_metrics("test")["auc"]  # doctest: +SKIP

    """

    def __init__(
        self,
        n_train: int = 1_000_000,
        n_val: int = 100_000,
        n_test: int = 100_000,
        generator: SyntheticConfig | None = None,
        batch_size: int = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, label_fraction, use_labels, seed, cache_dir, drop_last)
        self._record_hparams(locals())
        for key, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
            if not 0 <= value <= 10**10 or (key == "n_train" and value < 1):
                raise ValueError(f"{key} must be in [{int(key == 'n_train')}, 1e10], got {value}")
        self.sizes = {"train": n_train, "val": n_val, "test": n_test}
        self.generator_config = generator or SyntheticConfig()

    def _build(self) -> tuple[Path, FeatureSchema]:
        inputs = {
            "generator": self.generator_config.to_dict(),
            "generator_version": GENERATOR_VERSION,
            "sizes": self.sizes,
        }
        return cached_build(
            self.cache_dir, "synthetic", inputs,
            lambda tmp, final: write_synthetic_splits(self.generator_config, self.sizes, tmp,
                                                      final),
        )  # fmt: skip

    def generator(self) -> SyntheticGenerator:
        """Rebuild the generator of this data (true latents via ``item_latents(field)``)."""
        return generator_from_schema(self.schema)

    def oracle_metrics(self, split: str) -> dict[str, float] | None:
        """Oracle AUC / logloss / CTR of the true probabilities on ``split``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.schema.metadata["oracle"].get(split)


def _natural_key(path: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", Path(path).name)]


def _day_splits(files: list[str]) -> dict[str, list[str]]:
    if len(files) < 3:
        raise ValueError(
            f"splitting by file needs >= 3 files (train..., val, test), got {len(files)}: {files}"
        )
    files = sorted(files, key=_natural_key)
    return {"train": files[:-2], "val": [files[-2]], "test": [files[-1]]}


def criteo_split_files(path: str | list[str]) -> dict[str, list[str]] | None:
    """``split -> files`` for a directory or list of Criteo files; ``None`` for one file.

    A directory with ``train*`` / ``val*`` / ``test*`` files uses those names; otherwise
    files are ordered by name (``day_0 .. day_23``) and the last two are val and test.
    """
    if isinstance(path, list):
        return _day_splits([str(p) for p in path])
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"Criteo data not found: {p}")
    if p.is_file():
        return None
    files = [str(q) for q in p.iterdir() if q.is_file() and not q.name.startswith(".")]
    named: dict[str, list[str]] = {}
    for f in files:
        stem = Path(f).name.split(".")[0].split("_")[0].lower()
        if stem in SPLIT_NAMES:
            named.setdefault(SPLIT_NAMES[stem], []).append(f)
    if "train" in named:
        return {k: sorted(v, key=_natural_key) for k, v in named.items()}
    return _day_splits(files)


class CriteoDataModule(ArrowDataModule):
    """Criteo Display Advertising Challenge / Terabyte TSV files (plain or ``.gz``).

    Args:
        path: one file (split randomly by ``preprocess`` fractions), a directory
            (``train``/``val``/``test`` files, or days: last two = val, test), or a list of
            files in day order.
        has_label: whether files have the label column; ``None`` detects it per file.
        preprocess: vocabulary, split and bad-row options.
        batch_size: rows per batch.
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root.
        drop_last: drop the last incomplete training batch.

    """

    def __init__(
        self,
        path: str | list[str],
        has_label: bool | None = None,
        preprocess: PreprocessOptions | None = None,
        batch_size: int = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, label_fraction, use_labels, seed, cache_dir, drop_last)
        self._record_hparams(locals())
        self.path, self.has_label = path, has_label
        self.options = preprocess or PreprocessOptions()

    def _build(self) -> tuple[Path, FeatureSchema]:
        split_files = criteo_split_files(self.path)
        files = [str(self.path)] if split_files is None else sum(split_files.values(), [])
        inputs = {"files": file_fingerprint(files), "splits": split_files,
                  "has_label": self.has_label, "options": self.options.to_dict()}  # fmt: skip
        reader = PartReader(
            lambda p: read_criteo(p, self.has_label, self.options.on_bad_row),
            split_files, self.options,
        )  # fmt: skip
        layout = Layout(CRITEO_DENSE, CRITEO_CATEGORICAL, CRITEO_LABEL)
        return cached_build(
            self.cache_dir, "criteo", inputs,
            lambda tmp, final: _with_source(
                preprocess(reader, files, layout, self.options, tmp, final), "criteo"),
        )  # fmt: skip


def _with_source(schema: FeatureSchema, source: str) -> FeatureSchema:
    schema.metadata["source"] = source
    return schema


class TabularDataModule(ArrowDataModule):
    """Any CSV / TSV / Parquet table with named label, dense and categorical columns.

    Args:
        path: one file (split randomly) or a directory of ``train`` / ``valid`` (or
            ``val``) / ``test`` files.
        label: binary label column.
        dense: numeric columns.
        categorical: categorical columns (string or integer raw values).
        preprocess: vocabulary, split and bad-row options.
        batch_size: rows per batch.
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root.

    """

    def __init__(
        self,
        path: str,
        label: str,
        dense: list[str],
        categorical: list[str],
        preprocess: PreprocessOptions | None = None,
        batch_size: int = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__(batch_size, label_fraction, use_labels, seed, cache_dir, False)
        self._record_hparams(locals())
        if not dense and not categorical:
            raise ValueError("TabularDataModule needs at least one dense or categorical column")
        self.path, self.label = path, label
        self.dense, self.categorical = list(dense), list(categorical)
        self.options = preprocess or PreprocessOptions()

    def _build(self) -> tuple[Path, FeatureSchema]:
        p = Path(self.path)
        if not p.exists():
            raise FileNotFoundError(f"tabular data not found: {p}")
        split_files = find_split_files(p) if p.is_dir() else None
        files = [str(p)] if split_files is None else sum(split_files.values(), [])
        inputs = {"files": file_fingerprint(files), "label": self.label, "dense": self.dense,
                  "categorical": self.categorical, "options": self.options.to_dict()}  # fmt: skip
        reader = PartReader(self._read, split_files, self.options)
        layout = Layout(tuple(self.dense), tuple(self.categorical), self.label)
        return cached_build(
            self.cache_dir, "tabular", inputs,
            lambda tmp, final: _with_source(
                preprocess(reader, files, layout, self.options, tmp, final), "tabular"),
        )  # fmt: skip

    def _read(self, path: str) -> RawPart:
        label = self.label if column_names(path).count(self.label) else None
        return read_tabular(path, label, self.dense, self.categorical, self.options.on_bad_row)
