"""``ssl-rec retrieve``: the top-K of a copied export equal the trained model's, history out."""

from __future__ import annotations

import shutil
import warnings
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from ssl_rec.cli import main
from ssl_rec.evaluation import ItemCatalogue, Retriever
from ssl_rec.lightning import RetrievalModule
from ssl_rec.models import TowerEncoder, TwoTowerModel
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

USERS, ITEMS, K = 12, 20, 5
SCHEMA = FeatureSchema(
    ("age",),
    (CategoricalField("user", USERS + 1), CategoricalField("item", ITEMS + 1),
     CategoricalField("genre", 4)),
    "label",
)  # fmt: skip


def _rows(pairs: list[tuple[int, int]]) -> Batch:
    t = torch.tensor(pairs)
    return Batch(t[:, :1].float() / USERS, torch.stack([t[:, 0], t[:, 1], t[:, 1] % 3 + 1], 1))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[RetrievalModule, Path, Batch]:
    """A two-step fit, its export copied to a fresh directory, and the catalogue's rows."""
    warnings.filterwarnings("ignore", ".*(treespec|many workers|val_dataloader).*")
    torch.manual_seed(0)
    encoder = partial(TowerEncoder, hidden=[16], output_dim=8)
    towers = partial(TwoTowerModel, query_fields=["user", "age"], item_fields=["item", "genre"],
                     embedding_dim=4, query_encoder=encoder, item_encoder=encoder)  # fmt: skip
    module = RetrievalModule(towers, SCHEMA.to_dict(), learning_rate=1e-2)
    train = [(u, i) for u in range(1, USERS + 1) for i in range(1, ITEMS + 1) if i % 3 == u % 3]
    items = _rows([(0, i) for i in range(1, ITEMS + 1)])
    catalogue = ItemCatalogue(module.towers.item_batch(items), torch.arange(1, ITEMS + 1),
                              torch.tensor(train))  # fmt: skip
    module.set_catalogue(catalogue)
    pl.Trainer(default_root_dir=tmp_path_factory.mktemp("fit"), accelerator="cpu", max_steps=2,
               logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False).fit(
        module, DataLoader(train, batch_size=16, shuffle=True, collate_fn=_rows))  # fmt: skip
    exported = module.export(str(tmp_path_factory.mktemp("first") / "export"))
    copy = tmp_path_factory.mktemp("fresh") / "served"
    shutil.copytree(exported, copy)
    shutil.rmtree(exported)
    module.eval()
    return module, copy, module.towers.item_batch(items)


def _queries(n: int = USERS) -> Batch:
    return _rows([(u, 0) for u in range(1, n + 1)])


def _model_topk(module: RetrievalModule, items: Batch, exclude=None) -> tuple:
    with torch.no_grad():
        scores = module(_queries()) @ module.towers.encode_items(items).T
    for row, seen in enumerate(exclude or []):
        scores[row, torch.tensor(seen, dtype=torch.long) - 1] = -float("inf")
    top = torch.topk(scores, K, dim=1)
    return top.values, top.indices + 1  # catalogue row r is item r + 1


