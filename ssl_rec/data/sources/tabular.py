"""Any CSV / TSV / Parquet table with named label, dense and categorical columns.

Categorical raw values may be strings or integers (kept as their text). Files ending in
``.tsv`` or ``.txt`` are tab-separated, ``.csv`` comma-separated (either may be gzipped:
``.csv.gz``) unless ``delimiter`` says otherwise, ``.parquet`` / ``.pq`` Parquet; text files
have a header row. Every file's columns are checked against its header before any row is
read; a header that is one column holding ``;``, ``,``, ``|`` or tabs names the separator the
file seems to use and the option that reads it.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.batch_rule import BatchSize
from ssl_rec.data.parsing import RowValidator, check_on_bad_row
from ssl_rec.data.preprocess import Layout, PreprocessOptions, preprocess
from ssl_rec.data.raw import RawPart
from ssl_rec.data.reading import (
    ParquetBatches,
    TextBatches,
    TextFormat,
    first_line,
    with_nan_spellings,
)
from ssl_rec.data.semi_supervised_loader import check_unlabeled_per_batch
from ssl_rec.data.split_plan import (
    Part,
    SplitPlan,
    plan_named,
    plan_single,
    split_columns,
    split_name,
)
from ssl_rec.data.storage import file_fingerprint
from ssl_rec.schema import FeatureSchema

SUFFIXES = {".csv": ",", ".tsv": "\t", ".txt": "\t", ".parquet": None, ".pq": None}
# Separators a one-column header is sniffed for, and the spellings a tab may be given in.
SEPARATORS = (";", ",", "|", "\t")
TAB_SPELLINGS = ("\\t", "tab", "TAB")


def check_delimiter(delimiter: str | None) -> str | None:
    r"""``delimiter`` as one character (``"\t"`` and ``"tab"`` mean a tab), or ``None``.

    Raises:
        ValueError: anything but one character other than a quote or a line break.

    """
    if delimiter is None:
        return None
    if delimiter in TAB_SPELLINGS:
        return "\t"
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in '"\r\n':
        raise ValueError(
            f"delimiter must be one character such as ';' or '|' (or '\\t' for a tab), "
            f"got {delimiter!r}"
        )
    return delimiter


def _suffix(path: Path) -> str:
    suffixes = [s for s in path.suffixes if s != ".gz"]
    suffix = suffixes[-1] if suffixes else ""
    if suffix not in SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; use one of {list(SUFFIXES)}")
    return suffix


def file_delimiter(path: Path, delimiter: str | None = None) -> str | None:
    """The column separator of a text file (``delimiter``, else by suffix); ``None``: Parquet."""
    by_suffix = SUFFIXES[_suffix(path)]
    return None if by_suffix is None else check_delimiter(delimiter) or by_suffix


def column_names(path: str | os.PathLike[str], delimiter: str | None = None) -> list[str]:
    """Header (CSV/TSV, plain or gzip) or schema (Parquet) column names of a tabular file.

    Args:
        path: the file.
        delimiter: the text file's separator (default by suffix; ignored for Parquet).

    """
    path = Path(path)
    delimiter = file_delimiter(path, delimiter)
    if delimiter is None:
        if not path.is_file():
            raise FileNotFoundError(f"tabular file not found: {path}")
        return list(pq.read_schema(path).names)
    header = first_line(path)
    if not header:
        raise ValueError(f"{path}: file is empty (expected a header line)")
    return next(csv.reader([header], delimiter=delimiter))


def sniffed_separator(available: list[str], delimiter: str | None) -> str | None:
    """The separator a one-column header seems to use instead of ``delimiter``, or ``None``."""
    if len(available) != 1:
        return None
    counts = {sep: available[0].count(sep) for sep in SEPARATORS if sep != delimiter}
    best = max(counts, key=lambda sep: counts[sep])
    return best if counts[best] else None


def header_error(path: str | os.PathLike[str], message: str, delimiter: str | None) -> ValueError:
    """``message`` about a header, or the file's likely separator when it read as one column."""
    path = Path(path)
    used = file_delimiter(path, delimiter)
    if used is not None:
        sep = sniffed_separator(column_names(path, used), used)
        if sep is not None:
            return ValueError(
                f"{path} looks like a {sep!r}-separated file: pass --data.delimiter {sep!r}"
            )
    return ValueError(message)


