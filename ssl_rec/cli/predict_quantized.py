"""``ssl-rec predict --ckpt_path DIR --predictions.out FILE``: probabilities of a quantized model.

The data module comes from ``--config`` files and overrides, as for LightningCLI's
``predict`` (``ssl-rec predict --config configs/ctr/synthetic.yaml --ckpt_path DIR
--predictions.out pred.parquet``); from ``--data.*`` overrides of the one recorded when the
model was quantized (``ssl-rec predict --ckpt_path DIR --data.path new.csv
--predictions.out pred.parquet``: as from a checkpoint, a single file is then scored whole);
or, with neither, from the recorded one itself. The data is encoded with the model's
vocabularies (kept in the directory), so new files get the trained ids. Its prediction split
is read in file order and streamed to the one prediction file of
:mod:`ssl_rec.evaluation.predictions`, as from a checkpoint: ``row``, the
``--predictions.keys`` columns, ``label`` (if the data has labels) and ``probability``,
to Parquet, CSV or TSV by suffix; ``--out FILE`` is the short spelling of
``--predictions.out``. The file appears complete or not at all, and an existing one is kept
(the command is refused) unless ``--overwrite true`` is given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytorch_lightning as pl
import torch

from ssl_rec.cli.checkpoint_args import class_config
from ssl_rec.cli.commands import instantiate
from ssl_rec.cli.datamodules import check_recorded, encoded_with, recorded_datamodule
from ssl_rec.cli.predict import predict_whole_files
from ssl_rec.cli.run_dir import refuse_existing_output
from ssl_rec.evaluation.predictions import key_columns, prediction_file, prediction_format
from ssl_rec.quantize import (
    InferenceCTRModel,
    check_schema,
    is_quantized_dir,
    load_quantized,
    read_manifest,
    read_vocabularies,
)
from ssl_rec.types import Batch

OUT_OPTIONS = ("--predictions.out", "--out")
KEYS_OPTION = "--predictions.keys"


def quantized_checkpoint(argv: Sequence[str]) -> str | None:
    """The ``--ckpt_path`` of a ``predict`` command line when it names a quantized model."""
    value = _option(list(argv), "--ckpt_path")
    return value if value is not None and is_quantized_dir(value) else None


def _option(argv: list[str], name: str, remove: bool = False) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
            if remove:
                del argv[i : i + 2]
            return value
        if arg.startswith(f"{name}="):
            if remove:
                del argv[i]
            return arg.split("=", 1)[1]
    return None


def predict_main(argv: Sequence[str]) -> Path:
    """Entry of ``ssl-rec predict`` for a quantized model directory.

    Args:
        argv: the command line after ``predict``: ``--ckpt_path DIR``, ``--predictions.out
            FILE`` (or ``--out FILE``), optionally ``--overwrite true``, ``--predictions.keys
            '[col,...]'`` and the data options (see the module docstring).

    Returns:
        The predictions file written.

    Raises:
        ValueError: no or an unknown output file, keys the data lacks, bad data options.

    """
    args = list(argv)
    directory = _option(args, "--ckpt_path", remove=True)
    out = _output(args)
    refuse_existing_output(out, _true(_option(args, "--overwrite", remove=True)))
    keys = _keys(_option(args, KEYS_OPTION, remove=True))
    model = load_quantized(directory)
    datamodule = _datamodule(args, directory)
    check_schema(model.schema, datamodule.schema, "the prediction data")
    datamodule.prepare_data()
    datamodule.setup("predict")
    path = write_model_predictions(
        model, datamodule.predict_dataloader(), out, key_columns(datamodule, keys)
    )
    print(f"predictions written to {path}")
    return path


def _output(args: list[str]) -> str:
    """The predictions file of ``--predictions.out`` / ``--out``, its suffix checked."""
    given = {name: v for name in OUT_OPTIONS if (v := _option(args, name, remove=True))}
    if not given:
        raise ValueError(
            "ssl-rec predict from a quantized model needs --predictions.out FILE "
            "(.parquet, .csv or .tsv)"
        )
    if len(set(given.values())) > 1:
        raise ValueError(f"two predictions files given ({given}); give --predictions.out once")
    out = next(iter(given.values()))
    prediction_format(out)  # an unknown suffix stops before the model is loaded
    return out


def _true(value: str | None) -> bool:
    """``--overwrite true`` (``1``, ``yes``): the command line's spelling of a boolean."""
    return value is not None and value.strip().lower() in ("true", "1", "yes")


def _keys(value: str | None) -> list[str]:
    """``--predictions.keys`` parsed as the checkpoint path's ``PredictionWriter`` parses it."""
    if value is None:
        return []
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="ssl-rec predict", exit_on_error=False)
    parser.add_argument(KEYS_OPTION, type=list[str] | None, default=None)
    config = parser.parse_args([f"{KEYS_OPTION}={value}"])
    return list(config["predictions.keys"] or [])


def _datamodule(args: list[str], directory: str) -> pl.LightningDataModule:
    """The prediction data, encoded with the model's vocabularies when the directory has them."""
    recorded = read_manifest(directory).get("data")
    if not args:
        datamodule = recorded_datamodule(recorded, directory)
    elif any(a == "--config" or a.startswith("--config=") for a in args):
        datamodule = instantiate(args).datamodule  # the LightningCLI parser of `ssl-rec predict`
    else:
        datamodule = _overridden(recorded, args, directory)
    return encoded_with(datamodule, read_vocabularies(directory))


def _overridden(recorded: dict | None, args: list[str], directory: str) -> pl.LightningDataModule:
    """The recorded data module with ``--data.*`` overrides applied (jsonargparse types them)."""
    unexpected = [a for a in args if a.startswith("--") and not a.startswith("--data.")]
    if unexpected:
        raise ValueError(
            f"unexpected options {unexpected[:4]}: give the data with --config CFG (and "
            "overrides), --data.* overrides of the recorded data, or nothing to use it as is"
        )
    recorded = check_recorded(recorded, directory)
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="ssl-rec predict", exit_on_error=False)
    parser.add_subclass_arguments(pl.LightningDataModule, "data")
    config = parser.parse_args([f"--data={json.dumps(class_config(recorded))}", *args])
    predict_whole_files(config)  # a new single file is scored whole, as from a checkpoint
    return parser.instantiate(config).data


def write_model_predictions(
    model: InferenceCTRModel,
    batches: Iterable[Batch],
    out: str,
    keys: pa.Table | None = None,
) -> Path:
    """Stream the probabilities of every batch to ``out``, one row per input row, in order.

    Args:
        model: the quantized model.
        batches: the predict loader's batches, in file order.
        out: ``.parquet``, ``.csv`` or ``.tsv`` file (:func:`ssl_rec.evaluation.predictions.
            prediction_file`).
        keys: key columns of every row of the split (:func:`ssl_rec.evaluation.predictions.
            key_columns`), or ``None``.

    Returns:
        ``out``.

    """
    with prediction_file(out, keys) as stream, torch.inference_mode():
        for batch in batches:
            probability = torch.sigmoid(model(batch.dense, batch.sparse)).float()
            stream.write(probability.numpy(), _numpy(batch.row_id), _numpy(batch.label))
    return Path(out)


def _numpy(values: torch.Tensor | None) -> np.ndarray | None:
    return None if values is None else values.detach().cpu().numpy()
