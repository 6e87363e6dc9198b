"""`ssl-rec predict --ckpt_path QUANTIZED_DIR --data.path NEW_FILE`: new files, trained ids."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from ssl_rec.cli import main
from ssl_rec.quantize import read_vocabularies

QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]
COLUMNS = ["--data.label", "clicked", "--data.dense", "[price]",
           "--data.categorical", "[user,item]"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory, write_clicks):
    root = tmp_path_factory.mktemp("own")
    write_clicks(root / "clicks.csv", 4000, users=60, seed=0)
    main(["fit", "--config", "configs/ctr/tabular.yaml", "--data.path", str(root / "clicks.csv"),
          *COLUMNS, "--data.batch_size", "128", "--trainer.max_epochs", "3",
          "--trainer.default_root_dir", str(root / "run"),
          *QUIET])  # fmt: skip
    ckpt = root / "run" / "checkpoints" / "last.ckpt"
    out = root / "q"
    main(["quantize", "--ckpt_path", str(ckpt), "--out", str(out), "--budget_ne", "0.001"])
    return root, ckpt, out


def test_directory_keeps_the_models_vocabularies(trained):
    _, _, out = trained
    vocabularies = read_vocabularies(out)
    assert vocabularies is not None and vocabularies.names == ["user", "item"]
    assert vocabularies["user"].cardinality == 61  # 60 users and the reserved id 0


def test_a_new_file_is_scored_whole_with_the_trained_ids(trained, write_clicks):
    root, ckpt, out = trained
    # 400 rows over the first 20 users only: a vocabulary fitted on this file would differ.
    new = root / "new.csv"
    write_clicks(new, 400, users=20, seed=1)
    quantized = root / "quantized.parquet"
    main(["predict", "--ckpt_path", str(out), "--data.path", str(new), "--out", str(quantized)])
    checkpoint = root / "checkpoint.parquet"
    main(["predict", "--ckpt_path", str(ckpt), "--data.path", str(new),
          "--predictions.out", str(checkpoint), "--trainer.default_root_dir",
          str(root / "predict"), *QUIET])  # fmt: skip
    ours, theirs = pq.read_table(quantized), pq.read_table(checkpoint)
    assert ours.column("row").to_pylist() == list(range(400))
    assert theirs.column("row").to_pylist() == list(range(400))
    p = ours.column("probability").to_numpy()
    q = theirs.column("probability").to_numpy()
    assert np.abs(p - q).max() < 0.05
    # the trained ids carry what was learnt: even users click more (in both models)
    users = np.array([line.split(",")[2] for line in new.read_text().split()[1:]])
    even = np.array([int(u[1:]) % 2 == 0 for u in users])
    assert p[even].mean() > p[~even].mean() + 0.1


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--data.no_such_option", "1"], "no_such_option"),
        (["--trainer.max_epochs", "1"], "unexpected options"),
    ],
)
def test_bad_overrides_are_one_line_errors(trained, tmp_path, capsys, extra, message):
    _, _, out = trained
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--ckpt_path", str(out), *extra, "--out", str(tmp_path / "p.parquet")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err, err
    assert err.count("ssl-rec: error:") == 1
    assert not (tmp_path / "p.parquet").exists()
