"""Data: Criteo and tabular readers, the synthetic generator, Arrow storage and loaders."""

from ssl_rec.datamodules.base import ArrowDataModule
from ssl_rec.datamodules.criteo import detect_has_label, read_criteo, write_criteo_tsv
from ssl_rec.datamodules.datamodule import (
    CriteoDataModule,
    SyntheticCTRDataModule,
    TabularDataModule,
    criteo_split_files,
)
from ssl_rec.datamodules.loader import BatchLoader, validate_sparse
from ssl_rec.datamodules.oracle import binary_auc, binary_logloss, oracle_metrics
from ssl_rec.datamodules.preprocess import PreprocessOptions
from ssl_rec.datamodules.raw import RawPart
from ssl_rec.datamodules.schema import (
    CRITEO_CATEGORICAL,
    CRITEO_DENSE,
    CRITEO_LABEL,
    MISSING_ID,
    CategoricalField,
    FeatureSchema,
)
from ssl_rec.datamodules.storage import default_cache_dir, open_split
from ssl_rec.datamodules.synthetic import (
    CRITEO_KAGGLE_CARDINALITIES,
    SyntheticConfig,
    SyntheticGenerator,
    SyntheticRows,
)
from ssl_rec.datamodules.synthetic_splits import generator_from_schema
from ssl_rec.datamodules.tabular import read_tabular
from ssl_rec.datamodules.vocabulary import MISSING_VALUE, Vocabulary, load_vocabulary

__all__ = [
    "ArrowDataModule",
    "BatchLoader",
    "CRITEO_CATEGORICAL",
    "CRITEO_DENSE",
    "CRITEO_KAGGLE_CARDINALITIES",
    "CRITEO_LABEL",
    "CategoricalField",
    "CriteoDataModule",
    "FeatureSchema",
    "MISSING_ID",
    "MISSING_VALUE",
    "PreprocessOptions",
    "RawPart",
    "SyntheticCTRDataModule",
    "SyntheticConfig",
    "SyntheticGenerator",
    "SyntheticRows",
    "TabularDataModule",
    "Vocabulary",
    "binary_auc",
    "binary_logloss",
    "criteo_split_files",
    "default_cache_dir",
    "detect_has_label",
    "generator_from_schema",
    "load_vocabulary",
    "open_split",
    "oracle_metrics",
    "read_criteo",
    "read_tabular",
    "validate_sparse",
    "write_criteo_tsv",
]
