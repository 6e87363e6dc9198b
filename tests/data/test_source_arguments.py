"""Every source hands its loader arguments to ArrowDataModule by name and records them all."""

import inspect

import pytest

from ssl_rec.data import CriteoDataModule, SyntheticCTRDataModule, TabularDataModule

SHARED = {"batch_size": 64, "label_fraction": 0.5, "use_labels": True, "seed": 3,
          "eval_batch_size": 256, "unlabeled_per_batch": 2.0}  # fmt: skip


@pytest.mark.parametrize(
    ("cls", "own"),
    [
        (CriteoDataModule, {"path": "days/", "drop_last": True}),
        (SyntheticCTRDataModule, {"n_train": 100, "drop_last": True}),
        (TabularDataModule, {"path": "rows.csv", "label": "y", "dense": ["x"]}),
    ],
)
def test_loader_arguments_reach_the_base_and_the_hparams(cls, own, tmp_path):
    dm = cls(**own, **SHARED, cache_dir=str(tmp_path))
    assert (dm.batch_size, dm.label_fraction, dm.use_labels, dm.seed) == (64, 0.5, True, 3)
    assert (dm.eval_batch_size, dm.unlabeled_per_batch) == (256, 2.0)
    assert dm.drop_last is own.get("drop_last", False)
    assert dm.cache_dir == tmp_path
    recorded = set(dm.hparams) - {"_class_path"}
    assert recorded == set(inspect.signature(cls.__init__).parameters) - {"self"}
    assert dm.hparams["_class_path"].endswith(cls.__name__)


def test_an_unlabeled_file_takes_the_mix_off_the_base_check(tmp_path):
    # label_fraction 1 with a mix fails the base's check; with an unlabeled file it is allowed.
    with pytest.raises(ValueError, match="unlabeled_per_batch"):
        TabularDataModule("rows.csv", "y", ["x"], unlabeled_per_batch=1.0, cache_dir=str(tmp_path))
    dm = TabularDataModule("rows.csv", "y", ["x"], unlabeled_per_batch=1.0,
                           unlabeled_path="more.csv", cache_dir=str(tmp_path))  # fmt: skip
    assert dm.unlabeled_per_batch == 1.0 and dm.hparams["unlabeled_path"] == "more.csv"
