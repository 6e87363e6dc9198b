"""Regularization knobs of the dense part: dropout in encoders and heads, the wide term."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from ssl_rec.cli import main
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.ctr_checkpoint import load_ctr
from ssl_rec.models import MLP, CTRHead, DCNv2Encoder, DeepFMEncoder, DLRMEncoder, WideTerm
from ssl_rec.models.wide import wide_table_spec
from ssl_rec.quantize import ModelBuilder, Unit, load_quantized, save_quantized
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch

ENCODERS = [
    (DLRMEncoder, {"bottom": [8], "top": [16, 8]}),
    (DCNv2Encoder, {"cross_layers": 1, "deep": [16, 8]}),
    (DeepFMEncoder, {"deep": [16, 8]}),
]


@pytest.mark.parametrize(("cls", "kwargs"), ENCODERS)
def test_encoder_dropout_acts_in_training_only(cls, kwargs):
    torch.manual_seed(0)
    plain = cls(4, 3, 8, **kwargs)
    dropped = cls(4, 3, 8, dropout=0.5, **kwargs)
    dropped.load_state_dict(plain.state_dict())  # same keys whatever the dropout
    field_emb, dense = torch.randn(32, 4, 8), torch.randn(32, 3)
    plain.eval()
    dropped.eval()
    torch.testing.assert_close(dropped(field_emb, dense)[0], plain(field_emb, dense)[0])
    dropped.train()
    plain.train()
    assert not torch.allclose(dropped(field_emb, dense)[0], plain(field_emb, dense)[0])


def test_head_dropout_acts_in_training_only():
    torch.manual_seed(0)
    plain, dropped = CTRHead(8, [16]), CTRHead(8, [16], dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    x = torch.randn(64, 8)
    torch.testing.assert_close(dropped.eval()(x), plain.eval()(x))
    assert not torch.allclose(dropped.train()(x), plain.train()(x))


def test_dropout_zero_builds_the_former_modules():
    """Default 0: plain ReLU layers, Linear layers at the state-dict keys they always had."""
    mlp = MLP(4, [8, 6, 2], activate_last=True)
    assert [type(m) for m in mlp] == [nn.Linear, nn.ReLU] * 3
    assert list(mlp.state_dict()) == [f"{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")]


def test_dropout_keeps_linear_keys():
    assert list(MLP(4, [8, 6, 2], dropout=0.3).state_dict()) == list(MLP(4, [8, 6, 2]).state_dict())


def test_state_of_the_former_dropout_layout_still_loads():
    """Before, dropout took a slot of its own: Linear layers at 0, 3, 6."""
    torch.manual_seed(1)
    old = nn.Sequential(
        nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(8, 6), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(6, 2),
    )  # fmt: skip
    for dropout in (0.0, 0.2):
        mlp = MLP(4, [8, 6, 2], dropout=dropout)
        mlp.load_state_dict(old.state_dict())  # strict: every key found and used
        x = torch.randn(5, 4)
        torch.testing.assert_close(mlp.eval()(x), old.eval()(x))
    head = CTRHead(4, [8, 6])  # nested under a prefix: head.mlp.*
    head.load_state_dict({f"mlp.{k}": v for k, v in old.state_dict().items()} | {
        "mlp.6.weight": torch.randn(1, 6), "mlp.6.bias": torch.zeros(1)})  # fmt: skip
    assert torch.equal(head.mlp[2].weight, old[3].weight)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_dropout_out_of_range_raises(bad):
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        DLRMEncoder(3, 2, 4, dropout=bad)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\)"):
        CTRHead(4, [3], dropout=bad)


# --- the wide (linear) term ---------------------------------------------------------------


def _separable(n: int = 512, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two fields; the label is 1 exactly when field 0's id is even (plus a dense nudge)."""
    gen = torch.Generator().manual_seed(seed)
    sparse = torch.stack([torch.randint(0, 20, (n,), generator=gen),
                          torch.randint(0, 7, (n,), generator=gen)], 1)  # fmt: skip
    dense = torch.randn(n, 1, generator=gen)
    return sparse, dense, (sparse[:, 0] % 2 == 0).float()


@pytest.mark.parametrize(
    "spec", [TableSpec("fp32"), TableSpec("int8", 0.1, optimizer="sgd", learning_rate=5.0)]
)
def test_wide_term_learns_a_linearly_separable_table(spec):
    sparse, dense, label = _separable()
    wide = WideTerm(["a", "b"], [20, 7], 1, spec).train()
    assert torch.equal(wide(sparse, dense), torch.zeros(len(label)))  # starts at zero
    bias = nn.Parameter(torch.zeros(()))
    opt = torch.optim.Adam([bias, *wide.parameters()], lr=0.05)
    for step in range(40):
        rows = slice(step % 4 * 128, step % 4 * 128 + 128)
        logit = wide(sparse[rows], dense[rows]) + bias
        loss = nn.functional.binary_cross_entropy_with_logits(logit, label[rows])
        opt.zero_grad()
        loss.backward()  # the id scalars step in here (fused optimizer)
        opt.step()
    wide.eval()
    with torch.no_grad():
        predicted = (wide(sparse, dense) + bias > 0).float()
    assert torch.equal(predicted, label)
    assert wide.ids.specs[0].precision.value == ("fp32" if spec.precision.value == "int8" else
                                                  spec.precision.value)  # fmt: skip


def test_wide_table_spec_keeps_the_optimizer_and_stores_scalars_exactly():
    spec = TableSpec("int4", 0.2, optimizer="sgd", learning_rate=0.3, weight_decay=0.01)
    wide = wide_table_spec(spec)
    assert (wide.precision.value, wide.cache_fraction) == ("fp32", 0.0)
    assert (wide.optimizer, wide.learning_rate, wide.weight_decay) == ("sgd", 0.3, 0.01)
    assert wide_table_spec(TableSpec("bf16")).precision.value == "bf16"


