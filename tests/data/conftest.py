import os

import pytest

from ssl_rec.data import SyntheticClickModel, SyntheticConfig, write_criteo_tsv

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="session")
def small_rows():
    return SyntheticClickModel(SyntheticConfig(seed=3)).rows("train", 0, 3000)


@pytest.fixture(scope="session")
def criteo_file(tmp_path_factory, small_rows):
    return write_criteo_tsv(tmp_path_factory.mktemp("criteo") / "train.txt", small_rows)
