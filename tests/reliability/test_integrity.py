"""Integrity: changed bytes in a cache shard, a quantized directory or an export are reported in
one line naming the file; training stops on a non-finite loss or weight."""

from __future__ import annotations

import json
import shutil
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from cli_outcome import error_line

from ssl_rec._io import ChecksumError, file_checksum
from ssl_rec.cli import main
from ssl_rec.data import SyntheticCTRDataModule
from ssl_rec.data.storage import CHECKSUMS_FILENAME, write_entry_checksums
from ssl_rec.evaluation import EmbeddingIndex, IndexConfig, export_embeddings
from ssl_rec.hardware import TableSpec
from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection
from ssl_rec.lightning.finite_checks import FiniteChecks, NonFiniteError
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.quantize import load_quantized, read_vocabularies
from ssl_rec.schema import CategoricalField, FeatureSchema

TINY = ["--trainer.fast_dev_run=1", "--trainer.logger=false"]
SIZES = {"n_train": 500, "n_val": 100, "n_test": 100}
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
COLUMNS = ["--data.label", "clicked", "--data.dense", "[price]",
           "--data.categorical", "[user,item]"]  # fmt: skip


def _flip(path: Path, length: int = 1) -> None:
    """XOR ``length`` bytes in the middle of ``path`` with 0x01 (the file keeps its size)."""
    data = bytearray(path.read_bytes())
    start = max(0, len(data) // 2 - length // 2)
    for i in range(start, min(len(data), start + length)):
        data[i] ^= 0x01
    path.write_bytes(bytes(data))


def _synthetic_entry(tmp_path: Path) -> Path:
    """The cache entry ``ssl-rec fit --config configs/ctr/synthetic.yaml`` with SIZES uses."""
    data = SyntheticCTRDataModule(**SIZES, batch_size=4096, cache_dir=str(tmp_path / "cache"))
    return data.data_dir


def _fit_synthetic(tmp_path: Path, config: str = "configs/ctr/synthetic.yaml") -> list[str]:
    sizes = [f"--data.init_args.{k}={v}" for k, v in SIZES.items()]
    return ["fit", "--config", config, *sizes, f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            f"--trainer.default_root_dir={tmp_path / 'run'}", *TINY]  # fmt: skip


# --- cache shards -------------------------------------------------------------------------


def test_a_changed_cache_shard_stops_fit_with_one_line(tmp_path, capsys) -> None:
    entry = _synthetic_entry(tmp_path)
    shard = entry / "train" / "00000.arrow"
    _flip(shard)
    with pytest.raises(SystemExit) as exit_info:
        main(_fit_synthetic(tmp_path))
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert str(shard) in line and f"delete {entry}" in line, line


def test_verification_can_be_turned_off_and_the_changed_shard_still_opens(
    tmp_path, monkeypatch
) -> None:
    data = SyntheticCTRDataModule(**SIZES, cache_dir=str(tmp_path / "cache"))
    shard = data.data_dir / "train" / "00000.arrow"
    _flip(shard)
    with pytest.raises(ChecksumError, match="00000.arrow"):
        data.split_table("train")
    monkeypatch.setenv("SSL_REC_VERIFY", "0")
    # Without the check the garbage is in range: Arrow opens the shard and serves its rows.
    assert data.split_table("train").num_rows == SIZES["n_train"]


def test_a_cache_entry_without_checksums_still_loads(tmp_path) -> None:
    entry = _synthetic_entry(tmp_path)
    (entry / CHECKSUMS_FILENAME).unlink()
    _flip(entry / "train" / "00000.arrow")
    data = SyntheticCTRDataModule(**SIZES, cache_dir=str(tmp_path / "cache"))
    assert data.data_dir == entry and data.split_table("train").num_rows == SIZES["n_train"]
    assert data.vocabulary is not None


def test_checksums_cover_every_file_of_the_entry(tmp_path) -> None:
    entry = _synthetic_entry(tmp_path)
    files = json.loads((entry / CHECKSUMS_FILENAME).read_text())["files"]
    on_disk = {p.relative_to(entry).as_posix() for p in entry.rglob("*") if p.is_file()}
    assert set(files) == on_disk - {CHECKSUMS_FILENAME}
    assert files["train/00000.arrow"] == file_checksum(entry / "train" / "00000.arrow")


# --- quantized directories ----------------------------------------------------------------


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, write_clicks) -> tuple[Path, Path]:
    """A quantized model directory of a tiny tabular CTR model, and its data file."""
    root = tmp_path_factory.mktemp("quantized")
    write_clicks(root / "clicks.csv", 600, users=20, seed=0)
    main(["fit", "--config", "configs/ctr/tabular.yaml", "--data.path", str(root / "clicks.csv"),
          *COLUMNS, "--data.batch_size", "128", "--trainer.max_epochs", "1",
          "--trainer.default_root_dir", str(root / "run"), *QUIET])  # fmt: skip
    ckpt = root / "run" / "checkpoints" / "last.ckpt"
    main(["quantize", "--ckpt_path", str(ckpt), "--out", str(root / "q"), "--budget_ne", "0.001"])
    return root / "q", root / "clicks.csv"


def _copy(directory: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(directory, tmp_path / directory.name))


def test_an_edited_quantized_vocabulary_stops_predict_with_one_line(
    quantized, tmp_path, capsys
) -> None:
    directory = _copy(quantized[0], tmp_path)
    _flip(directory / "vocabulary.arrow")
    out = tmp_path / "p.parquet"
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--ckpt_path", str(directory), "--data.path", str(quantized[1]),
              "--out", str(out)])  # fmt: skip
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert str(directory / "vocabulary.arrow") in line and "ssl-rec quantize" in line, line
    assert not out.exists()
    with pytest.raises(ChecksumError, match="vocabulary.arrow"):
        read_vocabularies(directory)


