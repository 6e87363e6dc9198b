"""Raw files -> id-encoded Arrow splits: split assignment, vocabularies, encoding, writing.

Two passes over the training parts: count raw values per field (fit the vocabularies on
training rows only), then encode every split and append it to its Arrow file. A part is
one file (split by file or day) or one split's rows of a file (random split); a one-entry
memo reads a randomly split file once. Given a model's vocabularies, the fitting pass is
skipped and values the vocabularies do not know get id 0, counted per split and field.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from ssl_rec.data.parsing import check_on_bad_row
from ssl_rec.data.raw import RawPart
from ssl_rec.data.storage import SPLITS, SplitWriter, split_schema
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.vocabularies import VOCABULARY_FILENAME, Vocabularies, count_unseen
from ssl_rec.vocabulary import (
    VOCAB_DIRNAME,
    Vocabulary,
    count_values,
    merge_counts,
)

WRITE_ROWS = 65536
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreprocessOptions:
    """How raw files become ids and splits.

    Args:
        min_frequency: raw values seen fewer times in training map to id 0.
        max_vocab_size: a field with more ids (including 0) is hashed into this many;
            ``None`` keeps every value.
        val_fraction: fraction of rows for validation when one file is split randomly.
        test_fraction: fraction of rows for test when one file is split randomly; 1 makes
            every row a test row (a new file scored with a model's vocabulary).
        on_bad_row: ``"raise"`` or ``"skip"`` (count, warn, and record in the schema).
        split_seed: seed of the random split.

    """

    min_frequency: int = 1
    max_vocab_size: int | None = None
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    on_bad_row: str = "raise"
    split_seed: int = 0

    def __post_init__(self) -> None:
        if self.min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {self.min_frequency}")
        if self.max_vocab_size is not None and self.max_vocab_size < 2:
            raise ValueError(f"max_vocab_size must be >= 2 or None, got {self.max_vocab_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if not 0.0 <= self.test_fraction <= 1.0:
            raise ValueError(f"test_fraction must be in [0, 1], got {self.test_fraction}")
        if self.val_fraction + self.test_fraction > 1.0:
            raise ValueError(
                f"val_fraction + test_fraction must be <= 1, got "
                f"{self.val_fraction} + {self.test_fraction}"
            )
        check_on_bad_row(self.on_bad_row)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (part of the cache key and schema metadata)."""
        return asdict(self)


@dataclass(frozen=True)
class Layout:
    """Column names of the output schema.

    Args:
        dense: dense column names (``n_dense``).
        categorical: categorical field names (``F``).
        label: label column name.

    """

    dense: tuple[str, ...]
    categorical: tuple[str, ...]
    label: str


class PartReader:
    """Reads parts ``(path, split)``; a randomly split file is read once and memoised.

    Args:
        read: ``read(path) -> RawPart`` for one file.
        split_files: ``split -> files`` when splitting by file; ``None`` for random split.
        options: fractions and seed of the random split.

    """

    def __init__(
        self,
        read: Callable[[str], RawPart],
        split_files: dict[str, list[str]] | None,
        options: PreprocessOptions,
    ) -> None:
        self._read, self._split_files, self._options = read, split_files, options
        self._memo: tuple[str, RawPart] | None = None

    def parts(self, split: str, files: list[str]) -> list[tuple[str, str]]:
        """List the ``(path, split)`` parts of ``split``."""
        if self._split_files is not None:
            return [(p, split) for p in self._split_files.get(split, [])]
        return [(p, split) for p in files]

    def __call__(self, path: str, split: str) -> RawPart:
        """Rows of ``path`` belonging to ``split``."""
        if self._memo is None or self._memo[0] != path:
            self._memo = (path, self._read(path))
        part = self._memo[1]
        if self._split_files is not None:
            return part
        return part.take(split_mask(part.num_rows, split, self._options))

    def raw_columns(
        self, split: str, files: list[str], read: Callable[[str], pa.Table]
    ) -> pa.Table:
        """Columns ``read(path)`` of ``split``'s rows, in the order preprocessing wrote them."""
        tables = []
        for path, s in self.parts(split, files):
            table = read(path)
            if self._split_files is None:
                table = table.filter(pa.array(split_mask(table.num_rows, s, self._options)))
            tables.append(table)
        return pa.concat_tables(tables)


def split_mask(n: int, split: str, options: PreprocessOptions) -> np.ndarray:
    """``bool[n]``: the rows of a randomly split file that belong to ``split``."""
    r = np.random.default_rng(options.split_seed).random(n)
    test, val = options.test_fraction, options.test_fraction + options.val_fraction
    which = np.where(r < test, 2, np.where(r < val, 1, 0))
    return which == SPLITS.index(split)


def fit_vocabularies(
    parts: list[RawPart], layout: Layout, options: PreprocessOptions
) -> list[Vocabulary]:
    """Count raw values over the training parts and fit one vocabulary per field."""
    vocabs = []
    for f in range(len(layout.categorical)):
        counts = merge_counts([count_values(p.categorical[f]) for p in parts])
        vocabs.append(Vocabulary.fit(*counts, options.min_frequency, options.max_vocab_size))
    return vocabs


def encode_part(part: RawPart, vocabs: list[Vocabulary], unseen: np.ndarray | None = None
                ) -> np.ndarray:  # fmt: skip
    """``int32[N, F]`` ids of a part's categorical columns; adds unseen values to ``unseen[F]``."""
    sparse = np.empty((part.num_rows, len(vocabs)), np.int32)
    for f, vocab in enumerate(vocabs):
        sparse[:, f] = vocab.encode(part.categorical[f])
        if unseen is not None:
            unseen[f] += count_unseen(sparse[:, f], part.categorical[f])
    return sparse


def _write_split(
    path: Path, parts: list[RawPart], vocabs: list[Vocabulary], n_dense: int, labeled: bool
) -> tuple[int, np.ndarray]:
    unseen = np.zeros(len(vocabs), np.int64)
    with SplitWriter(path, split_schema(n_dense, len(vocabs), labeled, False)) as writer:
        for part in parts:
            sparse = encode_part(part, vocabs, unseen)
            for s in range(0, max(part.num_rows, 1), WRITE_ROWS):
                stop = s + WRITE_ROWS
                label = None if part.label is None else part.label[s:stop]
                if part.num_rows:
                    writer.write(part.dense[s:stop], sparse[s:stop], label)
        return writer.rows, unseen


def given_vocabularies(vocabularies: Vocabularies, layout: Layout) -> list[Vocabulary]:
    """The vocabularies of ``layout``'s fields, in order (``ValueError`` if the fields differ)."""
    if vocabularies.names != list(layout.categorical):
        raise ValueError(
            f"the model's vocabulary has categorical fields {vocabularies.names}, the data "
            f"{list(layout.categorical)}; use the fields (in the order) the model was trained on"
        )
    return [vocabularies[name] for name in layout.categorical]


def report_unseen(split: str, rows: int, unseen: dict[str, int]) -> None:
    """Log one line: how many values of ``split`` the model's vocabulary does not know."""
    seen = {name: n for name, n in unseen.items() if n}
    if not seen:
        return
    detail = ", ".join(f"{name} {n}" for name, n in sorted(seen.items(), key=lambda kv: -kv[1]))
    log.warning("%s split: %d values unseen by the model's vocabulary use id 0 (%d rows; %s)",
                split, sum(seen.values()), rows, detail)  # fmt: skip


def _labeled(split: str, parts: list[RawPart]) -> bool:
    flags = {p.label is not None for p in parts}
    if len(flags) > 1:
        raise ValueError(f"split {split!r} mixes labeled and unlabeled files: "
                         f"{[p.source for p in parts]}")  # fmt: skip
    return flags.pop() if flags else True


def preprocess(
    reader: PartReader,
    files: list[str],
    layout: Layout,
    options: PreprocessOptions,
    out_dir: Path,
    final_dir: Path,
    vocabularies: Vocabularies | None = None,
) -> FeatureSchema:
    """Fit vocabularies on the training parts (unless given), write every split, return the schema.

    Args:
        reader: yields the rows of each part.
        files: input files (used by a random split; by-file splits use the reader's map).
        layout: output column names.
        options: preprocessing options.
        out_dir: directory being written (a temporary one).
        final_dir: where ``out_dir`` will live; stored in ``metadata["vocab_dir"]``.
        vocabularies: a model's vocabularies to encode with instead of fitting new ones;
            values they do not know get id 0 and are counted in ``metadata["unseen_values"]``.

    """
    plan = {s: reader.parts(s, files) for s in SPLITS}
    fit = vocabularies is None
    progress = tqdm(total=sum(map(len, plan.values())) + fit * len(plan["train"]),
                    desc="preprocess")  # fmt: skip
    if fit:
        vocabs = _fit(reader, plan["train"], layout, options, progress)
        vocabularies = Vocabularies(dict(zip(layout.categorical, vocabs, strict=True)),
                                    options.min_frequency, options.max_vocab_size)  # fmt: skip
    else:
        vocabs = given_vocabularies(vocabularies, layout)
    splits_meta: dict[str, Any] = {}
    unseen_meta: dict[str, dict[str, int]] = {}
    skipped_by_file: dict[str, int] = {}
    for split in SPLITS:
        parts = []
        for path, s in plan[split]:
            parts.append(reader(path, s))
            progress.update()
        skipped_by_file.update({p.source: p.skipped for p in parts})
        labeled = _labeled(split, parts)
        path = out_dir / f"{split}.arrow"
        rows, unseen = _write_split(path, parts, vocabs, len(layout.dense), labeled)
        unseen_meta[split] = dict(zip(layout.categorical, unseen.tolist(), strict=True))
        if not fit:
            report_unseen(split, rows, unseen_meta[split])
        splits_meta[split] = {
            "rows": rows,
            "labeled": labeled,
            "skipped_rows": int(sum({p.source: p.skipped for p in parts}.values())),
            "files": sorted({p.source for p in parts}),
        }
    progress.close()
    for name, vocab in zip(layout.categorical, vocabs, strict=True):
        vocab.save(out_dir / VOCAB_DIRNAME, name)
    if fit:
        vocabularies.save(out_dir / VOCABULARY_FILENAME)
    fields = [CategoricalField(n, v.cardinality) for n, v in zip(layout.categorical, vocabs,
                                                                   strict=True)]  # fmt: skip
    skipped = int(sum(skipped_by_file.values()))
    metadata = {
        "options": options.to_dict(),
        "splits": splits_meta,
        "skipped_rows": skipped,
        "vocab_dir": str(final_dir / VOCAB_DIRNAME),
        "hashed_fields": [n for n, v in zip(layout.categorical, vocabs, strict=True) if v.hashed],
        "vocabulary": vocabularies.fingerprints(),
        "vocabulary_given": not fit,
    }
    if not fit:
        metadata["unseen_values"] = unseen_meta
    if skipped:
        log.warning("skipped %d bad rows in total (on_bad_row='skip')", skipped)
    return FeatureSchema(layout.dense, tuple(fields), layout.label, metadata)


def _fit(
    reader: PartReader,
    train: list[tuple[str, str]],
    layout: Layout,
    options: PreprocessOptions,
    progress: tqdm,
) -> list[Vocabulary]:
    parts = []
    for path, split in train:
        parts.append(reader(path, split))
        progress.update()
    if sum(p.num_rows for p in parts) == 0:
        raise ValueError(
            f"no training rows in {[p for p, _ in train]} to fit a vocabulary on "
            f"(test_fraction={options.test_fraction}); a file of test rows only needs a "
            "model's vocabulary (ssl-rec test/predict --ckpt_path, or datamodule.use_vocabulary)"
        )
    return fit_vocabularies(parts, layout, options)
