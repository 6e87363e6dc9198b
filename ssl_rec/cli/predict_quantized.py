"""``ssl-rec predict --ckpt_path DIR --out FILE``: click probabilities from a quantized model.

The data module comes from ``--config`` files and overrides, as for LightningCLI's
``predict`` (``ssl-rec predict --config configs/ctr/synthetic.yaml --ckpt_path DIR --out
pred.parquet``); from ``--data.*`` overrides of the one recorded when the model was
quantized (``ssl-rec predict --ckpt_path DIR --data.path new.csv --out pred.parquet``: as
from a checkpoint, a single file is then scored whole); or, with neither, from the recorded
one itself. The data is encoded with the model's vocabularies (kept in the directory), so
new files get the trained ids. Its prediction split is read in file order and written
batch by batch, one row per input row: ``row_id`` (the row's position in the split) and
``probability``, to Parquet, or to CSV when ``--out`` ends in ``.csv``. The file appears
complete or not at all.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytorch_lightning as pl
import torch

from ssl_rec.cli.checkpoint_args import class_config
from ssl_rec.cli.datamodules import check_recorded, encoded_with, recorded_datamodule
from ssl_rec.cli.predict import predict_whole_files
from ssl_rec.cli.quantize_commands import check_schema
from ssl_rec.quantize import (
    InferenceCTRModel,
    is_quantized_dir,
    load_quantized,
    read_manifest,
    read_vocabularies,
)

PREDICTION_SCHEMA = pa.schema([("row_id", pa.int64()), ("probability", pa.float32())])


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
    """Entry of ``ssl-rec predict`` for a quantized model directory."""
    args = list(argv)
    directory = _option(args, "--ckpt_path", remove=True)
    out = _option(args, "--out", remove=True)
    if not out:
        raise ValueError(
            "ssl-rec predict from a quantized model needs --out FILE (.parquet or .csv)"
        )
    model = load_quantized(directory)
    datamodule = _datamodule(args, directory)
    check_schema(model.schema, datamodule.schema, "the prediction data")
    datamodule.prepare_data()
    datamodule.setup("predict")
    path = write_predictions(model, datamodule.predict_dataloader(), out)
    print(f"predictions written to {path}")
    return path


def _datamodule(args: list[str], directory: str) -> pl.LightningDataModule:
    """The prediction data, encoded with the model's vocabularies when the directory has them."""
    recorded = read_manifest(directory).get("data")
    if not args:
        datamodule = recorded_datamodule(recorded, directory)
    elif any(a == "--config" or a.startswith("--config=") for a in args):
        from ssl_rec.cli.main import instantiate  # the LightningCLI parser of `ssl-rec predict`

        datamodule = instantiate(args).datamodule
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


def write_predictions(model: InferenceCTRModel, batches: object, out: str) -> Path:
    """Stream ``row_id`` and ``probability`` of every batch to ``out`` (Parquet or CSV)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    as_csv = path.suffix.lower() == ".csv"
    writer_cls = pa_csv.CSVWriter if as_csv else pq.ParquetWriter
    try:
        with writer_cls(str(tmp), PREDICTION_SCHEMA) as writer, torch.inference_mode():
            for batch in batches:
                probability = torch.sigmoid(model(batch.dense, batch.sparse)).numpy()
                row_id = (
                    batch.row_id
                    if batch.row_id is not None
                    else torch.full((batch.batch_size,), -1)
                )
                table = pa.table(
                    [pa.array(row_id.numpy()), pa.array(probability)], schema=PREDICTION_SCHEMA
                )
                writer.write_table(table)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
