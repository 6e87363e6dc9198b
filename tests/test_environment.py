"""Process defaults of the command line: dependency noise silenced, user warnings kept."""

import warnings

import pytest
from torch.utils import _pytree

from ssl_rec.cli.environment import configure_environment


@pytest.fixture
def configured(monkeypatch):
    """configure_environment() with its filters undone after the test."""
    for key in ("WANDB_MODE", "WANDB_SILENT", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(key, "offline" if key == "WANDB_MODE" else "1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        configure_environment()
        yield caught


def test_lightning_treespec_deprecation_is_silenced(configured):
    # Lightning builds torch's deprecated LeafSpec on every fit; the exact warning torch emits
    _pytree.LeafSpec()
    assert not [w for w in configured if "LeafSpec" in str(w.message)], configured


def test_other_future_warnings_still_show(configured):
    warnings.warn("a setting of yours is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in configured] == ["a setting of yours is deprecated"]
