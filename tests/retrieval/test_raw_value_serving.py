"""fit -> ``ssl-rec export`` -> ``ssl-rec retrieve`` on raw values, from a copied export alone.

The user's own interaction table (raw string ids, a context column, a numeric column, a
label and a time column) trains a two-tower model; the export is copied, the original export
and the table are deleted and ``SSL_REC_CACHE`` points to an empty directory, and
``ssl-rec retrieve`` must still write, for every test user, the in-process model's top-K
item keys with the user's history excluded.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch

from ssl_rec.cli import main
from ssl_rec.data.sources.interaction_table import InteractionTableDataModule
from ssl_rec.lightning import RetrievalModule

USERS, ITEMS, K = 30, 24, 5
ENCODER = {"class_path": "ssl_rec.models.TowerEncoder",
           "init_args": {"hidden": [16], "output_dim": 8}}  # fmt: skip
TOWERS = {
    "class_path": "ssl_rec.models.TwoTowerModel",
    "init_args": {"query_fields": ["user", "device", "age"], "item_fields": ["item", "brand"],
                  "embedding_dim": 4, "query_encoder": ENCODER, "item_encoder": ENCODER},
}  # fmt: skip


def interactions(path: Path) -> Path:
    """Each user rates the 8 items of its cluster (rating >= 3 is a positive), in shuffled time."""
    rng = np.random.default_rng(0)
    rows = []
    for u in range(USERS):
        liked = [i for i in range(ITEMS) if i % 3 == u % 3]
        for t, i in enumerate(rng.permutation(liked)):
            rating = 1 if t == 4 else 5  # one negative per user, kept in its history
            rows.append((f"user-{u}", f"sku{i:03d}", f"brand{i % 4}", ["ios", "web"][t % 2],
                         20.0 + u, rating, int(rng.integers(1e9))))  # fmt: skip
    names = ["user", "item", "brand", "device", "age", "rating", "ts"]
    pq.write_table(pa.table(dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))),
                   path)  # fmt: skip
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """A short fit on the table and its checkpoint."""
    warnings.filterwarnings("ignore", ".*(treespec|many workers|val_dataloader).*")
    root = tmp_path_factory.mktemp("fit")
    dm = InteractionTableDataModule(
        str(interactions(root / "views.parquet")), "user", "item", ["user", "item", "device",
        "brand"], ["age"], ["item", "brand"], label="rating", threshold=3, time="ts",
        batch_size=32,
    )  # fmt: skip
    torch.manual_seed(0)
    module = RetrievalModule(TOWERS, dm.schema.to_dict(), learning_rate=1e-2)
    trainer = pl.Trainer(default_root_dir=root, accelerator="cpu", max_steps=4, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0)  # fmt: skip
    trainer.fit(module, datamodule=dm)
    trainer.save_checkpoint(root / "last.ckpt")
    return module.eval(), dm, root


def expected(module: RetrievalModule, dm: InteractionTableDataModule) -> tuple:
    """The in-process model's top-K keys and scores of each test row, history excluded."""
    rows, cat = dm.rows("test"), module.catalogue
    users = rows.sparse[:, dm.schema.field_index("user")]
    with torch.no_grad():
        scores = module(rows) @ module.towers.encode_items(cat.items).T
    scores[cat.seen(users)] = -torch.inf
    top = torch.topk(scores, K, dim=1)
    keys = np.asarray(dm.vocabulary.id_values("item").to_pylist())
    return keys[cat.item_ids[top.indices].numpy()], top.values


def test_export_then_retrieve_from_a_copy_ranks_like_the_model(fitted, tmp_path, monkeypatch):
    module, dm, root = fitted
    main(["export", "--ckpt_path", str(root / "last.ckpt"), "--out", str(tmp_path / "export")])
    served = tmp_path / "elsewhere" / "served"
    shutil.copytree(tmp_path / "export", served)
    shutil.rmtree(tmp_path / "export")
    table = pq.read_table(root / "views.parquet")
    (root / "views.parquet").unlink()  # no training data ...
    monkeypatch.setenv("SSL_REC_CACHE", str(tmp_path / "empty-cache"))  # ... and no cache
    # Every test user as the service sees it: raw values, the history as raw item keys.
    rows = dm.rows("test")
    raw = {
        name: np.asarray(dm.vocabulary.id_values(name).to_pylist())[
            rows.sparse[:, dm.schema.field_index(name)].numpy()
        ]
        for name in ("user", "device")
    }
    ages = dict(zip(table.column("user").to_pylist(), table.column("age").to_pylist(),
                    strict=True))  # fmt: skip
    history = {}
    item_values = np.asarray(dm.vocabulary.id_values("item").to_pylist())
    for user, item in dm.history().tolist():
        history.setdefault(user, []).append(str(item_values[item]))
    users = rows.sparse[:, dm.schema.field_index("user")].tolist()
    pq.write_table(pa.table({
        "user": raw["user"].tolist(), "device": raw["device"].tolist(),
        "age": [ages[u] for u in raw["user"].tolist()], "seen": [history[u] for u in users],
    }), tmp_path / "users.parquet")  # fmt: skip
    out = tmp_path / "top.parquet"
    main(["retrieve", "--index", str(served), "--data", str(tmp_path / "users.parquet"),
          "--k", str(K), "--out", str(out), "--history", "seen"])  # fmt: skip
    got = pq.read_table(out)
    want_keys, want_scores = expected(module, dm)
    assert len(users) == USERS and got.num_rows == USERS * K
    assert np.array_equal(np.asarray(got.column("item").to_pylist()).reshape(USERS, K), want_keys)
    np.testing.assert_allclose(np.asarray(got.column("score").to_pylist()).reshape(USERS, K),
                               want_scores.numpy(), atol=1e-5, rtol=0)  # fmt: skip
    for row, user in enumerate(users):
        assert not set(want_keys[row]) & set(history[user])
    assert len({tuple(r) for r in want_keys.tolist()}) > 1  # the query tower was read


def test_the_split_follows_time_and_labels(fitted, tmp_path) -> None:
    _, dm, _ = fitted
    assert dm.schema.field_names == ["user", "item", "device", "brand"]
    assert dm.schema.dense == ("age",) and dm.dense_scaling["age"][0] == pytest.approx(34.5)
    val, test = dm.split_positives("val"), dm.split_positives("test")
    assert len(val) == len(test) == USERS  # 7 positives each: one validation, one test
    assert len(dm.train_positives()) == USERS * 5
    assert len(dm.history()) == USERS * 6  # training positives and the negative
    # The test item is each user's last positive in time (the file is not in time order).
    table = pq.read_table(interactions(tmp_path / "again.parquet")).to_pylist()
    last = {}
    for row in sorted((r for r in table if r["rating"] >= 3), key=lambda r: r["ts"]):
        last[row["user"]] = row["item"]
    users, items = (np.asarray(dm.vocabulary.id_values(f).to_pylist()) for f in ("user", "item"))
    assert {users[u]: items[i] for u, i in test.tolist()} == last
    catalogue = dm.catalogue()
    assert catalogue.batch_size == ITEMS and (catalogue.sparse[:, 0] == 0).all()
    assert (catalogue.sparse[:, dm.schema.field_index("brand")] > 0).all()


def test_a_missing_column_of_the_table_is_named(tmp_path) -> None:
    path = interactions(tmp_path / "views.parquet")
    with pytest.raises(ValueError, match=r"no columns \['shop'\]"):
        InteractionTableDataModule(str(path), "user", "item", ["user", "item", "shop"])
