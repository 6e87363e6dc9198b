"""``ssl-rec retrieve``: the top-K items of each input row from a two-tower export alone.

    ssl-rec retrieve --index runs/export --data users.parquet --k 100 --out top.parquet

The export directory (``RetrievalModule.export``) is all it reads besides ``--data``: no
training data, no cache. The export records ids, not raw values, so the query columns hold
the ids the model was trained on (``0`` = missing); dense columns hold the values as
standardised in training. The output has one line per (input row, rank):
``row`` (0-based input row), ``rank`` (1 = best), ``item`` (item id) and ``score`` (inner
product), in Parquet or CSV/TSV by the suffix of ``--out``, written atomically.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch
from jsonargparse import CLI

from ssl_rec._io import atomic_path
from ssl_rec.cli.run_dir import refuse_existing_output
from ssl_rec.evaluation import Retriever
from ssl_rec.evaluation.predictions import prediction_format
from ssl_rec.types import Batch

_TOKEN = re.compile(r"[^\s,;|\[\]]+")  # one id of a history cell written as text


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
            (``manifest.json``'s ``query_fields``) as ids, not raw values: the export records
            no value-to-id mapping.
        k: items per row (``1..`` the catalogue's size).
        index: the export directory written by ``RetrievalModule.export``.
        ckpt_path: the same directory (the flag every ``ssl-rec`` command takes).
        history: a column of item ids never to return for that row: a list column, or text
            such as ``"3 17 42"`` (ids separated by spaces, commas, ``;`` or ``|``).
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
    if k > len(retriever.item_ids):
        raise ValueError(f"--k {k}: the catalogue has only {len(retriever.item_ids)} items")
    table = _read_rows(data)
    rows = query_rows(retriever, table, data)
    seen = history_ids(table, history, data) if history is not None else None
    scores, items = retriever.topk(rows, k, seen)
    _write_ranking(scores, items, out, kind)
    print(f"top-{k} items of {table.num_rows} rows written to {out}")
    return out


def query_rows(retriever: Retriever, table: pa.Table, where: str) -> Batch:
    """Full-schema rows ``Batch(float32[B, n_dense], int64[B, n_fields])`` of ``table``.

    Only the query tower's columns are read; the others stay zero (missing).

    Raises:
        ValueError: naming the column when one is missing, not numeric, empty in a row or
            holds an id outside its field's vocabulary.

    """
    schema, n = retriever.schema, table.num_rows
    tower = retriever.query_tower.schema
    sparse = torch.zeros(n, schema.n_fields, dtype=torch.long)
    dense = torch.zeros(n, len(schema.dense))
    for name in tower.field_names:
        values = torch.from_numpy(_column(table, name, pa.int64(), where))
        size = schema.field(name).cardinality
        bad = (values < 0) | (values >= size)
        if bool(bad.any()):
            value = int(values[bad][0])
            raise ValueError(
                f"{where}: column {name!r} holds id {value}, not in the export's 0..{size - 1} "
                "(the export knows ids, not raw values)"
            )
        sparse[:, schema.field_index(name)] = values
    for name in tower.dense:
        dense[:, list(schema.dense).index(name)] = torch.from_numpy(
            _column(table, name, pa.float32(), where)
        )
    return Batch(dense, sparse)


def history_ids(table: pa.Table, column: str, where: str) -> list[list[int]]:
    """Per row of ``table``, the item ids of its ``column`` (empty for a null cell)."""
    if column not in table.column_names:
        raise ValueError(f"{where}: no history column {column!r} (columns: {table.column_names})")
    result = []
    for row, cell in enumerate(table.column(column).to_pylist()):
        values = cell if isinstance(cell, list) else [] if cell is None else [cell]
        ids: list[int] = []
        for value in values:
            tokens = _TOKEN.findall(value) if isinstance(value, str) else [value]
            try:
                ids += [int(t) for t in tokens if t is not None]
            except (TypeError, ValueError):
                raise ValueError(
                    f"{where}: row {row} of history column {column!r} holds {value!r}, not item ids"
                ) from None
        result.append(ids)
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


def _read_rows(path: str) -> pa.Table:
    """The table of a ``.parquet``, ``.csv`` or ``.tsv`` input file."""
    kind = prediction_format(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such input file")
    try:
        if kind == "parquet":
            return pq.read_table(path)
        options = pacsv.ParseOptions(delimiter="," if kind == "csv" else "\t")
        return pacsv.read_csv(path, parse_options=options)
    except pa.ArrowInvalid as e:
        raise ValueError(f"{path}: cannot be read as {kind} ({e})") from None


def _column(table: pa.Table, name: str, type_: pa.DataType, where: str) -> np.ndarray:
    """Column ``name`` cast (safely) to ``type_`` as a NumPy array; one sentence if it cannot."""
    if name not in table.column_names:
        raise ValueError(
            f"{where}: no column {name!r}, a query column of the export "
            f"(columns: {table.column_names})"
        )
    column = table.column(name)
    if column.null_count:
        raise ValueError(f"{where}: column {name!r} has {column.null_count} empty cells")
    try:
        return pc.cast(column, type_).to_numpy().copy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(
            f"{where}: column {name!r} of type {column.type} is not {type_} "
            "(the export knows ids, not raw values)"
        ) from None


def _write_ranking(scores: torch.Tensor, items: torch.Tensor, out: str, kind: str) -> None:
    """Write the ``row, rank, item, score`` table of ``topk``'s output atomically."""
    b, k = items.shape
    keep = (items >= 0).reshape(-1).numpy()
    table = pa.table({
        "row": torch.arange(b).repeat_interleave(k).numpy()[keep],
        "rank": torch.arange(1, k + 1).repeat(b).numpy()[keep],
        "item": items.reshape(-1).numpy()[keep],
        "score": scores.reshape(-1).float().numpy()[keep],
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