def test_a_changed_quantized_weight_file_is_refused(quantized, tmp_path) -> None:
    directory = _copy(quantized[0], tmp_path)
    load_quantized(directory)
    _flip(directory / "model.pt", 64)
    with pytest.raises(ChecksumError, match="model.pt"):
        load_quantized(directory)


def test_a_quantized_directory_without_checksums_still_loads(quantized, tmp_path) -> None:
    directory = _copy(quantized[0], tmp_path)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert set(manifest.pop("checksums")) >= {"model.pt", "schema.json", "vocabulary.arrow"}
    (directory / "manifest.json").write_text(json.dumps(manifest))
    _flip(directory / "report.json")  # no record, so no check: still read
    assert load_quantized(directory).schema.field_names == ["user", "item"]
    assert read_vocabularies(directory).names == ["user", "item"]


# --- exports ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """An export of a tiny untrained backbone (fields C1 and C2, exact indexes)."""
    schema = FeatureSchema(["I1"], [CategoricalField("C1", 50), CategoricalField("C2", 400)])
    encoder = partial(DLRMEncoder, bottom=[8], top=[8])
    backbone = Backbone(schema, embedding_dim=8, encoder=encoder, seed=0)
    out = tmp_path_factory.mktemp("export") / "e"
    return export_embeddings(backbone, schema, out, config=IndexConfig("Flat"), progress=False)


def test_a_faiss_index_with_4kb_flipped_is_refused(export, tmp_path) -> None:
    directory = _copy(export, tmp_path)
    EmbeddingIndex.load(directory)
    index = directory / "C2.faiss"
    assert index.stat().st_size > 3 * 4096
    _flip(index, 4096)
    with pytest.raises(ChecksumError, match=r"C2\.faiss"):
        EmbeddingIndex.load(directory)


def test_an_export_without_checksums_still_loads(export, tmp_path, monkeypatch) -> None:
    directory = _copy(export, tmp_path)
    _flip(directory / "C1.vectors.npy")
    with pytest.raises(ChecksumError, match=r"C1\.vectors\.npy"):
        EmbeddingIndex.load(directory)
    monkeypatch.setenv("SSL_REC_VERIFY", "off")
    assert EmbeddingIndex.load(directory).set_names == ["C1", "C2"]
    monkeypatch.delenv("SSL_REC_VERIFY")
    manifest = json.loads((directory / "manifest.json").read_text())
    del manifest["checksums"]
    (directory / "manifest.json").write_text(json.dumps(manifest))
    index = EmbeddingIndex.load(directory)
    assert index.manifest.checksums is None
    assert index.search(index.vectors("C2")[:3], 1, "C2")[1].shape == (3, 1)


# --- non-finite values --------------------------------------------------------------------


def _poison_dense(entry: Path) -> None:
    """Make every dense value of the training shard NaN and re-record the checksums, as if
    the garbage had been there when the entry was written (past the input's validation)."""
    shard = entry / "train" / "00000.arrow"
    table = pa.ipc.open_stream(shard.read_bytes()).read_all()
    dense = table.column("dense").combine_chunks()
    nan = pa.array(np.full(len(dense.flatten()), np.nan, np.float32))
    poisoned = pa.FixedSizeListArray.from_arrays(nan, dense.type.list_size)
    table = table.set_column(table.schema.get_field_index("dense"), "dense", poisoned)
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    write_entry_checksums(entry)


@pytest.mark.parametrize(
    "config,names",
    [
        ("configs/ctr/synthetic.yaml", ["step 0", "the CTR loss", "nan"]),
        ("configs/pretrain/mfp.yaml", ["step 0", "the train loss of objective 'mfp'", "nan"]),
    ],
)
def test_a_nan_loss_stops_fit_with_one_line(tmp_path, capsys, config, names) -> None:
    _poison_dense(_synthetic_entry(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(_fit_synthetic(tmp_path, config))
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    for part in names:
        assert part in line, (part, line)


def test_the_finite_checks_are_registered_for_fit_and_can_be_turned_off(tmp_path, capsys) -> None:
    _poison_dense(_synthetic_entry(tmp_path))
    # With the loss check off the NaN loss reaches the tables; the weights check at the
    # checkpoint names the table instead of writing a NaN model.
    argv = _fit_synthetic(tmp_path)[:-2] + [
        "--trainer.logger=false", "--trainer.max_steps=1", "--trainer.limit_val_batches=1",
        "--finite_checks.loss=false",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert "step 1" in line and "non-finite" in line, line
    assert not list((tmp_path / "run").rglob("*.ckpt"))


def test_non_finite_table_rows_stop_before_a_checkpoint() -> None:
    tables = MixedPrecisionEmbeddingCollection([30, 5000], 8, TableSpec("int8", 0.1),
                                               table_names=["user", "item"])  # fmt: skip
    module = torch.nn.Module()
    module.tables = tables
    callback = FiniteChecks(chunk_rows=1024)
    callback.on_save_checkpoint(SimpleNamespace(global_step=3), module, {})  # all finite
    weight = tables.float_weights()[1]
    weight[4321, 2] = float("inf")
    tables.load_float(1, weight)
    with pytest.raises(NonFiniteError, match=r"step 4: embedding table 'item' has 1 non-finite rows"
                       r" \(first: id 4321\)"):  # fmt: skip
        callback.on_save_checkpoint(SimpleNamespace(global_step=4), module, {})
    assert isinstance(NonFiniteError("x"), ValueError)  # exit 2 at the command line