def _module(wide: bool) -> CTRModule:
    schema = FeatureSchema(["price"], [CategoricalField("user", 12), CategoricalField("item", 9)],
                           "label")  # fmt: skip
    encoder = {"class_path": "ssl_rec.models.DLRMEncoder",
               "init_args": {"bottom": [8], "top": [8]}}  # fmt: skip
    backbone = {"class_path": "ssl_rec.models.Backbone",
                "init_args": {"embedding_dim": 4, "encoder": encoder}}  # fmt: skip
    return CTRModule(backbone, schema.to_dict(), wide=wide)


def test_ctr_module_wide_round_trips_through_its_checkpoint(tmp_path):
    module = _module(wide=True)
    assert module.hparams["wide"] is True and isinstance(module.wide, WideTerm)
    assert _module(wide=False).wide is None and _module(wide=False).hparams["wide"] is False
    batch = Batch(dense=torch.randn(6, 1), sparse=torch.tensor([[1, 2]] * 3 + [[3, 4]] * 3),
                  label=torch.tensor([1.0, 0, 1, 0, 0, 0]))  # fmt: skip
    module.train()
    nn.functional.binary_cross_entropy_with_logits(module(batch), batch.label).backward()
    module.wide.dense.weight.data.fill_(0.25)  # as a dense step would
    assert module.wide.ids.dequantize_rows(0, torch.tensor([1])).abs().sum() > 0
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    path = tmp_path / "wide.ckpt"
    trainer.save_checkpoint(path)
    loaded = CTRModule.load_from_checkpoint(path)
    assert loaded.hparams["wide"] is True
    module.eval()
    loaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch), module(batch))


def test_wide_term_survives_quantization_and_the_quantized_directory(tmp_path):
    """load_ctr -> INT8 tables -> save / load: the served logits keep the wide term (FP32)."""
    module = _module(wide=True)
    module.wide.ids.load_float(0, torch.linspace(-1, 1, 12).reshape(12, 1))
    module.wide.dense.weight.data.fill_(0.5)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(module)
    trainer.save_checkpoint(tmp_path / "wide.ckpt")
    module, source = load_ctr(tmp_path / "wide.ckpt")
    assert source.architecture.wide and source.architecture.to_dict()["wide"] is True
    plan = source.fp32_plan()
    for name in source.schema.field_names:
        plan = plan.with_precision(Unit("table", name), "int8")
    served = ModelBuilder(source).build(plan)
    save_quantized(served, tmp_path / "q", {})
    loaded = load_quantized(tmp_path / "q")
    dense, sparse = torch.randn(5, 1), torch.tensor([[0, 1], [3, 2], [11, 8], [5, 5], [7, 0]])
    batch = Batch(dense=dense, sparse=sparse)
    with torch.no_grad():
        expected = module.eval()(batch)
        deep = module.head(module.backbone(batch).pooled)
        for model in (served, loaded):
            torch.testing.assert_close(model(dense, sparse), expected, atol=0.02, rtol=0)
        # the wide part alone is served exactly
        wide = loaded(dense, sparse) - loaded.dense(loaded.tables(sparse), dense)
        torch.testing.assert_close(wide, expected - deep, atol=1e-5, rtol=0)
    assert not torch.allclose(expected, deep, atol=0.1)  # the wide term weighs in the logit


@pytest.mark.slow
def test_wide_checkpoint_quantizes_and_predicts(tmp_path):
    """fit --model.init_args.wide=true, then quantize and predict from the checkpoint and
    from the quantized directory: the wide term serves in FP32 beside quantized tables."""
    root = tmp_path / "run"
    data = ["--data.n_train", "1000", "--data.n_val", "500", "--data.n_test", "500",
            "--data.batch_size", "256",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    main(["fit", "--config", "configs/ctr/synthetic.yaml", "--model.init_args.wide=true",
          "--trainer.default_root_dir", str(root), "--trainer.logger", "false",
          "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "3",
          "--trainer.limit_val_batches", "1", *data])  # fmt: skip
    ckpt = root / "checkpoints" / "last.ckpt"
    module, source = load_ctr(ckpt)
    assert module.wide is not None and source.wide is not None and source.architecture.wide
    out = tmp_path / "q"
    main(["quantize", "--ckpt_path", str(ckpt), "--out", str(out), "--budget_ne", "0.01",
          "--calibration_rows", "500", "--evaluation_rows", "500"])  # fmt: skip
    served = load_quantized(out)
    assert served.wide is not None
    torch.testing.assert_close(served.wide.scalars, source.wide.scalars)
    from_ckpt, from_dir = tmp_path / "ckpt.parquet", tmp_path / "dir.parquet"
    main(["predict", "--ckpt_path", str(ckpt), "--out", str(from_ckpt)])
    main(["predict", "--ckpt_path", str(out), "--out", str(from_dir)])
    fp32 = torch.tensor(pq.read_table(from_ckpt).column("probability").to_numpy())
    quantized = torch.tensor(pq.read_table(from_dir).column("probability").to_numpy())
    assert len(fp32) == len(quantized) == 500 and (fp32 - quantized).abs().max() < 0.05
    # the wide term is part of what the quantized model serves
    sparse, dense = torch.zeros(2, served.schema.n_fields, dtype=torch.int64), torch.zeros(2, 13)
    with torch.no_grad():
        with_wide = served(dense, sparse)
        served.wide.scalars.add_(1.0)
        assert torch.allclose(served(dense, sparse), with_wide + served.schema.n_fields)
