"""Criteo Display Advertising Challenge / Terabyte TSV files: the reader and the data module.

One row per line, tab-separated, no header: ``label, I1..I13, C1..C26`` (40 columns), or
39 columns without the label (Kaggle's test file). Dense values are integers (``I2`` may
be negative), categorical values 8-hex-digit hashes; an empty cell is missing. Files may
be gzip-compressed. Files are read in blocks (``pyarrow.csv`` streaming), so memory does
not grow with their length. Layouts (:mod:`ssl_rec.data.split_plan`): one file (random split),
Kaggle's ``train.txt`` (+ unlabeled ``test.txt``: val and test are drawn from train), a
directory of ``train*`` / ``val*`` / ``test*`` files, or Terabyte's ``day_0 .. day_23``
(train on days 0-22, test / val = first / second half of day 23).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.batch_rule import BatchSize
from ssl_rec.data.parsing import RowValidator, check_on_bad_row
from ssl_rec.data.preprocess import Layout, PreprocessOptions, preprocess
from ssl_rec.data.raw import RawPart
from ssl_rec.data.reading import TextBatches, TextFormat, first_line
from ssl_rec.data.split_plan import (
    Part,
    SplitPlan,
    natural_key,
    plan_days,
    plan_named,
    plan_single,
    split_columns,
    split_name,
)
from ssl_rec.data.storage import file_fingerprint
from ssl_rec.schema import CRITEO_CATEGORICAL, CRITEO_DENSE, CRITEO_LABEL, FeatureSchema

N_COLUMNS_LABELED = 1 + len(CRITEO_DENSE) + len(CRITEO_CATEGORICAL)
CRITEO_TSV = TextFormat("\t", header=False, quoting=False, skip_blank_lines=False)
log = logging.getLogger(__name__)


def detect_has_label(path: str | os.PathLike[str]) -> bool:
    """Whether a Criteo file has the label column, from its first line's column count.

    Raises:
        FileNotFoundError: no such file.
        ValueError: empty file, or a first line with neither 40 nor 39 columns.

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Criteo file not found: {path}")
    first = first_line(path)
    if not first:
        raise ValueError(f"{path}: file is empty (expected Criteo TSV rows)")
    n = first.count("\t") + 1
    if n not in (N_COLUMNS_LABELED, N_COLUMNS_LABELED - 1):
        raise ValueError(
            f"{path}, line 1: expected {N_COLUMNS_LABELED} (labeled) or "
            f"{N_COLUMNS_LABELED - 1} (unlabeled) tab-separated columns, got {n}"
        )
    return n == N_COLUMNS_LABELED


def criteo_batches(
    path: str | os.PathLike[str],
    has_label: bool | None = None,
    on_bad_row: str = "raise",
    missing_values: tuple[str, ...] = ("",),
    dense_transform: str = "log1p",
) -> RowValidator:
    """The validated batches of one Criteo file (plain or gzip), read block by block.

    Args:
        path: the file.
        has_label: whether the first column is the label; ``None`` detects it from the
            column count of the first line (40 vs 39).
        on_bad_row: ``"raise"`` a ``ValueError`` naming file and line, or ``"skip"`` bad
            rows (wrong column count, non-numeric or non-finite dense value, label not 0/1).
        missing_values: cells read as missing.
        dense_transform: ``"log1p"`` (DLRM's: negative counts become 0), ``"signed_log1p"``
            or ``"none"`` (:class:`~ssl_rec.data.preprocess.PreprocessOptions`).

    Returns:
        An iterable of :class:`~ssl_rec.data.raw.RawBatch` (dense already transformed).

    """
    skip = check_on_bad_row(on_bad_row) == "skip"
    detected = detect_has_label(path)
    if has_label is not None and has_label != detected:
        raise ValueError(
            f"{path}: has_label={has_label} but line 1 has "
            f"{N_COLUMNS_LABELED if detected else N_COLUMNS_LABELED - 1} columns"
        )
    names = ([CRITEO_LABEL] if detected else []) + [*CRITEO_DENSE, *CRITEO_CATEGORICAL]
    source = TextBatches(
        path, CRITEO_TSV, names, None, missing_values, skip, dictionary=CRITEO_CATEGORICAL
    )
    label = CRITEO_LABEL if detected else None
    return RowValidator(source, list(CRITEO_DENSE), list(CRITEO_CATEGORICAL), label, skip,
                        "line", dense_transform)  # fmt: skip


def read_criteo(
    path: str | os.PathLike[str],
    has_label: bool | None = None,
    on_bad_row: str = "raise",
    missing_values: tuple[str, ...] = ("",),
) -> RawPart:
    """Read and validate one whole Criteo file into memory (see :func:`criteo_batches`).

    Returns:
        The file's validated rows (dense already ``log1p``-transformed); ``skipped`` counts
        the dropped bad rows.

    """
    batches = list(criteo_batches(path, has_label, on_bad_row, missing_values))
    part = RawPart.from_batches(batches, len(CRITEO_DENSE), str(path))
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
    batches = TextBatches(path, CRITEO_TSV, names, list(columns), missing_values=())
    schema = pa.schema([(c, pa.string()) for c in columns])
    return pa.Table.from_batches([batch for batch, _ in batches], schema)


