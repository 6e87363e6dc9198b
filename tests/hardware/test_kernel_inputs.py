"""Every kernel entry refuses bad input with a clear error, in both kernel sets (no crash)."""

import pytest
import torch

from ssl_rec.hardware import (
    MixedPrecisionEmbeddingCollection,
    TableSpec,
    quantize_rows,
    quantized_bag_lookup,
)
from ssl_rec.hardware.kernels import reference
from ssl_rec.hardware.kernels.dispatch import CompiledKernels, load_compiled
from ssl_rec.hardware.kernels.table_meta import META_ADMISSION, AdmittedBatch


@pytest.fixture(params=["reference", "compiled"])
def kernels(request):
    return reference if request.param == "reference" else CompiledKernels(load_compiled())


def _store(bits=8, rows=10, dim=8):
    return quantize_rows(torch.randn(rows, dim), f"int{bits}")


BAG_CASES = [
    # (store, bits, indices, offsets, dim), error, message
    ((_store(), 8, torch.tensor([1, 2]), torch.tensor([0, 100000]), 8), ValueError, "offsets"),
    (
        (_store(), 8, torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1, 3]), 8),
        ValueError,
        "non-decreasing",
    ),  # fmt: skip
    ((_store(), 8, torch.tensor([1, 2]), torch.tensor([1, 2]), 8), ValueError, r"offsets\[0\]"),
    (
        (_store(), 8, torch.tensor([1, 2]), torch.tensor([], dtype=torch.long), 8),
        ValueError,
        "boundaries",
    ),  # fmt: skip
    ((_store(), 8, torch.tensor([1, 10]), torch.tensor([0, 2]), 8), IndexError, "out of range"),
    ((_store(), 8, torch.tensor([-1, 2]), torch.tensor([0, 2]), 8), IndexError, "out of range"),
    ((_store(), 8, torch.tensor([1, 2**63 - 1]), torch.tensor([0, 2]), 8), IndexError, "range"),
    ((_store(), 8, torch.tensor([-(2**63), 2]), torch.tensor([0, 2]), 8), IndexError, "range"),
    (  # steps that would wrap around 2^64 back to the last offset
        (_store(), 8, torch.tensor([1, 2]), torch.tensor([0, 2**63 - 1, -2, 2]), 8),
        ValueError,
        "non-decreasing",
    ),  # fmt: skip
    (
        (_store(), 8, torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0, 2]), 8),
        TypeError,
        "indices",
    ),  # fmt: skip
    ((torch.zeros(10, 16), 8, torch.tensor([1]), torch.tensor([0, 1]), 8), TypeError, "store"),
    ((_store(), 3, torch.tensor([1]), torch.tensor([0, 1]), 8), ValueError, "bits"),
    ((_store(), 8, torch.tensor([1]), torch.tensor([0, 1]), 16), ValueError, "dim"),
    ((_store(4), 4, torch.tensor([1]), torch.tensor([0, 1]), 10), ValueError, "dim"),
    ((_store(), 8, torch.arange(8)[::2], torch.tensor([0, 4]), 8), ValueError, "contiguous"),
]


@pytest.mark.parametrize("args,error,message", BAG_CASES)
def test_bag_lookup_refuses_bad_input(kernels, args, error, message):
    with pytest.raises(error, match=message):
        kernels.bag_lookup(*args)


def test_quantized_bag_lookup_no_longer_crashes_on_offsets_past_the_ids():
    store = _store()
    with pytest.raises(ValueError, match="offsets"):
        quantized_bag_lookup(store, 8, torch.tensor([1, 2]), torch.tensor([0, 100000]))
    with pytest.raises(ValueError, match="non-decreasing"):
        quantized_bag_lookup(store, 8, torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1, 3]))
    out = quantized_bag_lookup(store, 8, torch.tensor([1, 2, 3]), torch.tensor([0, 2, 2, 3]))
    assert out.shape == (3, 8) and torch.equal(out[1], torch.zeros(8))


