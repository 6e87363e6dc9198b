"""The built-in synthetic Criteo-like data: splits with oracle metrics, and a Criteo TSV writer."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ssl_rec.data.arrow_data_module import ArrowDataModule
from ssl_rec.data.batch_rule import BatchSize
from ssl_rec.data.oov_report import report_unseen
from ssl_rec.data.progress import progress_bar
from ssl_rec.data.sources.synthetic_clicks import (
    PRESETS,
    SYNTHETIC_VERSION,
    SyntheticClickModel,
    SyntheticConfig,
    SyntheticRows,
    render_ids,
)
from ssl_rec.data.storage import SPLITS, ShardWriter, record_batch, split_schema
from ssl_rec.metrics import ctr_summary
from ssl_rec.schema import (
    CRITEO_CATEGORICAL,
    CRITEO_DENSE,
    CRITEO_LABEL,
    MISSING_ID,
    CategoricalField,
    FeatureSchema,
)
from ssl_rec.vocab import (
    MISSING_VALUE,
    VOCABULARY_FILE_KEY,
    VOCABULARY_FILENAME,
    CodedColumn,
    Vocabularies,
)

CHUNK_ROWS = 1 << 18


def synthetic_vocabulary(cardinalities: list[int]) -> Vocabularies:
    """The generator's own vocabularies: id ``i`` of field ``f`` is ``render_ids(f, i)``."""
    fields = {}
    for f, name in enumerate(CRITEO_CATEGORICAL):
        raw = pa.array(render_ids(f, np.arange(1, cardinalities[f]))).cast(pa.string())
        fields[name] = pa.concat_arrays([pa.array([MISSING_VALUE], pa.string()), raw])
    return Vocabularies.from_id_values(fields)


def _id_maps(own: Vocabularies, given: Vocabularies) -> list[np.ndarray] | None:
    """Per field ``int32[own card]``: generated id -> id in ``given`` (``None`` if equal)."""
    if given.names != own.names:
        raise ValueError(f"the model's vocabulary has categorical fields {given.names}, the "
                         f"synthetic data {own.names}")  # fmt: skip
    if not own.disagreeing(given):
        return None
    maps = []
    for name in own.names:
        values = own[name].values
        column = CodedColumn(values, np.arange(len(values), dtype=np.int32))
        maps.append(np.concatenate([[MISSING_ID], given[name].encode(column)]).astype(np.int32))
    return maps


def write_synthetic_splits(
    config: SyntheticConfig,
    sizes: dict[str, int],
    out_dir: Path,
    final_dir: Path,
    vocabularies: Vocabularies | None = None,
) -> FeatureSchema:
    """Generate each split in chunks of :data:`CHUNK_ROWS` rows and write it.

    Args:
        config: the click model's knobs.
        sizes: rows per split, e.g. ``{"train": 1_000_000, "val": 100_000, "test": 100_000}``.
        out_dir: directory being written.
        final_dir: where it will live (for ``metadata["vocabulary_file"]``).
        vocabularies: a model's vocabularies: generated ids are mapped through their raw
            values to the model's ids (unknown values -> 0, counted).

    Returns:
        The schema; ``metadata`` holds the synthetic config (to rebuild the click model), the
        logit weights in force and the click logit's variance decomposition
        (:meth:`SyntheticClickModel.logit_variance`), the oracle metrics of each split and
        the row counts.

    """
    gen = SyntheticClickModel(config)
    own = synthetic_vocabulary(gen.cardinalities)
    maps = None if vocabularies is None else _id_maps(own, vocabularies)
    vocab = own if vocabularies is None else vocabularies
    oracle, splits, unseen = {}, {}, {}
    progress = progress_bar("synthetic", sum(sizes.values()), "rows")
    for split, n in sizes.items():
        probs, labels = [], []
        unseen[split] = np.zeros(len(CRITEO_CATEGORICAL), np.int64)
        schema = split_schema(len(CRITEO_DENSE), len(CRITEO_CATEGORICAL), True, True)
        with ShardWriter(out_dir / split, schema) as writer:
            for chunk, start in enumerate(range(0, n, CHUNK_ROWS)):
                rows = gen.rows(split, chunk, min(CHUNK_ROWS, n - start))
                sparse = rows.sparse if maps is None else _remap(rows.sparse, maps, unseen[split])
                dense = np.log1p(rows.dense)
                writer.write(record_batch(schema, dense, sparse, rows.label, rows.prob))
                probs.append(rows.prob)
                labels.append(rows.label)
                progress.update(rows.sparse.shape[0])
        if n:
            oracle[split] = ctr_summary(np.concatenate(probs), np.concatenate(labels))
        splits[split] = {"rows": n, "labeled": True, "skipped_rows": 0}
    progress.close()
    vocab.save(out_dir / VOCABULARY_FILENAME)
    fields = [CategoricalField(name, c) for name, c in zip(CRITEO_CATEGORICAL, vocab.cardinalities,
                                                             strict=True)]  # fmt: skip
    metadata = {
        "source": "synthetic",
        "synthetic": config.to_dict(),
        "difficulty": config.difficulty(),
        "logit_variance": gen.logit_variance(),
        "oracle": oracle,
        "splits": splits,
        "skipped_rows": 0,
        "missing_id": MISSING_ID,
        VOCABULARY_FILE_KEY: str(final_dir / VOCABULARY_FILENAME),
        "vocabulary": vocab.fingerprints(),
        "vocabulary_given": vocabularies is not None,
    }
    if maps is not None:
        metadata["unseen_values"] = {
            s: dict(zip(CRITEO_CATEGORICAL, u.tolist(), strict=True)) for s, u in unseen.items()
        }
        for s, u in metadata["unseen_values"].items():
            report_unseen(s, sizes[s], u, None, vocabularies.min_frequency)
    return FeatureSchema(CRITEO_DENSE, tuple(fields), CRITEO_LABEL, metadata)


