"""Admissions run ahead on a helper thread give bit-identical results to running them inline."""

import copy

import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec

CARDS = [400, 50, 3000, 9]
SPECS = [
    TableSpec("int8", 0.05),
    TableSpec("int4", 0.2, "lfu", optimizer="sgd"),
    TableSpec("int8", 0.02),
    TableSpec("fp32"),
]


def _batches(n, size=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.stack([torch.randint(0, c, (size,), generator=gen) for c in CARDS], 1)
        for _ in range(n)
    ]


def _dense_work(x):
    # stands for the dense layers that run while the next batch is admitted
    return torch.tanh(x @ torch.ones(x.shape[-1], 32)).sum()


def _train(emb, batches, background):
    for i, ids in enumerate(batches):
        emb.prefetch_next(batches[i + 1] if i + 1 < len(batches) else None, background)
        loss = _dense_work(emb(ids))
        loss.backward()
    return emb


def _assert_same(a, b):
    for (key, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, key


def test_background_prefetch_equals_inline_prefetch(threads):
    emb = MixedPrecisionEmbeddingCollection(CARDS, 16, SPECS, seed=1).train()
    batches = _batches(8)
    inline = _train(copy.deepcopy(emb), batches, background=False)
    overlapped = _train(copy.deepcopy(emb), batches, background=True)
    _assert_same(inline, overlapped)
    stats = overlapped.cache_stats()
    assert stats["prefetch_used"] == 7 and stats["prefetch_discarded"] == 0
    assert stats["evictions"] > 0


def test_prefetch_for_other_ids_is_discarded_and_forward_admits():
    emb = MixedPrecisionEmbeddingCollection(CARDS, 16, SPECS, seed=1).train()
    a, b = _batches(2)
    emb.prefetch_next(a)
    emb(b).sum().backward()  # admits b, then prefetches a in the background
    emb(b).sum().backward()  # a prefetched plan for other ids is dropped
    stats = emb.cache_stats()
    assert stats["prefetch_discarded"] == 1 and stats["prefetch_used"] == 0


def test_state_dict_waits_for_the_admission_in_flight():
    emb = MixedPrecisionEmbeddingCollection(CARDS, 16, SPECS, seed=1).train()
    a, b = _batches(2)
    emb.prefetch_next(b)
    out = emb(a)
    state = emb.state_dict()  # waits: a consistent snapshot
    out.sum().backward()
    clone = MixedPrecisionEmbeddingCollection(CARDS, 16, SPECS, seed=1)
    clone.load_state_dict(state)
    assert int(torch.stack([t.cache.stats for t in clone.group.tables])[:, 1].sum()) > 0


def test_background_admission_errors_surface_at_the_next_use():
    emb = MixedPrecisionEmbeddingCollection(CARDS, 16, SPECS, seed=1).train()
    a, b = _batches(2)
    emb.prefetch_next(b)
    out = emb(a)
    emb.group.wait()
    emb.group.tables[0].cache.tags.fill_(30000)  # corrupt: names rows beyond the table
    emb.prefetch_next(a)
    out.sum().backward()
    with pytest.raises(ValueError, match="corrupt cache state"):
        emb(b).sum().backward()  # uses the prefetched plan, then prefetches into bad tags
        emb.group.wait()