def check_columns(
    path: str | os.PathLike[str], wanted: list[str], label: str | None, delimiter: str | None = None
) -> bool:
    """Raise ``ValueError`` naming the file, the missing columns and the available ones.

    A one-column header holding another separator gets, instead, the separator to pass.

    Args:
        path: the file.
        wanted: columns every file must have (dense and categorical).
        label: the label column, or ``None``.
        delimiter: the text file's separator (default by suffix).

    Returns:
        Whether the file has the label column.

    """
    available = column_names(path, delimiter)
    unknown = [c for c in wanted if c not in available]
    if unknown:
        raise header_error(
            path, f"{path}: unknown columns {unknown}; available columns: {available}", delimiter
        )
    return label is not None and label in available


class _MissingParquet(ParquetBatches):
    """Parquet batches whose cells listed in ``missing_values`` become null.

    String cells equal to a listed spelling are null; floating-point NaN cells too when
    NaN is listed (:func:`~ssl_rec.data.reading.with_nan_spellings`), as its text is in a
    CSV file.
    """

    def __init__(self, path: Path, columns: list[str], missing: tuple[str, ...]) -> None:
        super().__init__(path, columns)
        missing = with_nan_spellings(missing)
        self.missing = pa.array(list(missing), pa.string())
        self.nan_missing = "nan" in missing  # with_nan_spellings lists it if any spelling

    def _nulled(self, column: pa.Array) -> pa.Array:
        text = pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
        if text and len(self.missing):  # large_string: what polars writes
            return pc.if_else(pc.is_in(column, value_set=self.missing), None, column)
        if pa.types.is_floating(column.type) and self.nan_missing:
            return pc.if_else(pc.is_nan(column), None, column)
        return column

    def __iter__(self):  # noqa: ANN204 - same as the parent
        """Yield ``(batch, first row)`` with missing spellings as null."""
        for batch, first in super().__iter__():
            cols = [self._nulled(c) for c in batch.columns]
            yield pa.RecordBatch.from_arrays(cols, names=batch.schema.names), first


def tabular_batches(
    path: str | os.PathLike[str],
    label: str | None,
    dense: list[str],
    categorical: list[str],
    on_bad_row: str = "raise",
    missing_values: tuple[str, ...] = ("",),
    delimiter: str | None = None,
    dense_transform: str = "log1p",
) -> RowValidator:
    """The validated batches of one CSV/TSV/Parquet file, read block by block.

    Args:
        path: the file.
        label: binary label column (the file must have it), or ``None`` for unlabeled.
        dense: numeric columns (missing -> 0 after ``dense_transform``).
        categorical: columns whose values (strings or ints) become ids.
        on_bad_row: ``"raise"`` or ``"skip"`` and count.
        missing_values: cells read as missing; listing NaN (any case) also makes
            ``nan`` / ``NaN`` / ``NAN`` text and a Parquet file's floating-point NaN missing.
        delimiter: a text file's column separator (default: by suffix).
        dense_transform: ``"log1p"``, ``"signed_log1p"`` or ``"none"``
            (:class:`~ssl_rec.data.preprocess.PreprocessOptions`).

    """
    path = Path(path)
    skip = check_on_bad_row(on_bad_row) == "skip"
    columns = [*dense, *categorical] + ([label] if label is not None else [])
    check_columns(path, columns, None, delimiter)
    delimiter = file_delimiter(path, delimiter)
    if delimiter is None:
        source = _MissingParquet(path, columns, tuple(missing_values))
        return RowValidator(source, dense, categorical, label, skip, "row", dense_transform)
    fmt = TextFormat(delimiter, header=True)
    source = TextBatches(path, fmt, None, columns, tuple(missing_values), skip)
    return RowValidator(source, dense, categorical, label, skip, "line", dense_transform)


def read_tabular(
    path: str | os.PathLike[str],
    label: str | None,
    dense: list[str],
    categorical: list[str],
    on_bad_row: str = "raise",
    missing_values: tuple[str, ...] = ("",),
    delimiter: str | None = None,
    dense_transform: str = "log1p",
) -> RawPart:
    """Read and validate one whole file into memory (see :func:`tabular_batches`)."""
    batches = list(tabular_batches(path, label, dense, categorical, on_bad_row, missing_values,
                                   delimiter, dense_transform))  # fmt: skip
    part = RawPart.from_batches(batches, len(dense), str(path))
    if part.num_rows == 0:
        raise ValueError(f"{path}: no data rows")
    return part