def _ranking(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    table = pq.read_table(path) if path.suffix == ".parquet" else pacsv.read_csv(path)
    assert table.column_names == ["row", "rank", "item", "score"]
    assert table.column("rank").to_pylist() == list(range(1, K + 1)) * USERS
    assert table.column("row").to_pylist() == [r for r in range(USERS) for _ in range(K)]
    if path.suffix == ".parquet":  # raw keys, as text (ids here: the export has no vocabulary)
        assert table.schema.field("item").type == pa.string()
    items = torch.tensor([int(i) for i in table.column("item").to_pylist()]).reshape(USERS, K)
    return torch.tensor(table.column("score").to_pylist()).reshape(USERS, K), items


def _users(tmp_path: Path, history: list[list[int]] | None = None) -> Path:
    path = tmp_path / "users.parquet"
    columns = {"user": list(range(1, USERS + 1)), "age": [u / USERS for u in range(1, USERS + 1)]}
    if history is not None:
        columns["seen"] = history
    pq.write_table(pa.table(columns), path)
    return path


def test_retrieve_writes_the_exact_top_k_of_the_model(trained, tmp_path) -> None:
    module, export, items = trained
    out = tmp_path / "top.parquet"
    main(["retrieve", "--index", str(export), "--data", str(_users(tmp_path)),
          "--k", str(K), "--out", str(out)])  # fmt: skip
    scores, ids = _ranking(out)
    loaded_scores, loaded_ids = Retriever.load(export).topk_ids(_queries(), K)
    want_scores, want_ids = _model_topk(module, items)
    assert torch.equal(ids, loaded_ids) and torch.equal(ids, want_ids)
    torch.testing.assert_close(scores, loaded_scores, atol=1e-6, rtol=0)
    torch.testing.assert_close(scores, want_scores, atol=1e-5, rtol=0)
    assert not torch.equal(ids[0], ids[1])  # users differ: the query tower was read


def test_the_history_column_is_excluded_from_the_ranking(trained, tmp_path) -> None:
    module, export, items = trained
    history = [[] if u % 4 == 0 else [(u * 7 + j) % ITEMS + 1 for j in range(u)]
               for u in range(1, USERS + 1)]  # fmt: skip
    history[3] = [int(i) for i in _model_topk(module, items)[1][3, :3]]  # its own best three
    csv = tmp_path / "users.csv"
    pacsv.write_csv(pq.read_table(_users(tmp_path)).append_column(
        "seen", pa.array([" ".join(map(str, h)) for h in history])), csv)  # fmt: skip
    for data, name in ((csv, "top.csv"), (_users(tmp_path, history), "top.parquet")):
        out = tmp_path / name
        main(["retrieve", "--ckpt_path", str(export), "--data", str(data), "--k", str(K),
              "--out", str(out), "--history", "seen"])  # fmt: skip
        scores, ids = _ranking(out)
        want_scores, want_ids = _model_topk(module, items, history)
        assert torch.equal(ids, want_ids), name
        torch.testing.assert_close(scores, want_scores, atol=1e-5, rtol=0)
        for row, seen in enumerate(history):
            assert not set(ids[row].tolist()) & set(seen), (name, row)
    assert torch.equal(ids, Retriever.load(export).topk_ids(_queries(), K, history)[1])


def test_topk_pads_a_row_whose_history_covers_the_catalogue(trained) -> None:
    _, export, _ = trained
    everything = list(range(1, ITEMS + 1))
    scores, ids = Retriever.load(export).topk_ids(_queries(2), K, [everything[2:], []])
    assert ids[0, :2].tolist() == [1, 2] or ids[0, :2].tolist() == [2, 1]
    assert ids[0, 2:].tolist() == [-1] * (K - 2) and bool(torch.isneginf(scores[0, 2:]).all())
    assert bool((ids[1] > 0).all())


def _bad(tmp_path: Path, export: Path, case: str) -> list[str]:
    users = _users(tmp_path)
    argv = {"--index": str(export), "--data": str(users), "--k": "3",
            "--out": str(tmp_path / "top.parquet")}  # fmt: skip
    if case == "missing column":
        pq.write_table(pa.table({"user": [1, 2]}), users)
    elif case == "unknown value":
        pq.write_table(pa.table({"user": [1, 99], "age": [0.1, 0.2]}), users)
    elif case == "raw values":
        pq.write_table(pa.table({"user": ["alice", "bob"], "age": [0.1, 0.2]}), users)
    elif case == "k below 1":
        argv["--k"] = "0"
    elif case == "k above catalogue":
        argv["--k"] = str(ITEMS + 1)
    elif case == "missing index":
        argv["--index"] = str(tmp_path / "nowhere")
    elif case == "not an export":
        argv["--index"] = str(tmp_path)
    elif case == "missing history column":
        argv["--history"] = "seen"
    elif case == "existing out":
        (tmp_path / "top.parquet").write_text("keep me")
    elif case == "unknown out suffix":
        argv["--out"] = str(tmp_path / "top.json")
    return ["retrieve", *[x for kv in argv.items() for x in kv]]


BAD = {
    "missing column": "no column 'age'",
    "unknown value": "holds id 99, not in the export's 0..12",
    "raw values": "column 'user' of type string is not int64",
    "k below 1": "--k 0: must be at least 1",
    "k above catalogue": "the catalogue has only 20 items",
    "missing index": "nowhere: no such export directory",
    "not an export": "not a retrieval export",
    "missing history column": "no history column 'seen'",
    "existing out": "already exists; pass --overwrite true",
    "unknown out suffix": "unknown suffix '.json'",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_exit_2(trained, tmp_path, capsys, case: str) -> None:
    argv = _bad(tmp_path, trained[1], case)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and err[-1].startswith("ssl-rec: error:"), err
    assert BAD[case] in err[-1], err
    if case == "existing out":
        assert (tmp_path / "top.parquet").read_text() == "keep me"
        main([*argv, "--overwrite", "true"])
        assert pq.read_table(tmp_path / "top.parquet").num_rows == USERS * 3
