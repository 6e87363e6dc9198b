"""A generic tabular reader: CSV / TSV / Parquet with named label, dense and categorical columns.

Categorical raw values may be strings or integers (kept as their text). Files ending in
``.tsv`` or ``.txt`` are tab-separated, ``.csv`` comma-separated, ``.parquet`` / ``.pq``
Parquet; all have a header row (Parquet: column names).
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ssl_rec.datamodules.columns import Origin, check_on_bad_row, parse_dense, parse_label
from ssl_rec.datamodules.raw import CodedColumn, RawPart

SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": "\t", ".parquet": None, ".pq": None}
SPLIT_NAMES = {"train": "train", "valid": "val", "val": "val", "validation": "val", "test": "test"}


def _suffix(path: Path) -> str:
    suffixes = [s for s in path.suffixes if s != ".gz"]
    suffix = suffixes[-1] if suffixes else ""
    if suffix not in SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; use one of {list(SUFFIXES)}")
    return suffix


def _read_any(path: Path, columns: list[str], skip: bool) -> tuple[pa.Table, int, Origin]:
    suffix = _suffix(path)
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: file is empty")
    if SUFFIXES[suffix] is None:
        available = pq.read_schema(path).names
        _check_columns(path, columns, available)
        return pq.read_table(path, columns=columns), 0, Origin(str(path), 0, "row")
    skipped: list[int] = []

    def on_invalid(row: pacsv.InvalidRow) -> str:
        skipped.append(1)
        return "skip" if skip else "error"

    parse = pacsv.ParseOptions(delimiter=SUFFIXES[suffix], invalid_row_handler=on_invalid)
    available = column_names(path)
    _check_columns(path, columns, available)
    convert = pacsv.ConvertOptions(include_columns=columns, strings_can_be_null=True,
                                   column_types={c: pa.string() for c in columns})  # fmt: skip
    try:
        table = pacsv.read_csv(path, parse_options=parse, convert_options=convert)
    except pa.ArrowInvalid as e:
        match = re.search(r"Expected (\d+) columns, got (\d+)", str(e))
        detail = f"expected {match[1]} columns, got {match[2]}" if match else str(e)
        line = _first_bad_line(path, len(available), SUFFIXES[suffix])
        raise ValueError(f"{path}, line {line}: {detail}") from e
    return table, len(skipped), Origin(str(path), 2)


def _first_bad_line(path: Path, expected: int, sep: str) -> int:
    # Error path only; assumes no quoted separators, as pyarrow's message has no line.
    with open(path) as f:
        for i, line in enumerate(f, start=1):
            if line.strip() and line.rstrip("\n").count(sep) + 1 != expected:
                return i
    return -1


def _check_columns(path: Path, wanted: list[str], available: list[str]) -> None:
    unknown = [c for c in wanted if c not in available]
    if unknown:
        raise ValueError(f"{path}: unknown columns {unknown}; available columns: {available}")


def read_tabular(
    path: str | os.PathLike[str],
    label: str | None,
    dense: list[str],
    categorical: list[str],
    on_bad_row: str = "raise",
) -> RawPart:
    """Read and validate one CSV/TSV/Parquet file.

    Args:
        path: the file.
        label: binary label column, or ``None`` (or absent from this file) for unlabeled.
        dense: numeric columns (missing -> 0 after ``log1p(max(x, 0))``).
        categorical: columns whose values (strings or ints) become ids.
        on_bad_row: ``"raise"`` or ``"skip"`` and count.

    Returns:
        The validated rows.

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tabular file not found: {path}")
    skip = check_on_bad_row(on_bad_row) == "skip"
    columns = [*dense, *categorical] + ([label] if label else [])
    table, skipped, origin = _read_any(path, columns, skip)
    if table.num_rows == 0:
        raise ValueError(f"{path}: no data rows")
    values, bad = parse_dense([table.column(c) for c in dense], dense, origin, skip)
    y = None
    if label:
        y, bad_label = parse_label(table.column(label), label, origin, skip)
        bad |= bad_label
    cats = [CodedColumn.from_column(pc.cast(table.column(c), pa.string())) for c in categorical]
    part = RawPart(values, cats, y, skipped, str(path))
    if bad.any():
        part = part.take(~bad)
    return RawPart(part.dense, part.categorical, part.label, skipped + int(bad.sum()), str(path))


def column_names(path: str | os.PathLike[str]) -> list[str]:
    """Header (CSV/TSV) or schema (Parquet) column names of a tabular file."""
    path = Path(path)
    suffix = _suffix(path)
    if SUFFIXES[suffix] is None:
        return list(pq.read_schema(path).names)
    with open(path, newline="") as f:
        return next(csv.reader(f, delimiter=SUFFIXES[suffix]), [])


def find_split_files(directory: Path) -> dict[str, list[str]]:
    """``split -> [file]`` for a directory of ``train.*`` / ``valid|val.*`` / ``test.*`` files."""
    found: dict[str, list[str]] = {}
    for p in sorted(directory.iterdir()):
        stem = p.name.split(".")[0].lower()
        if p.is_file() and stem in SPLIT_NAMES and p.suffix in (*SUFFIXES, ".gz"):
            found.setdefault(SPLIT_NAMES[stem], []).append(str(p))
    if "train" not in found:
        raise ValueError(
            f"{directory}: no train.* file; files are {sorted(q.name for q in directory.iterdir())}"
        )
    return found
