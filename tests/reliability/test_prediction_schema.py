"""One prediction schema: `ssl-rec predict` writes the same columns for every kind of model.

A checkpoint and the quantized directory made from it score the same new file; both files
have ``row``, the ``--predictions.keys`` columns, ``label`` and ``probability``, with the
same names, order and types, and both are written atomically by the one writer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ssl_rec.cli import main
from ssl_rec.evaluation.predictions import prediction_file, write_predictions

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
COLUMNS = ["--data.label", "clicked", "--data.dense", "[price]",
           "--data.categorical", "[user,item]"]  # fmt: skip
NEW_ROWS = 300


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, write_clicks) -> dict:
    """A 1-epoch tabular DLRM, its quantized directory, and a new file to score."""
    root = tmp_path_factory.mktemp("schema")
    write_clicks(root / "clicks.csv", 800, users=30, seed=0)
    main(["fit", "--config", "configs/ctr/tabular.yaml", "--data.path", str(root / "clicks.csv"),
          *COLUMNS, "--data.batch_size", "128", "--trainer.max_epochs", "1",
          "--data.cache_dir", str(root / "cache"),
          "--trainer.default_root_dir", str(root / "run"), *QUIET])  # fmt: skip
    ckpt = root / "run" / "checkpoints" / "last.ckpt"
    quantized = root / "q"
    main(["quantize", "--ckpt_path", str(ckpt), "--out", str(quantized), "--budget_ne", "0.01",
          "--calibration_rows", "64", "--evaluation_rows", "64"])  # fmt: skip
    write_clicks(root / "new.csv", NEW_ROWS, users=30, seed=1)
    return {"root": root, "ckpt": ckpt, "quantized": quantized, "new": root / "new.csv"}


def _predict(models: dict, model: Path, out: Path, *extra: str) -> None:
    """`ssl-rec predict` of the new file with a checkpoint or a quantized directory."""
    args = ["predict", "--ckpt_path", str(model), "--data.path", str(models["new"]),
            "--predictions.out", str(out), *extra]  # fmt: skip
    if model.is_file():  # a checkpoint: a Lightning run, with its own run directory
        args += ["--trainer.default_root_dir", str(out.parent / "run"), *QUIET]
    main(args)


def _fields(table: pa.Table) -> list[tuple[str, pa.DataType]]:
    return [(field.name, field.type) for field in table.schema]


@pytest.mark.parametrize("keys", [["--predictions.keys", "[user,item]"], []], ids=["keys", "none"])
def test_checkpoint_and_quantized_predictions_have_one_schema(
    models: dict, tmp_path: Path, keys: list[str]
) -> None:
    from_ckpt, from_dir = tmp_path / "ckpt" / "p.parquet", tmp_path / "q" / "p.parquet"
    _predict(models, models["ckpt"], from_ckpt, *keys)
    _predict(models, models["quantized"], from_dir, *keys)
    ours, theirs = pq.read_table(from_dir), pq.read_table(from_ckpt)
    names = ["row", *(["user", "item"] if keys else []), "label", "probability"]
    assert [name for name, _ in _fields(theirs)] == names
    assert _fields(ours) == _fields(theirs)
    assert dict(_fields(ours))["row"] == pa.int64()
    assert dict(_fields(ours))["probability"] == pa.float32()
    assert dict(_fields(ours))["label"] == pa.float32()
    # the same rows, in input order, keyed by the input's own values
    raw = pacsv.read_csv(models["new"]).to_pydict()
    for table in (ours, theirs):
        assert table.column("row").to_pylist() == list(range(NEW_ROWS))
        assert table.column("label").to_pylist() == [float(c) for c in raw["clicked"]]
        if keys:
            assert table.column("user").to_pylist() == raw["user"]
            assert table.column("item").to_pylist() == raw["item"]
    p, q = ours.column("probability").to_numpy(), theirs.column("probability").to_numpy()
    assert np.all((p > 0) & (p < 1)) and np.abs(p - q).max() < 0.05


def test_csv_predictions_have_one_header_and_out_is_an_alias(models: dict, tmp_path: Path) -> None:
    from_ckpt, from_dir = tmp_path / "ckpt" / "p.csv", tmp_path / "q" / "p.csv"
    _predict(models, models["ckpt"], from_ckpt, "--predictions.keys", "[item]")
    main(["predict", "--ckpt_path", str(models["quantized"]), "--data.path", str(models["new"]),
          "--out", str(from_dir), "--predictions.keys=[item]"])  # fmt: skip
    header = from_dir.read_text().splitlines()[0]
    assert header == from_ckpt.read_text().splitlines()[0] == '"row","item","label","probability"'
    assert len(from_dir.read_text().splitlines()) == NEW_ROWS + 1


def _one_line_error(args: list[str], capsys: pytest.CaptureFixture, message: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err, err
    assert err.count("ssl-rec: error:") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--predictions.keys", "[no_such_column]"], "no_such_column"),
        (["--predictions.keys", "[user,label]"], "'label'"),
        (["--predictions.keys", "user"], "predictions.keys"),
    ],
    ids=["missing", "clash", "not-a-list"],
)
@pytest.mark.parametrize("kind", ["ckpt", "quantized"])
def test_bad_keys_are_one_line_errors_and_write_nothing(
    models: dict, tmp_path: Path, capsys: pytest.CaptureFixture, kind: str, extra, message
) -> None:
    out = tmp_path / "p.parquet"
    with pytest.raises(SystemExit) as exit_info:
        _predict(models, models[kind], out, *extra)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err, err
    assert err.count("ssl-rec: error:") == 1 and "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".p.parquet.*"))


def test_quantized_predict_refuses_an_unknown_suffix_or_no_file(
    models: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    base = ["predict", "--ckpt_path", str(models["quantized"])]
    _one_line_error([*base, "--out", str(tmp_path / "p.json")], capsys, "'.json'")
    _one_line_error(base, capsys, "--predictions.out FILE")
    assert not list(tmp_path.iterdir())


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    out = tmp_path / "pred.parquet"
    write_predictions(out, np.array([0.5, 0.25]), {"user": np.array(["a", "b"])})
    before = out.read_bytes()
    with pytest.raises(ValueError, match="out of order"), prediction_file(out) as stream:
        stream.write(np.array([0.1, 0.2]), row=np.array([0, 1]))
        stream.write(np.array([0.3]), row=np.array([3]))  # row 2 is missing
    with pytest.raises(ValueError, match="2 rows of key columns for 3 predictions"):
        write_predictions(out, np.array([0.1, 0.2, 0.3]), {"user": np.array(["a", "b"])})
    with pytest.raises(ValueError, match="labels in some prediction batches only"):
        with prediction_file(out) as stream:
            stream.write(np.array([0.1]), label=np.array([1.0]))
            stream.write(np.array([0.2]))
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["pred.parquet"]


def test_streamed_batches_are_one_file_in_order(tmp_path: Path) -> None:
    out = tmp_path / "pred.tsv"
    user = np.array([f"u{i}" for i in range(5)])
    with prediction_file(out, {"user": user}) as stream:
        stream.write(np.array([0.1, 0.2]), row=np.array([0, 1]), label=np.array([0.0, 1.0]))
        stream.write(np.array([0.3, 0.4, 0.5]), label=np.array([1.0, 0.0, 1.0]))
    table = pacsv.read_csv(out, parse_options=pacsv.ParseOptions(delimiter="\t"))
    assert table.column_names == ["row", "user", "label", "probability"]
    assert table.column("row").to_pylist() == [0, 1, 2, 3, 4]
    assert table.column("user").to_pylist() == user.tolist()
    np.testing.assert_allclose(table.column("probability").to_numpy(), [0.1, 0.2, 0.3, 0.4, 0.5])
    empty = tmp_path / "empty.parquet"
    with prediction_file(empty, {"user": user[:0]}):
        pass
    assert pq.read_table(empty).schema.names == ["row", "user", "probability"]
