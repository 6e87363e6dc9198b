"""Write the generator's train/val/test splits (and their oracle metrics) to a cache entry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from tqdm.auto import tqdm

from ssl_rec.datamodules.oracle import oracle_metrics
from ssl_rec.datamodules.schema import (
    CRITEO_CATEGORICAL,
    CRITEO_DENSE,
    CRITEO_LABEL,
    MISSING_ID,
    CategoricalField,
    FeatureSchema,
)
from ssl_rec.datamodules.storage import SplitWriter, split_schema
from ssl_rec.datamodules.synthetic import SyntheticConfig, SyntheticGenerator, render_ids
from ssl_rec.datamodules.vocabulary import MISSING_VALUE, VOCAB_DIRNAME, save_id_values

CHUNK_ROWS = 1 << 18


def _write_vocab(gen: SyntheticGenerator, vocab_dir: Path) -> None:
    for f, name in enumerate(CRITEO_CATEGORICAL):
        ids = np.arange(1, gen.cardinalities[f])
        raw = pa.array(render_ids(f, ids)).cast(pa.string())
        values = pa.concat_arrays([pa.array([MISSING_VALUE], pa.string()), raw])
        save_id_values(vocab_dir, name, values)


def write_synthetic_splits(
    config: SyntheticConfig, sizes: dict[str, int], out_dir: Path, final_dir: Path
) -> FeatureSchema:
    """Generate each split in chunks of :data:`CHUNK_ROWS` rows and write it.

    Args:
        config: generator knobs.
        sizes: rows per split, e.g. ``{"train": 1_000_000, "val": 100_000, "test": 100_000}``.
        out_dir: directory being written.
        final_dir: where it will live (for ``metadata["vocab_dir"]``).

    Returns:
        The schema; ``metadata`` holds the generator config (to rebuild it), the oracle
        metrics of each split and the row counts.

    """
    gen = SyntheticGenerator(config)
    oracle, splits = {}, {}
    progress = tqdm(total=sum(sizes.values()), desc="synthetic", unit="rows")
    for split, n in sizes.items():
        probs, labels = [], []
        schema = split_schema(len(CRITEO_DENSE), len(CRITEO_CATEGORICAL), True, True)
        with SplitWriter(out_dir / f"{split}.arrow", schema) as writer:
            for chunk, start in enumerate(range(0, n, CHUNK_ROWS)):
                rows = gen.rows(split, chunk, min(CHUNK_ROWS, n - start))
                writer.write(np.log1p(rows.dense), rows.sparse, rows.label, rows.prob)
                probs.append(rows.prob)
                labels.append(rows.label)
                progress.update(rows.sparse.shape[0])
        if n:
            oracle[split] = oracle_metrics(np.concatenate(probs), np.concatenate(labels))
        splits[split] = {"rows": n, "labeled": True, "skipped_rows": 0}
    progress.close()
    _write_vocab(gen, out_dir / VOCAB_DIRNAME)
    fields = [CategoricalField(name, c) for name, c in zip(CRITEO_CATEGORICAL, gen.cardinalities,
                                                             strict=True)]  # fmt: skip
    metadata = {
        "source": "synthetic",
        "generator": config.to_dict(),
        "oracle": oracle,
        "splits": splits,
        "skipped_rows": 0,
        "missing_id": MISSING_ID,
        "vocab_dir": str(final_dir / VOCAB_DIRNAME),
    }
    return FeatureSchema(CRITEO_DENSE, tuple(fields), CRITEO_LABEL, metadata)


def generator_from_schema(schema: FeatureSchema) -> SyntheticGenerator:
    """Rebuild the generator of a synthetic data set from its schema metadata."""
    params = schema.metadata.get("generator")
    if not isinstance(params, dict):
        raise ValueError("schema.metadata has no 'generator': not synthetic data from ssl_rec")
    return SyntheticGenerator(SyntheticConfig(**params))
