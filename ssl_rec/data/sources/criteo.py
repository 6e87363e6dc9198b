"""Criteo Display Advertising Challenge / Terabyte TSV files: the reader and the data module.

One row per line, tab-separated, no header: ``label, I1..I13, C1..C26`` (40 columns), or
39 columns without the label (Kaggle's test file). Dense values are integers (``I2`` may
be negative), categorical values 8-hex-digit hashes; an empty cell is missing. Files may
be gzip-compressed (``.gz``). Parsing uses ``pyarrow.csv`` (multithreaded C++).
"""

from __future__ import annotations

import gzip
import logging
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.parsing import Origin, check_on_bad_row, parse_dense, parse_label
from ssl_rec.data.preprocess import Layout, PartReader, PreprocessOptions, preprocess
from ssl_rec.data.raw import RawPart
from ssl_rec.data.storage import SPLIT_NAMES, file_fingerprint
from ssl_rec.schema import CRITEO_CATEGORICAL, CRITEO_DENSE, CRITEO_LABEL, FeatureSchema
from ssl_rec.vocabulary import CodedColumn

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


def read_criteo_columns(path: str | os.PathLike[str], columns: list[str]) -> pa.Table:
    """Raw text of ``columns`` (``label``, ``I1``.., ``C1``..) of every row of a Criteo file."""
    path = Path(path)
    names = ([CRITEO_LABEL] if detect_has_label(path) else []) + [
        *CRITEO_DENSE,
        *CRITEO_CATEGORICAL,
    ]
    unknown = [c for c in columns if c not in names]
    if unknown:
        raise ValueError(f"{path}: unknown columns {unknown}; Criteo columns are {names}")
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=names, block_size=8 << 20),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(
            include_columns=columns, column_types={c: pa.string() for c in columns},
        ),
    )  # fmt: skip


def _natural_key(path: str) -> list[object]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", Path(path).name)]


def _day_splits(files: list[str]) -> dict[str, list[str]]:
    if len(files) < 3:
        raise ValueError(
            f"splitting by file needs >= 3 files (train..., val, test), got {len(files)}: {files}"
        )
    files = sorted(files, key=_natural_key)
    return {"train": files[:-2], "val": [files[-2]], "test": [files[-1]]}


def criteo_split_files(path: str | list[str]) -> dict[str, list[str]] | None:
    """``split -> files`` for a directory or list of Criteo files; ``None`` for one file.

    A directory with ``train*`` / ``val*`` / ``test*`` files uses those names; otherwise
    files are ordered by name (``day_0 .. day_23``) and the last two are val and test.
    """
    if isinstance(path, list):
        return _day_splits([str(p) for p in path])
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"Criteo data not found: {p}")
    if p.is_file():
        return None
    files = [str(q) for q in p.iterdir() if q.is_file() and not q.name.startswith(".")]
    named: dict[str, list[str]] = {}
    for f in files:
        stem = Path(f).name.split(".")[0].split("_")[0].lower()
        if stem in SPLIT_NAMES:
            named.setdefault(SPLIT_NAMES[stem], []).append(f)
    if "train" in named:
        return {k: sorted(v, key=_natural_key) for k, v in named.items()}
    return _day_splits(files)


class CriteoDataModule(ArrowDataModule):
    """Criteo Display Advertising Challenge / Terabyte TSV files (plain or ``.gz``).

    Args:
        path: one file (split randomly by ``preprocess`` fractions), a directory
            (``train``/``val``/``test`` files, or days: last two = val, test), or a list of
            files in day order.
        has_label: whether files have the label column; ``None`` detects it per file.
        preprocess: vocabulary, split and bad-row options.
        batch_size: rows per batch.
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root.
        drop_last: drop the last incomplete training batch.

    """

    def __init__(
        self,
        path: str | list[str],
        has_label: bool | None = None,
        preprocess: PreprocessOptions | None = None,
        batch_size: int = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        drop_last: bool = False,
    ) -> None:
        super().__init__(batch_size, label_fraction, use_labels, seed, cache_dir, drop_last)
        self._record_hparams(locals())
        self.path, self.has_label = path, has_label
        self.options = preprocess or PreprocessOptions()

    cache_kind = "criteo"

    def _files(self) -> tuple[dict[str, list[str]] | None, list[str]]:
        split_files = criteo_split_files(self.path)
        files = [str(self.path)] if split_files is None else sum(split_files.values(), [])
        return split_files, files

    def cache_inputs(self) -> dict[str, Any]:
        """Fingerprints of the files, their split assignment and the options."""
        split_files, files = self._files()
        return {"files": file_fingerprint(files), "splits": split_files,
                "has_label": self.has_label, "options": self.options.to_dict()}  # fmt: skip

    def read_raw_columns(self, split: str, columns: list[str]) -> pa.Table:
        """``columns`` of ``split``'s rows as text, read back from the files."""
        split_files, files = self._files()
        reader = PartReader(read_criteo, split_files, self.options)
        return reader.raw_columns(split, files, lambda p: read_criteo_columns(p, columns))

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Preprocess the files into ``out_dir``."""
        split_files, files = self._files()
        reader = PartReader(
            lambda p: read_criteo(p, self.has_label, self.options.on_bad_row),
            split_files, self.options,
        )  # fmt: skip
        layout = Layout(CRITEO_DENSE, CRITEO_CATEGORICAL, CRITEO_LABEL)
        return preprocess(reader, files, layout, self.options, out_dir, final_dir,
                          self.given_vocabulary)  # fmt: skip
