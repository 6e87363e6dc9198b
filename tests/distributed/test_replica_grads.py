"""A replica's update from per-unique-row gradients is the kernels' update, bit for bit.

One process, no communication: the batch's samples cut into 1, 2 or 3 consecutive ranks'
parts, each part's gradient added per unique row onto the previous parts' sums
(``row_grads``, the chain ``ReplicaSync.reduce`` runs over the ranks), and the
one-sample-per-unique-row plan (``unique_row_update``) give the same stores, caches,
optimizer state and statistics as ``update`` of the batch's plan, reference and compiled
kernels, with ``-0.0`` and ``+0.0`` gradients among the samples. ``local_plan`` gathers a
rank's samples of a global plan.
"""

from __future__ import annotations

import pytest
import torch

from ssl_rec.distributed.cyclic_layout import table_pieces
from ssl_rec.distributed.replica_grads import local_plan, row_grads, unique_row_update
from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec
from ssl_rec.hardware.kernels.dispatch import get_kernels

SPECS = [
    TableSpec("int8", 0.2, "lru", "rowwise_adagrad", 0.05),
    TableSpec("int4", 0.1, "lfu", weight_decay=0.01),
    TableSpec("fp16", optimizer="sgd"),
    TableSpec("fp32", 0.5, optimizer="rowwise_adagrad"),
]
ROWS, DIM, BATCH = [40, 300, 7], 16, 96


def _collection(spec: TableSpec) -> MixedPrecisionEmbeddingCollection:
    return MixedPrecisionEmbeddingCollection(ROWS, DIM, spec, seed=3).train()


def _state(collection: MixedPrecisionEmbeddingCollection) -> list[torch.Tensor]:
    out = []
    for table in collection.group.tables:
        out += [t.contiguous().view(torch.uint8).reshape(-1) for t in table_pieces(table).values()]
        out.append(table.cache.stats.clone())
    return out


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    ids = torch.stack([(torch.rand(BATCH, generator=g) ** 3 * r).long() for r in ROWS], 1)
    grad = torch.randn(BATCH, len(ROWS), DIM, generator=g)
    grad[::5, 1] = 0  # rows some samples leave untouched
    grad[1::7, 0] = -0.0  # a sum that starts from +0.0 would turn these into +0.0
    grad[2::9, 2, ::2] = -0.0
    return ids, grad


def _chained(plan, grad: torch.Tensor, ranks: int) -> torch.Tensor:
    """The per-row sums of ``ranks`` consecutive parts of the batch, added part after part."""
    local, sums = grad.shape[0] // ranks, None
    for r in range(ranks):
        sums = row_grads(plan, grad[r * local : (r + 1) * local], r * local, sums)
    return sums


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("kernels", ["reference", "compiled"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.precision.value}-{s.cache_fraction}")
def test_chained_row_sums_update_like_the_batch(spec, kernels, ranks, monkeypatch) -> None:
    monkeypatch.setenv("SSL_REC_KERNELS", kernels)
    ops = get_kernels()
    direct, summed = _collection(spec), _collection(spec)
    for step in range(6):
        ids, grad = _batch(step)
        for collection in (direct, summed):
            t = collection.group.tensors()
            plan = ops.admit(t, ids, 3, 2 * step)
            if collection is direct:
                ops.update(t, plan, grad, 3, 2 * step + 1)
            else:
                ops.update(
                    t, *unique_row_update(plan, _chained(plan, grad, ranks)), 3, 2 * step + 1
                )
    for a, b in zip(_state(direct), _state(summed), strict=True):
        assert torch.equal(a, b)


def test_chained_row_sums_are_the_sample_order_sums() -> None:
    ids, grad = _batch(0)
    collection = _collection(SPECS[0])
    plan = get_kernels().admit(collection.group.tensors(), ids, 3, 0)
    whole = row_grads(plan, grad, 0)
    assert whole.shape == (int(plan.num_unique.sum()), DIM)
    offsets = torch.cumsum(plan.num_unique, 0) - plan.num_unique
    expected = torch.full_like(whole, float("nan"))
    for t in range(len(ROWS)):  # the kernels' sum: first sample as is, then in sample order
        for b in range(BATCH):
            u = int(offsets[t] + plan.inverse[t, b])
            first = bool(expected[u].isnan().all())
            expected[u] = grad[b, t] if first else expected[u] + grad[b, t]
    for ranks in (1, 2, 3):
        chained = _chained(plan, grad, ranks)
        assert torch.equal(chained.view(torch.int32), expected.view(torch.int32)), ranks
    # the order matters: the two halves' sums added afterwards differ in some last bits
    half = BATCH // 2
    parts = row_grads(plan, grad[:half], 0) + row_grads(plan, grad[half:], half)
    assert not torch.equal(parts, expected)


@pytest.mark.parametrize("kernels", ["reference", "compiled"])
def test_local_plan_gathers_a_ranks_samples(kernels, monkeypatch) -> None:
    monkeypatch.setenv("SSL_REC_KERNELS", kernels)
    ops = get_kernels()
    collection = _collection(SPECS[0])
    t = collection.group.tensors()
    ids, _ = _batch(1)
    plan = ops.admit(t, ids, 3, 0)
    everyone = ops.gather(t, plan)
    for start, size in ((0, 24), (24, 24), (72, 24), (90, 6)):
        mine = ops.gather(t, local_plan(plan, start, size))[:size]
        assert torch.equal(mine, everyone[start : start + size])
