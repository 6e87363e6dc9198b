"""The Criteo Display Advertising Challenge / Terabyte TSV layout: read and write.

One row per line, tab-separated, no header: ``label, I1..I13, C1..C26`` (40 columns), or
39 columns without the label (Kaggle's test file). Dense values are integers (``I2`` may
be negative), categorical values 8-hex-digit hashes; an empty cell is missing. Files may
be gzip-compressed (``.gz``). Parsing uses ``pyarrow.csv`` (multithreaded C++).
"""

from __future__ import annotations

import gzip
import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ssl_rec.datamodules.columns import Origin, check_on_bad_row, parse_dense, parse_label
from ssl_rec.datamodules.raw import CodedColumn, RawPart
from ssl_rec.datamodules.schema import CRITEO_CATEGORICAL, CRITEO_DENSE, CRITEO_LABEL
from ssl_rec.datamodules.synthetic import SyntheticRows, render_ids

N_COLUMNS_LABELED = 1 + len(CRITEO_DENSE) + len(CRITEO_CATEGORICAL)
log = logging.getLogger(__name__)


def _open_text(path: Path):  # noqa: ANN202 - a text file object
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)


def detect_has_label(path: str | os.PathLike[str]) -> bool:
    """Whether a Criteo file has the label column, from its first line's column count.

    Raises:
        FileNotFoundError: no such file.
        ValueError: empty file, or a first line with neither 40 nor 39 columns.

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Criteo file not found: {path}")
    with _open_text(path) as f:
        first = f.readline().rstrip("\n")
    if not first:
        raise ValueError(f"{path}: file is empty (expected Criteo TSV rows)")
    n = first.count("\t") + 1
    if n not in (N_COLUMNS_LABELED, N_COLUMNS_LABELED - 1):
        raise ValueError(
            f"{path}, line 1: expected {N_COLUMNS_LABELED} (labeled) or "
            f"{N_COLUMNS_LABELED - 1} (unlabeled) tab-separated columns, got {n}"
        )
    return n == N_COLUMNS_LABELED


def _first_bad_line(path: Path, expected: int) -> tuple[int, int]:
    # Error path only: a Python scan to name the line pyarrow's parallel parser rejected.
    with _open_text(path) as f:
        for i, line in enumerate(f, start=1):
            n = line.rstrip("\n").count("\t") + 1
            if n != expected:
                return i, n
    return -1, -1


def _read_table(path: Path, names: list[str], dense_type: pa.DataType, skip: bool) -> tuple:
    skipped: list[int] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        skipped.append(1)
        return "skip" if skip else "error"

    types = {n: dense_type for n in names if n == CRITEO_LABEL or n in CRITEO_DENSE}
    types.update({n: pa.string() for n in CRITEO_CATEGORICAL})
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names, block_size=8 << 20),
        parse_options=pacsv.ParseOptions(
            delimiter="\t", quote_char=False, ignore_empty_lines=False,
            invalid_row_handler=on_invalid,
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=types, strings_can_be_null=True, null_values=[""],
        ),
    )  # fmt: skip
    return table, len(skipped)


def read_criteo(
    path: str | os.PathLike[str], has_label: bool | None = None, on_bad_row: str = "raise"
) -> RawPart:
    """Read and validate one Criteo TSV file (plain or ``.gz``).

    Args:
        path: the file.
        has_label: whether the first column is the label; ``None`` detects it from the
            column count of the first line (40 vs 39).
        on_bad_row: ``"raise"`` a ``ValueError`` naming file and line, or ``"skip"`` bad
            rows (wrong column count, non-numeric or non-finite dense value, label not 0/1)
            and count them in ``RawPart.skipped``.

    Returns:
        The file's validated rows (dense already ``log1p``-transformed).

    """
    path = Path(path)
    skip = check_on_bad_row(on_bad_row) == "skip"
    detected = detect_has_label(path)
    if has_label is not None and has_label != detected:
        raise ValueError(
            f"{path}: has_label={has_label} but line 1 has "
            f"{N_COLUMNS_LABELED if detected else N_COLUMNS_LABELED - 1} columns"
        )
    names = ([CRITEO_LABEL] if detected else []) + [*CRITEO_DENSE, *CRITEO_CATEGORICAL]
    try:
        try:
            table, n_invalid = _read_table(path, names, pa.int64(), skip)
        except pa.ArrowInvalid as e:
            if "conversion error" not in str(e):
                raise
            table, n_invalid = _read_table(path, names, pa.string(), skip)
    except pa.ArrowInvalid as e:
        line, n = _first_bad_line(path, len(names))
        raise ValueError(
            f"{path}, line {line}: expected {len(names)} tab-separated columns, got {n}"
        ) from e
    return _validate(table, path, detected, skip, n_invalid)


def _validate(table: pa.Table, path: Path, labeled: bool, skip: bool, skipped: int) -> RawPart:
    origin = Origin(str(path), 1)
    dense, bad = parse_dense(
        [table.column(n) for n in CRITEO_DENSE], list(CRITEO_DENSE), origin, skip
    )
    label = None
    if labeled:
        label, bad_label = parse_label(table.column(CRITEO_LABEL), CRITEO_LABEL, origin, skip)
        bad |= bad_label
    cats = [CodedColumn.from_column(table.column(n)) for n in CRITEO_CATEGORICAL]
    part = RawPart(dense, cats, label, skipped, str(path))
    if bad.any():
        part = part.take(~bad)
        n_bad = skipped + int(bad.sum())
        part = RawPart(part.dense, part.categorical, part.label, n_bad, part.source)
    if part.skipped:
        log.warning("%s: skipped %d bad rows", path, part.skipped)
    return part


def write_criteo_tsv(
    path: str | os.PathLike[str], rows: SyntheticRows, with_label: bool = True
) -> Path:
    """Write generated rows in the exact Criteo layout (``.gz`` suffix -> gzip).

    Ids are rendered as 8-hex-digit hashes (:func:`render_ids`), id 0 and missing counts
    as empty cells.

    Args:
        path: output file.
        rows: from :meth:`SyntheticGenerator.rows`.
        with_label: write the label column (40 columns) or not (39, like Kaggle's test).

    """
    path = Path(path)
    cols: dict[str, pa.Array] = {}
    if with_label:
        cols[CRITEO_LABEL] = pa.array(rows.label.astype(np.int8))
    for j, name in enumerate(CRITEO_DENSE):
        cols[name] = pa.array(rows.dense[:, j], mask=rows.dense_missing[:, j])
    for f, name in enumerate(CRITEO_CATEGORICAL):
        ids = rows.sparse[:, f]
        cols[name] = pc.cast(pa.array(render_ids(f, ids), mask=ids == 0), pa.string())
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    path.parent.mkdir(parents=True, exist_ok=True)
    codec = "gzip" if path.suffix == ".gz" else None
    with pa.output_stream(str(path), compression=codec) as out:
        pacsv.write_csv(pa.table(cols), out, write_options=options)
    return path
