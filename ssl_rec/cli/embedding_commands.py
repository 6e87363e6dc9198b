"""``ssl-rec export`` and ``ssl-rec evaluate-embeddings``: typed flags via jsonargparse.

Data for split representations and evaluation comes from ``--data`` (a LightningDataModule:
``--data data.yaml``, ``--data '{"class_path": ..., "init_args": ...}'`` or
``--data.class_path ... --data.init_args.KEY VALUE``), else from the data module
hyperparameters saved in the checkpoint by ``ssl-rec fit``; either way it is encoded with
the checkpoint's vocabulary.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pytorch_lightning as pl
from jsonargparse import CLI

from ssl_rec._io import atomic_write_json
from ssl_rec.cli.allow_class_option import ALLOW_HELP
from ssl_rec.cli.datamodules import datamodule_from, split_loader
from ssl_rec.cli.run_dir import refuse_existing_output
from ssl_rec.data import SyntheticCTRDataModule
from ssl_rec.evaluation import (
    EvalConfig,
    IndexConfig,
    compute_representations,
    evaluate_embeddings,
    export_embeddings,
)
from ssl_rec.lightning.checkpoint_loading import load_module
from ssl_rec.lightning.retrieval_module import RetrievalModule

log = logging.getLogger(__name__)


def export(
    ckpt_path: str,
    out: str,
    fields: list[str] | None = None,
    split: str | None = None,
    data: pl.LightningDataModule | None = None,
    index: str = "auto",
    metric: Literal["ip", "l2"] = "ip",
    precision: Literal["fp32", "fp16", "int8"] = "fp32",
    train_size: int | None = 100_000,
    normalize: bool = False,
    max_rows: int | None = None,
    overwrite: bool = False,
) -> str:
    """Export entity embeddings (and optionally a split's representations) with FAISS indexes.

    Args:
        ckpt_path: checkpoint written by ``ssl-rec fit``: a CTR run's best model is
            ``<default_root_dir>/checkpoints/best.ckpt`` (best validation AUC), a
            pretraining run's ``checkpoints/last.ckpt``. A retrieval (two-tower) checkpoint
            exports its query tower, the FAISS index of its item catalogue (from ``data``)
            and its vocabularies for ``ssl-rec retrieve`` (``docs/retrieval.md``); only
            ``index`` applies to it.
        out: export directory (written atomically).
        fields: categorical fields to export, e.g. ``'[C1,C2]'``; default all, ``'[]'`` none.
        split: also export pooled representations of this split (``train``/``val``/``test``).
        data: data module for ``split`` (default: the one recorded in the checkpoint).
        index: FAISS factory string (``Flat``, ``HNSW32``, ``IVF1024,PQ16``...) or ``auto``.
        metric: ``ip`` (inner product) or ``l2``.
        precision: stored vectors and index codes: ``fp32``, ``fp16`` (SQfp16) or ``int8`` (SQ8).
        train_size: vectors sampled to train the index.
        normalize: L2-normalise vectors (cosine with ``ip``).
        max_rows: at most this many rows of ``split``.
        overwrite: replace an existing ``out``.

    """
    refuse_existing_output(out, overwrite)
    module = load_module(ckpt_path)
    if isinstance(module, RetrievalModule):  # a query tower and an item index
        module.use_data(datamodule_from(ckpt_path, data, module))
        path = module.export(out, overwrite, index)
        print(f"exported to {path}")
        return str(path)
    config = IndexConfig(index, metric, precision, train_size, normalize)
    reps = None
    if split is not None:
        loader = split_loader(datamodule_from(ckpt_path, data, module), split)
        reps = {split: compute_representations(module, loader, max_rows, progress=True)}
    path = export_embeddings(
        module,
        None,
        out,
        fields,
        config=config,
        representations=reps,
        checkpoint=ckpt_path,
        overwrite=overwrite,
    )
    print(f"exported to {path}")
    return str(path)


def evaluate(
    ckpt_path: str,
    data: pl.LightningDataModule | None = None,
    json_out: str | None = None,
    train_rows: int = 20_000,
    test_rows: int = 5_000,
    knn_k: int = 50,
    ks: list[int] | None = None,
    index: str = "auto",
    item_field: str | None = None,
) -> dict[str, Any]:
    """Probe and measure a checkpoint's representations; print a table, write JSON.

    Args:
        ckpt_path: checkpoint written by ``ssl-rec fit``.
        data: labeled data module (default: the one recorded in the checkpoint).
        json_out: write the results here as JSON (atomically).
        train_rows: training rows for the probes.
        test_rows: test rows probed and used as retrieval queries.
        knn_k: neighbours of the kNN probe.
        ks: retrieval cut-offs (default ``[10, 50]``).
        index: approximate index for retrieval (FAISS factory string or ``auto``).
        item_field: retrieved field (default: the largest-cardinality field).

    """
    module = load_module(ckpt_path)
    config = EvalConfig(train_rows, test_rows, knn_k, tuple(ks or (10, 50)), index, item_field)
    datamodule = datamodule_from(ckpt_path, data, module, use_labels=True)
    truth = None
    if isinstance(datamodule, SyntheticCTRDataModule):
        truth = datamodule.click_model().latent_truth
    results = evaluate_embeddings(
        module, split_loader(datamodule, "train"), split_loader(datamodule, "test"), config, truth
    )
    print(format_table(results))
    if "probes_skipped" in results:
        log.warning("kNN and linear probes skipped: %s", results["probes_skipped"])
    if json_out:
        atomic_write_json(Path(json_out), _json_safe(results))
    return results


def format_table(results: dict[str, Any]) -> str:
    """Two-column text table of a nested results dict (``section.key  value``)."""
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in _flatten(results)]
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.extend(_flatten(v, f"{key}.") if isinstance(v, dict) else [(key, v)])
    return out


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return json.loads(json.dumps(obj, default=float))


def export_main(argv: Sequence[str]) -> str:
    """Entry of ``ssl-rec export``; ``--help`` lists the flags."""
    return CLI(export, args=list(argv), as_positional=False, exit_on_error=False,
               epilog=ALLOW_HELP)  # fmt: skip


def evaluate_main(argv: Sequence[str]) -> dict[str, Any]:
    """Entry of ``ssl-rec evaluate-embeddings``; ``--help`` lists the flags."""
    return CLI(evaluate, args=list(argv), as_positional=False, exit_on_error=False,
               epilog=ALLOW_HELP)  # fmt: skip
