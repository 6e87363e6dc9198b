"""``ssl-rec retrieve``: the top-K items of each input row from a two-tower export alone.

    ssl-rec retrieve --index runs/export --data users.parquet --k 100 --out top.parquet

The export directory (``RetrievalModule.export``) is all it reads besides ``--data``: no
training data, no cache. The query columns hold raw values as in the training table (the
export's vocabularies encode them; a value never seen in training counts as missing) and
numeric columns raw numbers (standardised as in training). The output has one line per
(input row, rank): ``row`` (0-based input row), ``rank`` (1 = best), ``item`` (the item's raw
key, as text) and ``score`` (inner product), in Parquet or CSV/TSV by the suffix of
``--out``, written atomically.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from jsonargparse import CLI

from ssl_rec._io import atomic_path
from ssl_rec.cli.run_dir import refuse_existing_output
from ssl_rec.data.sources.interaction_table import read_interactions
from ssl_rec.evaluation import Retriever
from ssl_rec.evaluation.predictions import prediction_format

_TOKEN = re.compile(r"[^\s,;|\[\]]+")  # one item key of a history cell written as text


def retrieve(
    out: str,
    data: str,
    k: int = 100,
    index: str | None = None,
    ckpt_path: str | None = None,
    history: str | None = None,
    overwrite: bool = False,
) -> str:
    """Write the top-``k`` items and scores of every row of ``data`` to ``out``.

    Args:
        out: ``.parquet``, ``.csv`` or ``.tsv`` file: columns ``row``, ``rank``, ``item``,
            ``score``, ``k`` lines per input row (fewer when the history leaves fewer items).
        data: ``.parquet``, ``.csv`` or ``.tsv`` file with the export's query columns
            (``manifest.json``'s ``query_fields``) holding raw values, as in the training
            table (ids for an export without vocabularies).
        k: items per row (``1..`` the catalogue's size).
        index: the export directory written by ``RetrievalModule.export``.
        ckpt_path: the same directory (the flag every ``ssl-rec`` command takes).
        history: a column of item keys never to return for that row: a list column, or text
            such as ``"3 17 42"`` (keys separated by spaces, commas, ``;`` or ``|``).
        overwrite: replace an existing ``out``.

    Returns:
        ``out``.

    """
    directory = _export_directory(index, ckpt_path)
    kind = prediction_format(out)
    refuse_existing_output(out, overwrite)
    if k < 1:
        raise ValueError(f"--k {k}: must be at least 1")
    if not Path(directory).is_dir():
        raise FileNotFoundError(f"{directory}: no such export directory")
    retriever = Retriever.load(directory)
    if k > len(retriever):
        raise ValueError(f"--k {k}: the catalogue has only {len(retriever)} items")
    table = read_interactions(data, "input file")
    try:
        rows, unknown = retriever.encode(table)
    except ValueError as e:
        raise ValueError(f"{data}: {e}") from None
    seen = history_keys(table, history, data) if history is not None else None
    excluded = None if seen is None else [retriever.rows_of_keys(keys) for keys in seen]
    scores, positions = retriever.search(rows, k, excluded)
    _write_ranking(scores, positions, retriever.item_keys, out, kind)
    note = f" ({unknown} query values unseen in training were taken as missing)" if unknown else ""
    print(f"top-{k} items of {table.num_rows} rows written to {out}{note}")
    return out


def history_keys(table: pa.Table, column: str, where: str) -> list[list[str]]:
    """Per row of ``table``, the item keys of its ``column`` (empty for a null cell)."""
    if column not in table.column_names:
        raise ValueError(f"{where}: no history column {column!r} (columns: {table.column_names})")
    result = []
    for cell in table.column(column).to_pylist():
        values = cell if isinstance(cell, list) else [] if cell is None else [cell]
        keys: list[str] = []
        for value in values:
            if isinstance(value, str):
                keys += _TOKEN.findall(value)
            elif value is not None:
                keys.append(str(value))
        result.append(keys)
    return result


def _export_directory(index: str | None, ckpt_path: str | None) -> str:
    """The export directory of ``--index`` or ``--ckpt_path`` (one of them, or both alike)."""
    given = {v for v in (index, ckpt_path) if v is not None}
    if len(given) != 1:
        raise ValueError(
            "ssl-rec retrieve needs --index DIR (an export of RetrievalModule.export)"
            if not given
            else f"--index and --ckpt_path name different directories: {sorted(given)}"
        )
    return next(iter(given))


def _write_ranking(
    scores: np.ndarray, positions: np.ndarray, keys: np.ndarray, out: str, kind: str
) -> None:
    """Write the ``row, rank, item, score`` table of a search atomically (real items only)."""
    b, k = positions.shape
    keep = (positions >= 0).reshape(-1)
    table = pa.table({
        "row": np.repeat(np.arange(b), k)[keep],
        "rank": np.tile(np.arange(1, k + 1), b)[keep],
        "item": pa.array(keys[positions.reshape(-1)[keep]].astype(str), pa.string()),
        "score": scores.reshape(-1).astype(np.float32)[keep],
    })  # fmt: skip
    with atomic_path(out) as tmp:
        if kind == "parquet":
            pq.write_table(table, tmp)
        else:
            options = pacsv.WriteOptions(delimiter="," if kind == "csv" else "\t")
            pacsv.write_csv(table, tmp, write_options=options)


def retrieve_main(argv: Sequence[str]) -> str:
    """Entry of ``ssl-rec retrieve``; ``--help`` lists the flags."""
    return CLI(retrieve, args=list(argv), as_positional=False, exit_on_error=False)
