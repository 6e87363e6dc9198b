"""Tables with column blocks: logical shape everywhere, blocks quantized and trained alone."""

import pytest
import torch
import yaml

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec, estimate_memory
from ssl_rec.hardware.quantization import dequantize_rows, quantize_rows
from ssl_rec.hardware.table import INIT_CHUNK_ROWS

CARDS = [INIT_CHUNK_ROWS + 300, 500, 40]  # the first spans two init chunks


def _batches(cards, n, batch=48, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.stack([torch.randint(0, c, (batch,), generator=gen) for c in cards], 1)
        for _ in range(n)
    ]


def _train(emb, batches):
    outs = []
    for ids in batches:
        out = emb(ids)
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        outs.append(out.detach())
    return outs


def _blocked(spec: TableSpec, blocks: list[int]) -> list[TableSpec]:
    return [TableSpec(**{**spec.to_dict(), "column_blocks": k}) for k in blocks]


@pytest.mark.parametrize("blocks", [[2, 1, 4], [2, 2, 2]])
def test_fp32_blocked_table_equals_unblocked_at_init(blocks):
    plain = MixedPrecisionEmbeddingCollection(CARDS, 16, TableSpec("fp32"), seed=5).eval()
    spec = _blocked(TableSpec("fp32"), blocks)
    blocked = MixedPrecisionEmbeddingCollection(CARDS, 16, spec, seed=5).eval()
    ids = _batches(CARDS, 1, batch=256)[0]
    ids[:4, 0] = torch.tensor([0, INIT_CHUNK_ROWS - 1, INIT_CHUNK_ROWS, CARDS[0] - 1])
    assert torch.equal(plain(ids), blocked(ids))
    for a, b in zip(plain.float_weights(), blocked.float_weights(), strict=True):
        assert torch.equal(a, b)


def test_fp32_sgd_training_is_the_same_with_blocks():
    # SGD on FP32 rows updates every value on its own: blocks change nothing, bit for bit.
    spec = TableSpec("fp32", optimizer="sgd", learning_rate=0.3)
    batches = _batches(CARDS, 6)
    plain = MixedPrecisionEmbeddingCollection(CARDS, 16, spec, seed=1).train()
    blocked = MixedPrecisionEmbeddingCollection(CARDS, 16, _blocked(spec, [4, 1, 2]), seed=1)
    for a, b in zip(_train(plain, batches), _train(blocked.train(), batches), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(plain.float_weights(), blocked.float_weights(), strict=True):
        assert torch.equal(a, b)


def test_int8_blocks_are_quantized_on_their_own():
    cards = [300]
    plain = MixedPrecisionEmbeddingCollection(cards, 16, TableSpec("fp32"), seed=2)
    spec = TableSpec("int8", 0.1, column_blocks=2)
    blocked = MixedPrecisionEmbeddingCollection(cards, 16, spec, seed=2)
    weights = plain.float_weights()[0]
    halves = weights.reshape(600, 8)
    expected = dequantize_rows(quantize_rows(halves, spec.precision), spec.precision, 8)
    assert torch.equal(blocked.float_weights()[0], expected.reshape(300, 16))
    assert blocked.group.tables[0].store.shape == (600, 8 + 8)  # 8 values + scale, bias


def test_blocked_int8_state_dict_round_trip_resumes_bit_exactly():
    spec = _blocked(TableSpec("int8", 0.05), [2, 1, 4])
    batches = _batches(CARDS, 8)
    a = MixedPrecisionEmbeddingCollection(CARDS, 16, spec, seed=4).train()
    _train(a, batches[:4])
    state = a.state_dict()
    b = MixedPrecisionEmbeddingCollection.from_state_dict(state).train()
    c = MixedPrecisionEmbeddingCollection(CARDS, 16, spec, seed=4, init_std=0.0).train()
    c.load_state_dict(state)
    for key, value in b.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, state[key]), key
    rest = [_train(m, batches[4:]) for m in (a, b, c)]
    for outs in rest[1:]:
        assert all(torch.equal(x, y) for x, y in zip(rest[0], outs, strict=True))
    plain = MixedPrecisionEmbeddingCollection(CARDS, 16, TableSpec("int8", 0.05))
    assert not plain.matches_state(state)


def _train_prefetching(emb, batches, background):
    outs = []
    for i, ids in enumerate(batches):
        emb.prefetch_next(batches[i + 1] if i + 1 < len(batches) else None, background)
        out = emb(ids)
        (out * torch.linspace(-1, 1, 16)).sum().backward()
        outs.append(out.detach())
    return outs


def test_prefetch_with_blocks_equals_inline_admission_and_eval_lookup():
    spec = _blocked(TableSpec("int8", 0.05), [2, 1, 4])
    batches = _batches(CARDS, 6)
    a = MixedPrecisionEmbeddingCollection(CARDS, 16, spec, seed=3).train()
    b = MixedPrecisionEmbeddingCollection(CARDS, 16, spec, seed=3).train()
    outs_a = _train_prefetching(a, batches, background=False)
    outs_b = _train_prefetching(b, batches, background=True)
    assert all(torch.equal(x, y) for x, y in zip(outs_a, outs_b, strict=True))
    assert b.cache_stats()["prefetch_used"] == len(batches) - 1
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert not isinstance(x, torch.Tensor) or torch.equal(x, y)
    ids = batches[0]
    rows = torch.stack([a.dequantize_rows(t, ids[:, t]) for t in range(3)], 1)
    assert torch.equal(a.eval()(ids), rows)


def test_load_float_and_memory_keep_the_logical_shape():
    spec = _blocked(TableSpec("int4", 0.1), [4, 2, 1])
    emb = MixedPrecisionEmbeddingCollection(CARDS, 16, spec, seed=0)
    weights = [torch.randn(c, 16) * 0.1 for c in CARDS]
    emb.load_weights(weights)
    assert [tuple(w.shape) for w in emb.float_weights()] == [(c, 16) for c in CARDS]
    assert emb.memory_report() == estimate_memory(CARDS, 16, spec)
    assert emb.memory_report()["total"]["fp32_bytes"] == sum(CARDS) * 16 * 4
    # 4 blocks quantized alone: 4 scale/bias pairs per row (int4 fused rows: 4 bytes each)
    assert emb.memory_report()["tables"][0]["scales_biases"] == CARDS[0] * 4 * 4


def test_spec_round_trip_and_errors():
    spec = TableSpec("int8", 0.05, column_blocks=2)
    assert TableSpec(**yaml.safe_load(yaml.safe_dump(spec.to_dict()))) == spec
    assert "column_blocks" not in TableSpec("int8").to_dict()  # saved specs as before
    assert spec.layout() != TableSpec("int8", 0.05).layout()
    with pytest.raises(ValueError, match="column_blocks must be an integer >= 1"):
        TableSpec(column_blocks=0)
    with pytest.raises(ValueError, match="table 't1': embedding_dim 16 does not divide"):
        MixedPrecisionEmbeddingCollection([10, 10], 16, [TableSpec(), TableSpec(column_blocks=3)])
    with pytest.raises(ValueError, match="blocks of width 2: .*multiple of 4 for int2"):
        MixedPrecisionEmbeddingCollection([10], 16, TableSpec("int2", column_blocks=8))