def read_tabular_columns(
    path: str | os.PathLike[str], columns: list[str], delimiter: str | None = None
) -> pa.Table:
    """Raw values of ``columns`` of every row of a tabular file (text, or Parquet types)."""
    path = Path(path)
    columns = list(columns)
    check_columns(path, columns, None, delimiter)
    delimiter = file_delimiter(path, delimiter)
    if delimiter is None:
        batches = ParquetBatches(path, columns)
    else:
        batches = TextBatches(path, TextFormat(delimiter, header=True), None, columns, ())
    tables = [pa.Table.from_batches([batch]).select(columns) for batch, _ in batches]
    return pa.concat_tables(tables)


def find_split_files(directory: Path) -> dict[str, list[str]]:
    """``split -> [file]`` for a directory of ``train.*`` / ``valid|val.*`` / ``test.*`` files."""
    found: dict[str, list[str]] = {}
    for p in sorted(directory.iterdir()):
        name = split_name(str(p))
        if p.is_file() and name and p.suffix in (*SUFFIXES, ".gz"):
            found.setdefault(name, []).append(str(p))
    if "train" not in found:
        raise ValueError(
            f"{directory}: no train.* file; files are {sorted(q.name for q in directory.iterdir())}"
        )
    return found


class TabularDataModule(ArrowDataModule):
    r"""Any CSV / TSV / Parquet table with named label, dense and categorical columns.

    Args:
        path: one file (split randomly) or a directory of ``train`` / ``valid`` (or
            ``val``) / ``test`` files (a split without a labeled file is drawn from train).
        label: binary label column; ``None`` for unlabeled data (pretraining, with
            ``use_labels=False``). Training files must have it.
        dense: numeric columns.
        categorical: categorical columns (string or integer raw values).
        preprocess: vocabulary, split, missing-value and bad-row options.
        batch_size: rows per training batch, or ``"auto"`` (chosen from the training rows).
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root.
        eval_batch_size: rows per validation, test and predict batch (default
            ``batch_size``); evaluation keeps no activations for backward, so it can be
            much larger than a small labeled subset's training batch.
        delimiter: column separator of the CSV / TSV files (one character, e.g. ``";"`` or
            ``"|"``; ``"\t"`` or ``"tab"`` for a tab); default by suffix: ``,`` for ``.csv``,
            a tab for ``.tsv`` / ``.txt``. Parquet files ignore it.
        unlabeled_per_batch: unlabeled training rows (label NaN) added to each training
            batch, per labeled row: semi-supervised training with ``label_fraction < 1``
            (:class:`~ssl_rec.data.ArrowDataModule`); ``0`` trains on labeled rows only.
            With ``unlabeled_path`` the pool is that file's rows (plus the rest of the
            training split when ``label_fraction < 1``), and ``label_fraction`` may be 1.
        unlabeled_path: one CSV / TSV / Parquet file of rows without labels: the dense and
            categorical columns of ``path``, no label column. Its rows are encoded with the
            vocabulary fitted on the labeled training split (their values unseen there get
            id 0 and are counted), never refit on them, so a model trained with or without
            the file has the same vocabulary and dense statistics. They feed the
            semi-supervised mix (``unlabeled_per_batch``) or, with ``use_labels=False``,
            join the training rows for pretraining; never validation or test.

    """

    def __init__(
        self,
        path: str,
        label: str | None = None,
        dense: list[str] | None = None,
        categorical: list[str] | None = None,
        preprocess: PreprocessOptions | None = None,
        batch_size: BatchSize = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        eval_batch_size: int | None = None,
        delimiter: str | None = None,
        unlabeled_per_batch: float = 0.0,
        unlabeled_path: str | None = None,
    ) -> None:
        # With an unlabeled file the mix is checked below, against the file. No local
        # variable before _record_hparams(locals()): it would be recorded as an argument.
        super().__init__(
            **self._base_arguments(
                locals(), unlabeled_per_batch=0.0 if unlabeled_path else unlabeled_per_batch
            )
        )
        self._record_hparams(locals())
        self.unlabeled_path = None if unlabeled_path is None else str(unlabeled_path)
        if self.unlabeled_path is not None:
            self.unlabeled_per_batch = check_unlabeled_per_batch(
                unlabeled_per_batch, use_labels, label_fraction, unlabeled_file=True
            )
        self._unlabeled: TabularDataModule | None = None
        self.delimiter = check_delimiter(delimiter)
        self.dense, self.categorical = list(dense or []), list(categorical or [])
        if not self.dense and not self.categorical:
            raise ValueError("TabularDataModule needs at least one dense or categorical column")
        if label is None and use_labels:
            raise ValueError(
                "TabularDataModule: label=None (unlabeled data) needs use_labels=False"
            )
        self.path, self.label = path, label
        self.options = preprocess or PreprocessOptions()

    cache_kind = "tabular"

    def _labeled(self, path: str) -> bool:
        return check_columns(path, [*self.dense, *self.categorical], self.label, self.delimiter)

    def plan(self) -> SplitPlan:
        """Which rows of which file go to which split; every header is checked first."""
        p = Path(self.path)
        if not p.exists():
            raise FileNotFoundError(f"tabular data not found: {p}")
        o = self.options
        fractions = (o.val_fraction, o.test_fraction, o.split_seed)
        if p.is_dir():
            plan = plan_named(find_split_files(p), self._labeled, *fractions)
        else:
            plan = plan_single(str(p), self._labeled(str(p)), *fractions)
        for part in plan.parts:
            if self.label is not None and "train" in plan.splits_of(part) and not part.labeled:
                raise header_error(
                    part.path,
                    f"{part.path}: label column {self.label!r} not found; available columns: "
                    f"{column_names(part.path, self.delimiter)}",
                    self.delimiter,
                )
        return plan

    def cache_inputs(self) -> dict[str, Any]:
        """Fingerprints of the files, the plan, column roles and options."""
        plan = self.plan()
        inputs = {"files": file_fingerprint([p.path for p in plan.parts]), "plan": plan.to_dict(),
                  "label": self.label, "dense": self.dense, "categorical": self.categorical,
                  "options": self.options.to_dict()}  # fmt: skip
        # Only when set: entries built before the option existed keep their names.
        return inputs if self.delimiter is None else {**inputs, "delimiter": self.delimiter}

    def _open(self, part: Part) -> RowValidator:
        o = self.options
        label = self.label if part.labeled else None
        return tabular_batches(part.path, label, self.dense, self.categorical, o.on_bad_row,
                               o.missing_values, self.delimiter, o.parse_transform)  # fmt: skip

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Preprocess the files into ``out_dir``."""
        layout = Layout(tuple(self.dense), tuple(self.categorical), self.label)
        return preprocess(self.plan(), self._open, layout, self.options, out_dir, final_dir,
                          self.given_vocabulary)  # fmt: skip

    def check_unlabeled_file(self) -> None:
        """Check ``unlabeled_path``'s header: it exists, has every feature column, no label.

        Raises:
            FileNotFoundError: the file does not exist.
            ValueError: naming the file, when it is a directory, lacks a dense or categorical
                column of the data, or has the label column (labeled rows belong in ``path``).

        """
        if self.unlabeled_path is None:
            return
        p = Path(self.unlabeled_path)
        if not p.exists():
            raise FileNotFoundError(f"unlabeled_path not found: {p}")
        if p.is_dir():
            raise ValueError(f"unlabeled_path must be one file, {p} is a directory")
        try:
            labeled = check_columns(p, [*self.dense, *self.categorical], self.label,
                                    self.delimiter)  # fmt: skip
        except ValueError as e:
            raise ValueError(f"unlabeled_path: {e}") from e
        if labeled:
            raise ValueError(
                f"unlabeled_path {p} has the label column {self.label!r}; it is for rows "
                "without labels (put labeled rows in --data.path)"
            )

    def unlabeled_file_rows(self) -> pa.Table | None:
        """``unlabeled_path``'s rows encoded with the training vocabulary (``None``: no file).

        Preprocessed once into its own cache entry (every row in its ``train`` split), keyed
        by the file and the vocabulary's fingerprints.
        """
        if self.unlabeled_path is None:
            return None
        if self._unlabeled is None:
            self.check_unlabeled_file()
            # The training rows' per-column transforms: the file's own rows do not decide.
            transforms = self.dense_transforms or self.options.dense_transform
            options = dataclasses.replace(self.options, val_fraction=0.0, test_fraction=0.0,
                                          dense_transform=transforms)  # fmt: skip
            module = TabularDataModule(
                self.unlabeled_path, None, self.dense, self.categorical, options,
                use_labels=False, cache_dir=str(self.cache_dir), delimiter=self.delimiter,
            )  # fmt: skip
            module.use_vocabulary(self.vocabulary)
            self._unlabeled = module
        return self._unlabeled.split_table("train")

    def read_raw_columns(self, split: str, columns: list[str]) -> pa.Table:
        """``columns`` of ``split``'s rows as read from the files (text, or Parquet types)."""
        return split_columns(
            self.plan(), split, lambda p: read_tabular_columns(p, columns, self.delimiter)
        )
