"""L2 weight decay inside the fused sparse optimizers: every precision, compiled == reference."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec
from ssl_rec.hardware.kernels import reference
from ssl_rec.hardware.kernels.dispatch import CompiledKernels, load_compiled

CARDS = [50, 30, 200, 7, 64, 40, 90, 3, 60]
WD = 0.3  # large, so that a wrong decay term shows in every format's rounding


def _specs(store_dir: str) -> list[TableSpec]:
    return [
        TableSpec("int8", 0.2, admission_count=1, weight_decay=WD),
        TableSpec("int4", 0.3, "lfu", weight_decay=WD),
        TableSpec("int2", 0.1, optimizer="sgd", weight_decay=WD),
        TableSpec("fp16", 0.5, weight_decay=WD),
        TableSpec("bf16", 0.2, "lfu", stochastic_rounding=False, weight_decay=WD),
        TableSpec("fp32", optimizer="sgd", weight_decay=WD),
        TableSpec("int8", 0.0, optimizer="sgd", weight_decay=WD),
        TableSpec("int4", 0.0, weight_decay=WD),
        TableSpec("int8", 0.1, store_dir=store_dir, weight_decay=WD),  # memory-mapped store
    ]


def _state(t) -> list[torch.Tensor]:
    return t.stores + t.cache_rows + t.cache_tags + t.cache_state + t.stats + t.momentum


def test_compiled_matches_reference_with_weight_decay(tmp_path, threads, simd):
    dim = 36  # whole vectors and a tail in every SIMD variant
    compiled = CompiledKernels(load_compiled())
    emb = MixedPrecisionEmbeddingCollection(CARDS, dim, _specs(str(tmp_path)), seed=3)
    a, b = copy.deepcopy(emb.group), copy.deepcopy(emb.group)
    plain = copy.deepcopy(emb.group)
    plain._hparams[:, 2] = 0.0  # the same tables without decay
    gen = torch.Generator().manual_seed(dim)
    for step in range(4):
        ids = torch.stack([torch.randint(0, c, (40,), generator=gen) for c in CARDS], 1)
        grad = torch.randn(40, len(CARDS), dim, generator=gen)
        grad[::3, 2] = 0  # zero-gradient rows are skipped, decay included
        ta, tb, tp = a.tensors(), b.tensors(), plain.tensors()
        plan_a = reference.admit(ta, ids, 3, 2 * step)
        plan_b = compiled.admit(tb, ids, 3, 2 * step)
        plan_p = compiled.admit(tp, ids, 3, 2 * step)
        reference.update(ta, plan_a, grad, 3, 2 * step + 1)
        compiled.update(tb, plan_b, grad, 3, 2 * step + 1)
        compiled.update(tp, plan_p, grad, 3, 2 * step + 1)
        for x, y in zip(_state(ta), _state(tb), strict=True):
            assert torch.equal(x, y)
    # decay changed every table (the test is not passing on a decay that does nothing)
    for f in range(len(CARDS)):
        ids = torch.arange(CARDS[f]).reshape(-1, 1)
        assert not torch.equal(a.dequantize_rows(f, ids), plain.dequantize_rows(f, ids)), f


def _train_step(spec: TableSpec, ids: torch.Tensor, grad: torch.Tensor):
    emb = MixedPrecisionEmbeddingCollection([20], 16, spec, seed=1).train()
    before = emb.dequantize_rows(0, torch.arange(20))
    emb(ids).backward(grad)
    return before, emb.dequantize_rows(0, torch.arange(20))


def test_sgd_decay_follows_the_formula_and_leaves_untouched_rows_alone():
    lr, wd = 0.1, 0.5
    ids = torch.tensor([[3], [7], [3]])
    grad = torch.randn(3, 1, 16, generator=torch.Generator().manual_seed(0))
    spec = TableSpec("fp32", optimizer="sgd", learning_rate=lr, weight_decay=wd)
    before, after = _train_step(spec, ids, grad)
    g3, g7 = grad[0, 0] + grad[2, 0], grad[1, 0]
    lr32, wd32 = torch.tensor(lr), torch.tensor(wd)
    assert torch.equal(after[3], before[3] - lr32 * (g3 + wd32 * before[3]))
    assert torch.equal(after[7], before[7] - lr32 * (g7 + wd32 * before[7]))
    untouched = [r for r in range(20) if r not in (3, 7)]
    assert torch.equal(after[untouched], before[untouched])


def test_decay_alone_shrinks_a_row_toward_zero():
    """With a gradient much smaller than wd * w the step is almost pure decay: |w| shrinks
    by the factor (1 - lr * wd) for SGD."""
    lr, wd = 0.1, 0.5
    ids = torch.tensor([[5]])
    grad = torch.full((1, 1, 16), 1e-30)
    spec = TableSpec("fp32", optimizer="sgd", learning_rate=lr, weight_decay=wd)
    before, after = _train_step(spec, ids, grad)
    torch.testing.assert_close(after[5], before[5] * (1 - lr * wd), rtol=1e-6, atol=1e-12)
    assert after[5].norm() < before[5].norm()


def test_rowwise_adagrad_decays_the_gradient_it_accumulates():
    lr, wd, eps = 0.05, 0.2, 1e-8
    ids = torch.tensor([[4]])
    grad = torch.randn(1, 1, 16, generator=torch.Generator().manual_seed(1))
    spec = TableSpec("fp32", learning_rate=lr, weight_decay=wd, eps=eps)
    before, after = _train_step(spec, ids, grad)
    g = grad[0, 0] + wd * before[4]
    expected = before[4] - lr / (g.square().mean().sqrt() + eps) * g
    torch.testing.assert_close(after[4], expected, rtol=1e-6, atol=1e-7)


def test_weight_decay_zero_changes_nothing():
    """The default spec is the plain optimizer: the same rows as without the field."""
    ids = torch.tensor([[1], [2], [1]])
    grad = torch.randn(3, 1, 16, generator=torch.Generator().manual_seed(2))
    _, plain = _train_step(TableSpec("int8", 0.1), ids, grad)
    _, zero = _train_step(TableSpec("int8", 0.1, weight_decay=0.0), ids, grad)
    _, decayed = _train_step(TableSpec("int8", 0.1, weight_decay=0.5), ids, grad)
    assert torch.equal(plain, zero) and not torch.equal(plain, decayed)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_weight_decay_must_be_finite_and_nonnegative(bad):
    with pytest.raises(ValueError, match="weight_decay must be >= 0"):
        TableSpec(weight_decay=bad)


def test_weight_decay_round_trips_through_to_dict():
    spec = TableSpec("int4", 0.1, weight_decay=1e-4)
    assert spec.to_dict()["weight_decay"] == 1e-4 and TableSpec(**spec.to_dict()) == spec


def _fit(tmp_path: Path, *extra: str) -> list[str]:
    return ["fit", "--config", "configs/ctr/synthetic.yaml", "--data.init_args.n_train=300",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}", "--trainer.fast_dev_run=1",
            "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path / 'run'}",
            *extra]  # fmt: skip


def test_weight_decay_flag_reaches_the_tables(tmp_path):
    from ssl_rec.cli import run  # here: the kernel tests above need nothing above hardware

    cli = run(_fit(tmp_path, "--model.init_args.backbone.init_args.tables.weight_decay=0.01"))
    specs = cli.model.backbone.table_specs
    assert specs and all(s.weight_decay == 0.01 for s in specs)
    hp = cli.model.backbone.embedding.tables.group.tensors().hparams  # what the kernels read
    assert torch.equal(hp[:, 2], torch.full((len(specs),), 0.01))
    hparams = cli.model.hparams["backbone"]["init_args"]["tables"]
    assert hparams["weight_decay"] == 0.01


def test_negative_weight_decay_flag_is_one_line_exit_2(tmp_path, capsys):
    from ssl_rec.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(_fit(tmp_path, "--model.init_args.backbone.init_args.tables.weight_decay=-1"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "ssl-rec: error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "weight_decay" in lines[0] and ">= 0" in lines[0]
