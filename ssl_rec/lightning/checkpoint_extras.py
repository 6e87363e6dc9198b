"""What a checkpoint carries besides weights, so that it stands alone.

- ``feature_schema``: the schema dict (fields, cardinalities, dense columns).
- ``vocabulary``: the model's :class:`~ssl_rec.vocab.Vocabularies` as tensors, so
  new data is encoded with the ids the model was trained for.
- ``provenance``: where the weights came from (``init_from``: file name and SHA-256), as
  a record only; loading never reads it.
- ``rng_states``: the global random generators, restored when training resumes.

The dense columns' training statistics are buffers of the backbone (in ``state_dict``); a
model that has none yet takes its data's at ``setup`` (:func:`adopt_data_dense_statistics`).

``CTRModule`` and ``PretrainModule`` call :func:`save_artifact`, :func:`restore_artifact`,
:func:`adopt_data_vocabulary` and :func:`adopt_data_dense_statistics` from their checkpoint
and ``setup`` hooks.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch

from ssl_rec.vocab import DenseStatistics, Vocabularies

SCHEMA_KEY = "feature_schema"
VOCABULARY_KEY = "vocabulary"
PROVENANCE_KEY = "provenance"
RNG_KEY = "rng_states"
log = logging.getLogger(__name__)


def save_artifact(module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Add schema, vocabulary, provenance and RNG states to ``checkpoint``."""
    checkpoint[SCHEMA_KEY] = module.schema.to_dict()
    vocabulary = module.backbone.vocabulary
    if vocabulary is not None:
        checkpoint[VOCABULARY_KEY] = vocabulary.to_state()
    if module.provenance:
        checkpoint[PROVENANCE_KEY] = dict(module.provenance)
    checkpoint[RNG_KEY] = rng_states()


def restore_artifact(module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Take the vocabulary and provenance from ``checkpoint``; RNG states when resuming a fit.

    Raises:
        ValueError: the data the attached trainer uses was encoded with other vocabularies
            and cannot be re-encoded for this model.

    """
    module.provenance = dict(checkpoint.get(PROVENANCE_KEY) or {})
    state = checkpoint.get(VOCABULARY_KEY)
    vocabulary = None if state is None else Vocabularies.from_state(state)
    trainer = attached_trainer(module)
    if vocabulary is not None:
        current = module.backbone.vocabulary
        if current is not None and vocabulary.disagreeing(current) and trainer is not None:
            _reencode(trainer.datamodule, vocabulary, current, "the checkpoint")
        module.backbone.set_vocabulary(vocabulary)
    if trainer is not None and trainer.state.fn == "fit":
        set_rng_states(checkpoint.get(RNG_KEY) or {})


def adopt_data_vocabulary(module: pl.LightningModule) -> None:
    """At ``setup``: take the data's vocabulary, or re-encode the data with the model's.

    A model without a vocabulary (trained from scratch) adopts the one its data was
    encoded with; a trained model whose data module was encoded with other vocabularies
    asks the data module to re-encode with the model's (``use_vocabulary``).
    """
    trainer = attached_trainer(module)
    datamodule = None if trainer is None else trainer.datamodule
    data_vocabulary = getattr(datamodule, "vocabulary", None)
    if not isinstance(data_vocabulary, Vocabularies):
        return
    mine = module.backbone.vocabulary
    if mine is None:
        module.backbone.set_vocabulary(data_vocabulary)
    elif mine.disagreeing(data_vocabulary):
        _reencode(datamodule, mine, data_vocabulary, "the model")


def adopt_data_dense_statistics(module: pl.LightningModule) -> None:
    """At ``setup``: a backbone without dense statistics takes its data module's.

    A backbone built from the data's schema, loaded from a checkpoint or initialised from
    one (``init_from``) keeps the statistics it has: its weights were trained with them.
    """
    trainer = attached_trainer(module)
    statistics = getattr(getattr(trainer, "datamodule", None), "dense_statistics", None)
    backbone = module.backbone
    if isinstance(statistics, DenseStatistics) and not backbone.dense_statistics_set:
        backbone.set_dense_statistics(statistics)


def _reencode(datamodule: Any, wanted: Vocabularies, used: Vocabularies, whose: str) -> None:
    bad = wanted.disagreeing(used)
    use = getattr(datamodule, "use_vocabulary", None)
    if not callable(use) or wanted.cardinalities != used.cardinalities:
        raise ValueError(
            f"the data was encoded with other vocabularies than {whose}'s (fields {bad[:10]}); "
            "encode it with the model's: ssl-rec test/predict --ckpt_path CKPT does, and in "
            "Python datamodule.use_vocabulary(read_vocabulary(CKPT)) before building the model"
        )
    log.info("encoding the data with %s's vocabulary (fields %s differ)", whose, bad[:10])
    use(wanted)


def attached_trainer(module: pl.LightningModule) -> pl.Trainer | None:
    """The trainer ``module`` is attached to, or ``None`` (e.g. in ``load_from_checkpoint``)."""
    try:
        return module.trainer
    except RuntimeError:
        return None


def rng_states() -> dict[str, Any]:
    """Global torch / numpy / Python random states as checkpoint-safe values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos,
                  "has_gauss": has_gauss, "cached_gaussian": cached},
        "python": random.getstate(),
    }  # fmt: skip
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore :func:`rng_states` (missing entries are left alone)."""
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    if "numpy" in states:
        n = states["numpy"]
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if "python" in states:
        version, internal, gauss = states["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