def _remap(sparse: np.ndarray, maps: list[np.ndarray], unseen: np.ndarray) -> np.ndarray:
    out = np.empty_like(sparse)
    for f, table in enumerate(maps):
        out[:, f] = table[sparse[:, f]]
        unseen[f] += np.count_nonzero((out[:, f] == MISSING_ID) & (sparse[:, f] != MISSING_ID))
    return out


def click_model_from_schema(schema: FeatureSchema) -> SyntheticClickModel:
    """Rebuild the click model of a synthetic data set from its schema metadata."""
    params = schema.metadata.get("synthetic")
    if not isinstance(params, dict):
        raise ValueError("schema.metadata has no 'synthetic': not synthetic data from ssl_rec")
    return SyntheticClickModel(SyntheticConfig(**params))


def write_criteo_tsv(
    path: str | os.PathLike[str], rows: SyntheticRows, with_label: bool = True
) -> Path:
    """Write generated rows in the exact Criteo layout (``.gz`` suffix -> gzip).

    Lets the Criteo pipeline be exercised at any size without the real data set.

    Ids are rendered as 8-hex-digit hashes (:func:`render_ids`), id 0 and missing counts
    as empty cells.

    Args:
        path: output file.
        rows: from :meth:`SyntheticClickModel.rows`.
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


class SyntheticCTRDataModule(ArrowDataModule):
    """Generated Criteo-like data with known click probabilities and latent structure.

    Args:
        n_train: training rows (the unlabeled pool with ``use_labels=False``).
        n_val: validation rows.
        n_test: test rows.
        synthetic: the click model's knobs (seed, cardinality scale, latent sizes, base CTR,
            difficulty).
        preset: ``"easy"`` or ``"hard"`` (:data:`PRESETS`): replaces ``synthetic.preset``;
            ``None`` keeps it (default ``"easy"``).
        batch_size: rows per training batch, or ``"auto"`` (chosen from the training rows).
        label_fraction: fraction of training rows used with labels.
        use_labels: ``False`` yields unlabeled batches of all training rows.
        seed: shuffle / labeled-subset seed (the data's own seed is ``synthetic.seed``).
        cache_dir: cache root (default ``$SSL_REC_CACHE`` or ``~/.cache/ssl_rec``).
        drop_last: drop the last incomplete training batch.
        eval_batch_size: rows per validation, test and predict batch (default
            ``batch_size``); evaluation keeps no activations for backward, so it can be
            much larger than a small labeled subset's training batch.
        unlabeled_per_batch: unlabeled training rows (label NaN) added to each training
            batch, per labeled row: semi-supervised training with ``label_fraction < 1``
            (:class:`~ssl_rec.data.ArrowDataModule`); ``0`` trains on labeled rows only.

    Example:
        >>> dm = SyntheticCTRDataModule(n_train=2000, n_val=500, n_test=500, cache_dir="cache",
        ...                             synthetic=SyntheticConfig(cardinality_scale=0.0002))
        >>> dm.schema.cardinalities[:3], dm.oracle_metrics("test")["auc"] > 0.7
        ([4, 4, 2027], True)

    """

    def __init__(
        self,
        n_train: int = 1_000_000,
        n_val: int = 100_000,
        n_test: int = 100_000,
        synthetic: SyntheticConfig | None = None,
        preset: str | None = None,
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
        for key, value in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
            if not 0 <= value <= 10**10 or (key == "n_train" and value < 1):
                raise ValueError(f"{key} must be in [{int(key == 'n_train')}, 1e10], got {value}")
        self.sizes = {"train": n_train, "val": n_val, "test": n_test}
        self.synthetic = synthetic or SyntheticConfig()
        if preset is not None:
            if preset not in PRESETS:
                raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
            self.synthetic = dataclasses.replace(self.synthetic, preset=preset)

    cache_kind = "synthetic"

    def cache_inputs(self) -> dict[str, Any]:
        """The click model's config, its code version and the split sizes."""
        return {"synthetic": self.synthetic.to_dict(), "version": SYNTHETIC_VERSION,
                "sizes": self.sizes}  # fmt: skip

    def build(self, out_dir: Path, final_dir: Path) -> FeatureSchema:
        """Generate the splits into ``out_dir``."""
        return write_synthetic_splits(
            self.synthetic, self.sizes, out_dir, final_dir, self.given_vocabulary
        )

    def click_model(self) -> SyntheticClickModel:
        """The click model of this data (true latents via ``item_latents(field)``)."""
        return click_model_from_schema(self.schema)

    def oracle_metrics(self, split: str) -> dict[str, float] | None:
        """Oracle AUC / logloss / CTR of the true probabilities on ``split``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return self.schema.metadata["oracle"].get(split)
