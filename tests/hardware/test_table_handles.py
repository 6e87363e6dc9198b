"""Tables passed to the compiled kernels as one validated handle, kept by the table group."""

import copy
import gc
import pickle
import sys

import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec, huge_pages
from ssl_rec.hardware.kernels.dispatch import CompiledKernels, load_compiled

IDS = torch.tensor([[1, 2], [3, 4], [1, 9]])


@pytest.fixture
def compiled():
    return CompiledKernels(load_compiled())


def _collection():
    specs = [TableSpec("int8", 0.5), TableSpec("fp32", optimizer="sgd")]
    return MixedPrecisionEmbeddingCollection([20, 10], 8, specs, seed=0).train()


def _train_step(emb, ids=IDS):
    emb(ids).square().sum().backward()


def test_a_bound_view_validates_a_tensor_changed_in_place_again(compiled):
    t = compiled.bind(_collection().group.tensors())
    compiled.forward(t, IDS)
    t.stores[0].resize_(5, t.stores[0].shape[1])  # fewer rows than the table's 20
    with pytest.raises(ValueError, match="table 0: store must have shape"):
        compiled.forward(t, IDS)
    # a copy with other lists carries no handle: its own tensors are validated
    fixed = t._replace(stores=[torch.zeros(20, t.stores[0].shape[1], dtype=torch.uint8),
                               t.stores[1]])  # fmt: skip
    assert compiled.forward(fixed, IDS).shape == (3, 2, 8)


def test_the_group_follows_a_replaced_buffer():
    group = _collection().group
    group.lookup(IDS)  # keeps its view
    group.tables[1].store = torch.full((10, 8), 2.0)
    assert group.lookup(IDS)[:, 1].eq(2.0).all()
    group.load_state_dict({**group.state_dict(), "tables.1.store": torch.full((10, 8), 3.0)},
                          assign=True)  # fmt: skip
    assert group.lookup(IDS)[:, 1].eq(3.0).all()


def test_learning_rate_changes_reach_a_kept_view():
    kept, rebuilt, unchanged = _collection(), _collection(), _collection()
    for emb in (kept, rebuilt, unchanged):
        _train_step(emb)
    kept.set_learning_rate(0.5)
    rebuilt.set_learning_rate(0.5)
    rebuilt.group._kept_views = {}  # a view built after the change
    for emb in (kept, rebuilt, unchanged):
        _train_step(emb)
    stores = [[t.store.clone() for t in e.group.tables] for e in (kept, rebuilt, unchanged)]
    assert all(torch.equal(a, b) for a, b in zip(stores[0], stores[1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(stores[0], stores[2], strict=True))


def test_a_trained_collection_deep_copies_and_pickles():
    emb = _collection()
    _train_step(emb)
    for twin in (copy.deepcopy(emb), pickle.loads(pickle.dumps(emb))):
        assert torch.equal(twin.group.lookup(IDS), emb.group.lookup(IDS))
        _train_step(twin)  # and trains on its own tensors
    assert not torch.equal(twin.group.lookup(IDS), emb.group.lookup(IDS))


@pytest.mark.skipif(sys.platform != "linux", reason="huge pages are asked for on Linux only")
def test_large_buffers_ask_for_huge_pages_over_whole_pages(monkeypatch):
    calls = []
    monkeypatch.setattr(huge_pages, "_madvise", lambda: lambda *a: calls.append(a) or 0)
    t = huge_pages.zeros((5 << 20,), torch.uint8)
    assert t.shape == (5 << 20,) and t.dtype == torch.uint8 and int(t.sum()) == 0
    ((addr, length, advice),) = calls
    # the buffer starts on a huge page of its own mapping; the advice covers all of it
    assert addr == t.data_ptr() and addr % huge_pages.HUGE_PAGE_BYTES == 0 and advice == 14
    assert length == 6 << 20  # 5 MiB rounded up to whole huge pages
    calls.clear()
    f = huge_pages.empty((3, 1 << 20), torch.float32)  # 12 MiB of floats
    assert f.shape == (3, 1 << 20) and f.data_ptr() == calls[0][0] and calls[0][1] == 12 << 20
    calls.clear()
    assert huge_pages.empty((1000,)).shape == (1000,) and not calls  # under one huge page
    monkeypatch.setenv("SSL_REC_HUGE_PAGES", "0")
    huge_pages.empty((5 << 20,), torch.uint8)
    assert not calls and int(huge_pages.zeros((5 << 20,), torch.uint8).sum()) == 0


@pytest.mark.skipif(sys.platform != "linux", reason="huge pages are asked for on Linux only")
def test_a_mapped_buffer_outlives_its_mapping_object_and_saves_like_any_tensor(tmp_path):
    """The tensor alone keeps its mapping alive; a saved copy loads as a plain tensor."""
    t = huge_pages.empty((1 << 20,), torch.float32)
    gc.collect()  # nothing but the tensor refers to the mapping now
    t.copy_(torch.arange(1 << 20, dtype=torch.float32))
    assert float(t[-1]) == (1 << 20) - 1 and t.is_contiguous()
    torch.save({"t": t}, tmp_path / "t.pt")
    loaded = torch.load(tmp_path / "t.pt")["t"]
    assert torch.equal(loaded, t) and loaded.untyped_storage().nbytes() == 4 << 20