def _group():
    specs = [TableSpec("int8", 0.5), TableSpec("fp32", optimizer="sgd")]
    return MixedPrecisionEmbeddingCollection([20, 10], 8, specs, seed=0).group


def _ids():
    return torch.tensor([[1, 2], [3, 4], [1, 9]])


def test_table_kernels_refuse_bad_ids(kernels):
    t = _group().tensors()
    with pytest.raises(IndexError, match=r"table 1: id 10 out of range \[0, 10\) at sample 2"):
        kernels.admit(t, torch.tensor([[1, 2], [3, 4], [1, 10]]), 0, 0)
    with pytest.raises(IndexError, match="table 0: id -1"):
        kernels.forward(t, torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError, match="ids"):
        kernels.admit(t, _ids().int(), 0, 0)
    with pytest.raises(ValueError, match="ids"):
        kernels.forward(t, torch.zeros(3, 3, dtype=torch.long))


def _plan_with(plan, **changes):
    fields = plan._asdict()
    fields.update(changes)
    return AdmittedBatch(**fields)


def test_table_kernels_refuse_bad_plans_and_gradients(kernels):
    t = _group().tensors()
    plan = kernels.admit(t, _ids(), 0, 0)
    grad = torch.zeros(3, 2, 8)
    bad_inverse = plan.inverse.clone()
    bad_inverse[0, 0] = 99
    with pytest.raises(IndexError, match="unique row"):
        kernels.gather(t, _plan_with(plan, inverse=bad_inverse))
    bad_slots = plan.slots.clone()
    bad_slots[0, 0] = 10**6
    with pytest.raises(IndexError, match="slot"):
        kernels.update(t, _plan_with(plan, slots=bad_slots), grad, 0, 1)
    bad_rows = plan.rows.clone()
    bad_rows[1, 0] = 10
    with pytest.raises(IndexError, match="row"):
        kernels.gather(t, _plan_with(plan, rows=bad_rows))
    with pytest.raises(ValueError, match="unique rows"):
        kernels.gather(t, _plan_with(plan, num_unique=torch.tensor([4, 99])))
    with pytest.raises(ValueError, match="grad"):
        kernels.update(t, plan, torch.zeros(3, 2, 4), 0, 1)
    with pytest.raises(TypeError, match="grad"):
        kernels.update(t, plan, grad.double(), 0, 1)
    with pytest.raises(ValueError, match="lock plan"):
        kernels.admit(t, _ids(), 0, 1, [_plan_with(plan, rows=plan.rows[:, :2].contiguous())])


def test_table_kernels_refuse_inconsistent_tables(kernels):
    t = _group().tensors()
    meta = t.meta.clone()
    meta[0, 0] = 99
    with pytest.raises(ValueError, match="unknown format"):
        kernels.forward(t._replace(meta=meta), _ids())
    for count in (0, -3, 1 << 31):
        meta = t.meta.clone()
        meta[1, META_ADMISSION] = count
        with pytest.raises(ValueError, match="table 1: admission count"):
            kernels.admit(t._replace(meta=meta), _ids(), 0, 0)
    with pytest.raises(ValueError, match="store"):
        kernels.forward(t._replace(stores=[t.stores[0][:5], t.stores[1]]), _ids())
    with pytest.raises(ValueError, match="momentum"):
        kernels.admit(t._replace(momentum=[torch.zeros(3), t.momentum[1]]), _ids(), 0, 0)
    with pytest.raises(ValueError, match="table list"):
        kernels.forward(t._replace(stats=t.stats[:1]), _ids())
    with pytest.raises(TypeError, match="cache tags"):
        kernels.forward(t._replace(cache_tags=[x.int() for x in t.cache_tags]), _ids())


def test_corrupt_cache_tags_raise_instead_of_writing_out_of_bounds(kernels):
    t = _group().tensors()
    t.cache_tags[0].fill_(30000)  # names rows far beyond the table's 20
    with pytest.raises(ValueError, match="corrupt cache state"):
        kernels.admit(t, _ids(), 0, 0)
