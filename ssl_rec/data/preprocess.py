"""Raw files -> id-encoded, sharded Arrow splits, streaming in memory bounded by the vocabularies.

Two passes over record batches, never a whole file in memory:

1. **count** (skipped when a model's vocabularies are given): parse each training file once,
   count the raw values of every field over the training rows
   (:class:`~ssl_rec.data.counting.ValueCounter`), and spill the parsed batches to disk when
   it has room (:mod:`ssl_rec.data.spill`); then fit one :class:`Vocabulary` per field;
2. **encode**: read every file (training files from their spill), map values to ids
   (:class:`~ssl_rec.data.lookup.VocabularyLookup`; values given vocabularies do not know
   -> 0, counted per split and field) and append the rows to their split's shards
   (:class:`~ssl_rec.data.split_routes.SplitRoutes`).

Peak memory is the vocabularies (about 16 bytes per distinct value of at most 8 bytes while
counting, about 27 per kept value in the lookups' key tables while encoding) plus a few
blocks of rows; the split of every row is a pure function of the plan
(:mod:`ssl_rec.data.split_plan`), so the output is the same bit for bit whatever the block size.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ssl_rec.data import spill as spill_module
from ssl_rec.data.counting import ValueCounter
from ssl_rec.data.dense_transforms import (
    AUTO_TRANSFORM,
    TRANSFORMS_KEY,
    ColumnMinimum,
    apply_column_transforms,
    auto_transforms,
    check_dense_transform_option,
    column_transforms,
    decided_per_column,
    parse_time_transform,
)
from ssl_rec.data.lookup import VocabularyLookup, dictionary_counts
from ssl_rec.data.oov_report import report_rare_in_training, report_unseen
from ssl_rec.data.parsing import check_on_bad_row
from ssl_rec.data.progress import PassProgress
from ssl_rec.data.raw import RawBatch
from ssl_rec.data.reading import ordered_map, prefetch
from ssl_rec.data.spill import SpillReader, SpillWriter
from ssl_rec.data.split_plan import SPLITS, Part, SplitDraw, SplitPlan
from ssl_rec.data.split_routes import SplitRoutes
from ssl_rec.data.storage import SHARD_ROWS
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.vocab import VOCABULARY_FILE_KEY, VOCABULARY_FILENAME, Vocabularies, Vocabulary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreprocessOptions:
    """How raw files become ids and splits.

    Args:
        min_frequency: raw values seen fewer times in training map to id 0 (a field whose
            every value is rare keeps only id 0 and one unused id).
        max_vocab_size: a field with more distinct training values than this minus one is
            hashed into this many ids (MLPerf's DLRM uses 40M on Criteo Terabyte); bounds
            the memory of counting. ``None`` counts and keeps every value.
        val_fraction: fraction of rows drawn for validation when a split has no file.
        test_fraction: fraction of rows drawn for test when a split has no file; 1 makes
            every row a test row (a new file scored with a model's vocabulary).
        on_bad_row: ``"raise"`` or ``"skip"`` (count, warn, and record in the schema).
        split_seed: seed of the random split.
        missing_values: cells that mean "missing" (categorical -> id 0, dense -> 0);
            by default only the empty cell, so ``NA`` or ``null`` are ordinary values.
        shard_rows: rows per Arrow shard of the output at most.
        dense_transform: ``"log1p"``: a dense value ``x`` becomes ``log1p(max(x, 0))``
            (DLRM's Criteo convention: negative values become 0); ``"signed_log1p"``:
            ``sign(x) log1p(|x|)``, which keeps a negative value's sign and equals
            ``"log1p"`` where ``x >= 0``; ``"none"``: ``x`` as read; a mapping ``column ->``
            one of those; or ``"auto"``: ``log1p`` for a column whose training values are
            all >= 0, ``none`` for one with a negative value
            (:mod:`ssl_rec.data.dense_transforms`). The backbone standardizes the result
            either way (``docs/data.md``).

    """

    min_frequency: int = 1
    max_vocab_size: int | None = None
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    on_bad_row: str = "raise"
    split_seed: int = 0
    missing_values: tuple[str, ...] = ("",)
    shard_rows: int = SHARD_ROWS
    dense_transform: str | dict[str, str] = "log1p"

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
        if isinstance(self.missing_values, str) or not all(
            isinstance(v, str) for v in self.missing_values
        ):
            raise ValueError(
                f"missing_values must be a list of strings, got {self.missing_values!r}"
            )
        object.__setattr__(self, "missing_values", tuple(self.missing_values))
        if self.shard_rows < 1:
            raise ValueError(f"shard_rows must be >= 1, got {self.shard_rows}")
        object.__setattr__(
            self, "dense_transform", check_dense_transform_option(self.dense_transform)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (part of the cache key and schema metadata).

        ``dense_transform`` only when it is not ``"log1p"``: entries built before the option
        existed keep their keys.
        """
        out = {**asdict(self), "missing_values": list(self.missing_values)}
        if self.dense_transform == "log1p":
            del out["dense_transform"]
        return out

    @property
    def parse_transform(self) -> str:
        """The transform a file's reader applies (``"none"`` where it is decided per column)."""
        return parse_time_transform(self.dense_transform)


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
    label: str | None


class RawStream(Protocol):
    """The validated batches of one file (what a source's reader returns)."""

    path: str

    def __iter__(self) -> Iterator[RawBatch]:
        """Yield the file's validated batches."""
        ...

    def position(self) -> int:
        """Bytes of the file consumed so far (for the progress bar)."""
        ...


OpenPart = Callable[[Part], RawStream]


def _size(path: str) -> int:
    return Path(path).stat().st_size


def _encoded(stream: RawStream, spill: SpillWriter | None) -> Iterator[RawBatch]:
    """The stream's batches dictionary-encoded, written to ``spill`` on the way."""
    for raw in stream:
        raw = raw.encoded()
        if spill is not None:
            spill.write(raw, raw.categorical)
        yield raw
    if spill is not None:
        spill.close()


def encode_batch(
    raw: RawBatch, lookups: list[VocabularyLookup], unseen: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(ids int32[N, F], unseen bool[N, 2F] or None)`` of a batch.

    ``unseen`` (computed when asked) marks in columns ``0..F-1`` the non-missing values that
    got id 0 and in columns ``F..2F-1`` those of them rarer than ``min_frequency`` in the
    vocabularies' training data (where the vocabulary recorded them).
    """
    n_fields = len(lookups)
    ids = np.empty((raw.num_rows, n_fields), np.int32)
    mask = np.empty((raw.num_rows, 2 * n_fields), bool) if unseen else None
    for f, (lookup, column) in enumerate(zip(lookups, raw.categorical, strict=True)):
        if mask is None:
            ids[:, f] = lookup.encode(column)[0]
        else:
            ids[:, f], mask[:, f], mask[:, n_fields + f] = lookup.classify(column)
    return ids, mask


class _Run:
    """One preprocessing run: the plan, the reader, the options and the output directory."""

    def __init__(self, plan: SplitPlan, open_part: OpenPart, layout: Layout,
                 options: PreprocessOptions, out: Path) -> None:  # fmt: skip
        self.plan, self.open_part, self.layout = plan, open_part, layout
        self.options, self.out = options, out
        self.skipped: dict[str, int] = {}
        self.spilled: dict[int, SpillWriter] = {}
        self.counted: set[int] = set()
        self.minimum = ColumnMinimum(len(layout.dense))
        self.transforms: list[str] | None = None  # per column, applied while encoding

    def _training_parts(self) -> list[int]:
        """Indices of the parts holding training rows (all of them, or drawn at random)."""
        return [i for i, p in enumerate(self.plan.parts) if p.mode in ("train", "random")]

    def count(self) -> list[Vocabulary]:
        """Pass 1: count the training rows' values (spilling parsed batches) and fit."""
        indices = self._training_parts()
        paths = [self.plan.parts[i].path for i in indices]
        counters = [ValueCounter(self.options.max_vocab_size) for _ in self.layout.categorical]
        spill = spill_module.spill_fits(paths, self.out)
        draw, progress = SplitDraw(self.plan), PassProgress("count", sum(map(_size, paths)))
        done, train_rows = 0, 0
        for i in indices:
            part = self.plan.parts[i]
            self.counted.add(i)
            stream = self.open_part(part)
            writer = self._spill_writer(i, part) if spill else None
            for raw in prefetch(_encoded(stream, writer)):
                rows = draw(raw.num_rows) == 0 if part.mode == "random" else None
                for counter, column in zip(counters, raw.categorical, strict=True):
                    counter.add(column.dictionary, dictionary_counts(column, rows))
                self.minimum.add(raw.dense if rows is None else raw.dense[rows])
                train_rows += raw.num_rows if rows is None else int(rows.sum())
                self.skipped[part.path] = self.skipped.get(part.path, 0) + raw.skipped
                progress.update(raw.num_rows, done + stream.position())
            done += _size(part.path)
        progress.close()
        if train_rows == 0:
            raise ValueError(
                f"no training rows in {self.plan.files('train')} to fit a vocabulary on "
                f"(test_fraction={self.options.test_fraction}); a file of test rows only needs "
                "a model's vocabulary (ssl-rec test/predict --ckpt_path, or "
                "datamodule.use_vocabulary)"
            )
        # One field at a time, each releasing its counts: the transient of one fit at most.
        return [c.vocabulary(self.options.min_frequency) for c in counters]

    def training_minimum(self) -> None:
        """The training rows' minimum per dense column, without counting (given vocabularies)."""
        draw = SplitDraw(self.plan)
        for i in self._training_parts():
            part = self.plan.parts[i]
            for raw in prefetch(iter(self.open_part(part))):
                rows = draw(raw.num_rows) == 0 if part.mode == "random" else None
                self.minimum.add(raw.dense if rows is None else raw.dense[rows])

    def _spill_writer(self, index: int, part: Part) -> SpillWriter:
        folder = self.out / ".spill"
        folder.mkdir(exist_ok=True)
        writer = SpillWriter(folder / f"{index}.arrow", len(self.layout.dense),
                             len(self.layout.categorical), part.labeled)  # fmt: skip
        self.spilled[index] = writer
        return writer

    def _stream(self, index: int, part: Part) -> RawStream:
        if index in self.spilled:
            writer = self.spilled.pop(index)
            return SpillReader(writer.path, part.path, _size(part.path), writer.rows)
        return self.open_part(part)

    def encode(self, lookups: list[VocabularyLookup], count_unseen: bool) -> SplitRoutes:
        """Pass 2: encode every part into its splits; return the (closed) writers."""
        shape = (len(self.layout.dense), len(self.layout.categorical))
        routes = SplitRoutes(self.plan, shape, self.options.shard_rows, self.out, count_unseen)
        progress, done = PassProgress("encode", sum(_size(p.path) for p in self.plan.parts)), 0
        for i, part in enumerate(self.plan.parts):
            stream = self._stream(i, part)
            staged = routes.staging(i) if part.mode == "halves" else None
            batches = prefetch(stream)
            encode = lambda r: encode_batch(r, lookups, count_unseen)  # noqa: E731
            for raw, (ids, unseen) in ordered_map(encode, batches):
                if self.transforms is not None:
                    raw = dataclasses.replace(
                        raw, dense=apply_column_transforms(raw.dense, self.transforms)
                    )
                routes.write(part, staged, raw, ids, unseen)
                if i not in self.counted:
                    self.skipped[part.path] = self.skipped.get(part.path, 0) + raw.skipped
                progress.update(raw.num_rows, done + stream.position())
            done += _size(part.path)
            routes.end_part()
            if staged is not None:
                routes.cut_in_halves(staged)
        progress.close()
        routes.close()
        shutil.rmtree(self.out / ".spill", ignore_errors=True)
        return routes


def given_vocabularies(vocabularies: Vocabularies, layout: Layout) -> list[Vocabulary]:
    """The vocabularies of ``layout``'s fields, in order (``ValueError`` if the fields differ)."""
    if not isinstance(vocabularies, Vocabularies):
        raise ValueError(f"vocabularies must be ssl_rec.vocab.Vocabularies, got "
                         f"{type(vocabularies).__name__}")  # fmt: skip
    if vocabularies.names != list(layout.categorical):
        raise ValueError(
            f"the model's vocabulary has categorical fields {vocabularies.names}, the data "
            f"{list(layout.categorical)}; use the fields (in the order) the model was trained on"
        )
    return [vocabularies[name] for name in layout.categorical]


def _split_metadata(run: _Run, routes: SplitRoutes) -> dict[str, Any]:
    out = {}
    for split in SPLITS:
        files = run.plan.files(split)
        out[split] = {
            "rows": routes.writers[split].rows,
            "labeled": run.plan.labeled(split),
            "shards": len(routes.writers[split].shards),
            "files": files,
            "skipped_rows": int(sum(run.skipped.get(f, 0) for f in files)),
        }
    return out


def _auto_transforms(run: _Run, given: bool) -> dict[str, str]:
    """``auto``'s per-column choice from the training rows' minima."""
    if given:  # no counting pass read the training rows
        run.training_minimum()
    if run.layout.dense and not np.isfinite(run.minimum.value).all():
        raise ValueError(
            "dense_transform 'auto' decides from the training rows and this data has none: "
            "give a trained model (--ckpt_path: its choice is used) or name each column's "
            "transform (dense_transform: {column: log1p|none})"
        )
    return auto_transforms(run.layout.dense, run.minimum.value)


def preprocess(
    plan: SplitPlan,
    open_part: OpenPart,
    layout: Layout,
    options: PreprocessOptions,
    out_dir: Path,
    final_dir: Path,
    vocabularies: Vocabularies | None = None,
) -> FeatureSchema:
    """Fit vocabularies on the training rows (or use given ones), write every split's shards.

    Args:
        plan: the input files and where their rows go.
        open_part: returns the validated batches of a part's file.
        layout: output column names.
        options: preprocessing options.
        out_dir: directory being written (a temporary one).
        final_dir: where ``out_dir`` will live; its ``vocabulary.arrow`` is stored in
            ``metadata["vocabulary_file"]``.
        vocabularies: a model's vocabularies to encode with instead of fitting new ones;
            values they do not know get id 0 and are counted per split and field in
            ``metadata["unseen_values"]``; how many of those were rarer than
            ``min_frequency`` in their training data in ``metadata["rare_values"]``
            (``None`` for a field whose vocabulary did not record its rare values).

    Returns:
        The schema; ``metadata`` holds the options, the plan, rows / shards / skipped rows
        per split, the vocabularies' fingerprints, hashed fields, ``vocabulary_file``,
        ``training_rare_values`` (distinct values per field below ``min_frequency`` in
        training, ``None`` if not recorded) and, when vocabularies were given, unseen and
        rare values per split.

    """
    option = options.dense_transform
    # A mapping naming a wrong column stops before any pass; auto decides after counting.
    transforms = None if option == AUTO_TRANSFORM else column_transforms(option, layout.dense)
    run = _Run(plan, open_part, layout, options, out_dir)
    given = vocabularies is not None
    if given:
        vocabs = given_vocabularies(vocabularies, layout)
        min_frequency = vocabularies.min_frequency
    else:
        vocabs = run.count()
        vocabularies = Vocabularies(dict(zip(layout.categorical, vocabs, strict=True)),
                                    options.min_frequency, options.max_vocab_size)  # fmt: skip
        min_frequency = options.min_frequency
    if transforms is None:
        transforms = _auto_transforms(run, given)
    if decided_per_column(option):
        run.transforms = [transforms[c] for c in layout.dense]
    rare_known = {name: v.rare_hashes is not None or min_frequency <= 1
                  for name, v in zip(layout.categorical, vocabs, strict=True)}  # fmt: skip
    training_rare = {name: v.rare_count for name, v in zip(layout.categorical, vocabs,
                                                           strict=True)}  # fmt: skip
    if not given:
        report_rare_in_training(training_rare, min_frequency)
    # Whatever needs the vocabularies' values is done before encoding; while rows are
    # encoded only the lookups' key tables stay resident (the values are released).
    vocabularies.save(out_dir / VOCABULARY_FILENAME)
    fields = [CategoricalField(n, v.cardinality)
              for n, v in zip(layout.categorical, vocabs, strict=True)]  # fmt: skip
    hashed = [n for n, v in zip(layout.categorical, vocabs, strict=True) if v.hashed]
    fingerprints = vocabularies.fingerprints()
    lookups = [VocabularyLookup(vocabs.pop(0)) for _ in range(len(vocabs))]
    del vocabularies
    routes = run.encode(lookups, count_unseen=given)
    del lookups
    skipped = int(sum(run.skipped.values()))
    if skipped:
        log.warning("skipped %d bad rows in total (on_bad_row='skip')", skipped)
    metadata = {
        "options": options.to_dict(),
        "plan": plan.to_dict(),
        "splits": _split_metadata(run, routes),
        "skipped_rows": skipped,
        VOCABULARY_FILE_KEY: str(final_dir / VOCABULARY_FILENAME),
        "hashed_fields": hashed,
        "vocabulary": fingerprints,
        "vocabulary_given": given,
        "training_rare_values": training_rare,
        TRANSFORMS_KEY: transforms,
    }
    if given:
        n_fields = len(layout.categorical)
        metadata["unseen_values"], metadata["rare_values"] = {}, {}
        for split, counts in routes.unseen.items():
            unseen = dict(zip(layout.categorical, counts[:n_fields].tolist(), strict=True))
            rare = {name: n if rare_known[name] else None
                    for name, n in zip(layout.categorical, counts[n_fields:].tolist(),
                                       strict=True)}  # fmt: skip
            metadata["unseen_values"][split], metadata["rare_values"][split] = unseen, rare
            report_unseen(split, routes.writers[split].rows, unseen, rare, min_frequency)
    return FeatureSchema(layout.dense, tuple(fields), layout.label, metadata)