def _data_files(directory: Path) -> list[str]:
    return sorted(
        (str(q) for q in directory.iterdir() if q.is_file() and not q.name.startswith(".")),
        key=natural_key,
    )


def criteo_plan(path: str | list[str], options: PreprocessOptions) -> SplitPlan:
    """The :class:`~ssl_rec.data.split_plan.SplitPlan` of a Criteo file, directory or day files."""
    labeled = detect_has_label
    fractions = (options.val_fraction, options.test_fraction, options.split_seed)
    if isinstance(path, (list, tuple)):
        return plan_days([str(p) for p in path], labeled)
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"Criteo data not found: {p}")
    if p.is_file():
        return plan_single(str(p), labeled(p), *fractions)
    files = _data_files(p)
    if not files:
        raise ValueError(f"{p}: no data files in the directory")
    named: dict[str, list[str]] = {}
    for f in files:
        if split_name(f):
            named.setdefault(split_name(f), []).append(f)
    if "train" in named:
        return plan_named(named, labeled, *fractions)
    return plan_days(files, labeled)


def criteo_split_files(path: str | list[str]) -> dict[str, list[str]] | None:
    """``split -> files`` for a directory or list of Criteo files; ``None`` for one file."""
    plan = criteo_plan(path, PreprocessOptions())
    if len(plan.parts) == 1 and plan.parts[0].mode == "random":
        return None
    return {s: plan.files(s) for s in ("train", "val", "test") if plan.files(s)}


class CriteoDataModule(ArrowDataModule):
    """Criteo Display Advertising Challenge / Terabyte TSV files (plain or ``.gz``).

    Args:
        path: one file (split randomly by ``preprocess`` fractions), a directory (Kaggle's
            ``train.txt`` [+ ``test.txt``], ``train*``/``val*``/``test*`` files, or day files:
            days 0..n-2 train, the last cut in halves: test, val), or a list of day files.
        has_label: whether files have the label column; ``None`` detects it per file.
        preprocess: vocabulary, split, missing-value and bad-row options.
        batch_size: rows per training batch, or ``"auto"`` (chosen from the training rows).
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed.
        cache_dir: cache root.
        drop_last: drop the last incomplete training batch.
        eval_batch_size: rows per validation, test and predict batch (default
            ``batch_size``); evaluation keeps no activations for backward, so it can be
            much larger than a small labeled subset's training batch.
        unlabeled_per_batch: unlabeled training rows (label NaN) added to each training
            batch, per labeled row: semi-supervised training with ``label_fraction < 1``
            (:class:`~ssl_rec.data.ArrowDataModule`); ``0`` trains on labeled rows only.

    """

    def __init__(
        self,
        path: str | list[str],
        has_label: bool | None = None,
        preprocess: PreprocessOptions | None = None,
        batch_size: BatchSize = 4096,
        label_fraction: float = 1.0,
        use_labels: bool = True,
        seed: int = 0,
        cache_dir: str | None = None,
        drop_last: bool = False,
        eval_batch_size: int | None = None,
        unlabeled_per_batch: float = 0.0,
    ) -> None:
        super().__init__(**self._base_arguments(locals()))
        self._record_hparams(locals())
        self.path, self.has_label = path, has_label
        self.options = preprocess or PreprocessOptions()

    cache_kind = "criteo"

    def plan(self) -> SplitPlan:
        """Which rows of which file go to which split."""
        return criteo_plan(self.path, self.options)

    def cache_inputs(self) -> dict[str, Any]:
        """Fingerprints of the files, the plan and the options."""
        plan = self.plan()
        return {"files": file_fingerprint([p.path for p in plan.parts]), "plan": plan.to_dict(),
                "has_label": self.has_label, "options": self.options.to_dict()}  # fmt: skip

    def _open(self, part: Part) -> RowValidator:
        o = self.options
        return criteo_batches(part.path, self.has_label, o.on_bad_row, o.missing_values,
                              o.parse_transform)  # fmt: skip

    def read_raw_columns(self, split: str, columns: list[str]) -> pa.Table:
        """``columns`` of ``split``'s rows as text, read back from the files."""
        return split_columns(self.plan(), split, lambda p: read_criteo_columns(p, columns))

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Preprocess the files into ``out_dir``."""
        layout = Layout(CRITEO_DENSE, CRITEO_CATEGORICAL, CRITEO_LABEL)
        return preprocess(self.plan(), self._open, layout, self.options, out_dir, final_dir,
                          self.given_vocabulary)  # fmt: skip
