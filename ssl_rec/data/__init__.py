"""Data: sources (Criteo, tabular, synthetic), preprocessing to Arrow, loaders, DataModules.

A data source is one file under ``sources/``: a reader plus an :class:`ArrowDataModule`
subclass naming its cache inputs and how to build them (see ``docs/extending.md``).
"""

from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.loader import BatchLoader, validate_sparse
from ssl_rec.data.lookup import VocabularyLookup
from ssl_rec.data.preprocess import Layout, PreprocessOptions
from ssl_rec.data.raw import RawBatch, RawPart
from ssl_rec.data.semi_supervised_loader import SemiSupervisedLoader
from ssl_rec.data.sources.criteo import (
    CriteoDataModule,
    criteo_batches,
    criteo_plan,
    criteo_split_files,
    detect_has_label,
    read_criteo,
)
from ssl_rec.data.sources.synthetic import (
    SyntheticCTRDataModule,
    click_model_from_schema,
    write_criteo_tsv,
)
from ssl_rec.data.sources.synthetic_clicks import (
    CRITEO_KAGGLE_CARDINALITIES,
    SyntheticClickModel,
    SyntheticConfig,
    SyntheticRows,
)
from ssl_rec.data.sources.tabular import TabularDataModule, read_tabular, tabular_batches
from ssl_rec.data.split_plan import Part, SplitPlan
from ssl_rec.data.storage import ShardWriter, default_cache_dir, open_split

__all__ = [
    "ArrowDataModule",
    "BatchLoader",
    "CRITEO_KAGGLE_CARDINALITIES",
    "CriteoDataModule",
    "Layout",
    "Part",
    "SplitPlan",
    "PreprocessOptions",
    "RawBatch",
    "RawPart",
    "SemiSupervisedLoader",
    "ShardWriter",
    "SyntheticCTRDataModule",
    "SyntheticClickModel",
    "SyntheticConfig",
    "SyntheticRows",
    "TabularDataModule",
    "VocabularyLookup",
    "click_model_from_schema",
    "criteo_batches",
    "criteo_plan",
    "criteo_split_files",
    "default_cache_dir",
    "detect_has_label",
    "open_split",
    "read_criteo",
    "read_tabular",
    "tabular_batches",
    "validate_sparse",
    "write_criteo_tsv",
]
