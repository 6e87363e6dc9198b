"""Any CSV / TSV / Parquet table with named label, dense and categorical columns.

Categorical raw values may be strings or integers (kept as their text). Files ending in
``.tsv`` or ``.txt`` are tab-separated, ``.csv`` comma-separated, ``.parquet`` / ``.pq``
Parquet; all have a header row (Parquet: column names).
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.parsing import Origin, check_on_bad_row, parse_dense, parse_label
from ssl_rec.data.preprocess import Layout, PartReader, PreprocessOptions, preprocess
from ssl_rec.data.raw import RawPart
from ssl_rec.data.storage import SPLIT_NAMES, file_fingerprint
from ssl_rec.schema import FeatureSchema
from ssl_rec.vocabulary import CodedColumn

SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": "\t", ".parquet": None, ".pq": None}


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


class TabularDataModule(ArrowDataModule):
    """Any CSV / TSV / Parquet table with named label, dense and categorical columns.

    Args:
        path: one file (split randomly) or a directory of ``train`` / ``valid`` (or
            ``val``) / ``test`` files.
        label: binary label column.
        dense: numeric columns.
        categorical: categorical columns (string or integer raw values).
        preprocess: vocabulary, split and bad-row options.
        batch_size: rows per batch.
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root.

    """

    def __init__(
        self,
        path: str,
        label: str,
        dense: list[str],
        categorical: list[str],
        preprocess: PreprocessOptions | None = None,
        batch_size: int = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__(batch_size, label_fraction, use_labels, seed, cache_dir, False)
        self._record_hparams(locals())
        if not dense and not categorical:
            raise ValueError("TabularDataModule needs at least one dense or categorical column")
        self.path, self.label = path, label
        self.dense, self.categorical = list(dense), list(categorical)
        self.options = preprocess or PreprocessOptions()

    cache_kind = "tabular"

    def _files(self) -> tuple[dict[str, list[str]] | None, list[str]]:
        p = Path(self.path)
        if not p.exists():
            raise FileNotFoundError(f"tabular data not found: {p}")
        split_files = find_split_files(p) if p.is_dir() else None
        files = [str(p)] if split_files is None else sum(split_files.values(), [])
        return split_files, files

    def cache_inputs(self) -> dict[str, Any]:
        """Fingerprints of the files, the column roles and the options."""
        _, files = self._files()
        return {"files": file_fingerprint(files), "label": self.label, "dense": self.dense,
                "categorical": self.categorical, "options": self.options.to_dict()}  # fmt: skip

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Preprocess the files into ``out_dir``."""
        split_files, files = self._files()
        reader = PartReader(self._read, split_files, self.options)
        layout = Layout(tuple(self.dense), tuple(self.categorical), self.label)
        return preprocess(reader, files, layout, self.options, out_dir, final_dir,
                          self.given_vocabulary)  # fmt: skip

    def read_raw_columns(self, split: str, columns: list[str]) -> pa.Table:
        """``columns`` of ``split``'s rows as read from the files (text, or Parquet types)."""
        split_files, files = self._files()
        reader = PartReader(self._read, split_files, self.options)
        return reader.raw_columns(split, files, lambda p: _read_any(Path(p), columns, False)[0])

    def _read(self, path: str) -> RawPart:
        label = self.label if column_names(path).count(self.label) else None
        return read_tabular(path, label, self.dense, self.categorical, self.options.on_bad_row)
