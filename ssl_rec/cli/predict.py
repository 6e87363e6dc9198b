"""``ssl-rec predict``: score every row of a new file with a checkpoint, in input order.

``ssl-rec predict --ckpt_path CKPT --data.path new.csv --predictions.out pred.parquet
--predictions.keys '[user,item]'`` encodes the file with the checkpoint's vocabulary (the
model and data settings come from the checkpoint), scores each row and writes ``row``,
the key columns, ``label`` (if the file has one) and ``probability``
(:class:`ssl_rec.lightning.PredictionWriter`). A single file is scored whole; a
directory of ``train``/``val``/``test`` files is scored on its test files.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from ssl_rec.data.dense_transforms import AUTO_TRANSFORM
from ssl_rec.data.oov_report import reporting_predictions
from ssl_rec.data.preprocess import PreprocessOptions


def data_reporting(subcommand: str | None) -> Any:
    """The context preprocessing logs in: ``predict`` reports its rows as "predicting"."""
    return reporting_predictions() if subcommand == "predict" else contextlib.nullcontext()


def use_recorded_dense_transforms(config: Namespace, recorded: dict[str, str] | None) -> None:
    """Give data configured with ``dense_transform: auto`` the model's per-column choice.

    A file scored by a trained model may have no training rows to decide from, and must be
    transformed as the model's training rows were.
    """
    init = getattr(config.get("data"), "init_args", None)
    preprocess = None if init is None else init.get("preprocess")
    if recorded and preprocess is not None and preprocess.get("dense_transform") == AUTO_TRANSFORM:
        preprocess.dense_transform = dict(recorded)


def predict_whole_files(config: Namespace) -> None:
    """Make every row of a single input file a row of the predicted (``test``) split.

    Sets ``data.init_args.preprocess`` to ``val_fraction=0, test_fraction=1`` for data
    modules that split one file randomly; other data is left as configured.
    """
    init = getattr(config.get("data"), "init_args", None)
    if init is None or "preprocess" not in init or not init.get("path"):
        return
    if not Path(str(init.path)).is_file():
        return
    given = init.get("preprocess")
    values = PreprocessOptions().to_dict() if given is None else dict(vars(given))
    values.update(val_fraction=0.0, test_fraction=1.0)
    init.preprocess = Namespace(**values)
