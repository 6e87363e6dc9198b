from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule, PretrainModule, load_module
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.objectives import (
    AdversarialFeatureReplacement,
    InfoNCE,
    MaskedFeaturePrediction,
    ReplacedFeatureDetection,
)
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.views import RandomFieldMask, View

CARDS = (6, 30, 500)


def schema() -> dict:
    fields = tuple(CategoricalField(f"C{i + 1}", c) for i, c in enumerate(CARDS))
    return FeatureSchema(("I1", "I2"), fields, "label").to_dict()


def factory(precision: str = "fp32") -> partial:
    encoder = partial(DLRMEncoder, bottom=(8,), top=(16,))
    return partial(Backbone, embedding_dim=8, tables=TableSpec(precision), encoder=encoder)


def batches(n_batches: int = 3, size: int = 32, labels: bool = False) -> list[Batch]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n_batches):
        sparse = torch.stack([torch.randint(0, c, (size,), generator=g) for c in CARDS], 1)
        label = torch.randint(0, 2, (size,), generator=g).float() if labels else None
        out.append(Batch(torch.randn(size, 2, generator=g), sparse, label))
    return out


def loader(data: list[Batch]) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(data, batch_size=None)


def trainer(tmp_path, **kwargs) -> pl.Trainer:
    defaults = dict(logger=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=tmp_path, accelerator="cpu")  # fmt: skip
    return pl.Trainer(**{**defaults, **kwargs})


def fit_pretrain(tmp_path, objectives, precision="fp32", **kwargs) -> tuple[PretrainModule, str]:
    module = PretrainModule(factory(precision), objectives, schema=schema(), **kwargs)
    t = trainer(tmp_path, max_epochs=1, enable_checkpointing=False)
    t.fit(module, train_dataloaders=loader(batches()))
    path = str(tmp_path / "pretrain.ckpt")
    t.save_checkpoint(path)
    return module, path


def test_fast_dev_run_adversarial_uses_manual_optimization(tmp_path) -> None:
    objective = AdversarialFeatureReplacement(View(RandomFieldMask(0.5), seed=0))
    module = PretrainModule(factory(), {"afr": objective}, schema=schema())
    assert module.automatic_optimization is False
    gen_before = [p.clone() for p in objective.generator_parameters()]
    disc_before = [p.clone() for p in objective.discriminator.parameters()]
    trainer(tmp_path, fast_dev_run=2).fit(module, train_dataloaders=loader(batches()))
    gen_after = objective.generator_parameters()
    disc_after = list(objective.discriminator.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(gen_before, gen_after, strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(disc_before, disc_after, strict=True))
    assert len(module.trainer.optimizers) == 2


class _GeneratorStepSpy(pl.Callback):
    """Snapshots every non-generator parameter right before the generator's optimizer steps."""

    def __init__(self, generator: set[int]) -> None:
        self.generator, self.checked = generator, 0
        self.before: dict[str, torch.Tensor] | None = None

    def on_before_optimizer_step(self, trainer, module, optimizer) -> None:
        if optimizer is trainer.optimizers[1]:
            self.before = {n: p.detach().clone() for n, p in module.named_parameters()
                           if id(p) not in self.generator}  # fmt: skip

    def on_train_batch_end(self, trainer, module, *args) -> None:
        if self.before is None:
            return
        after = dict(module.named_parameters())
        changed = [n for n, p in self.before.items() if not torch.equal(p, after[n])]
        assert not changed, f"the generator's step changed {changed[:3]}"
        self.before, self.checked = None, self.checked + 1


def test_generator_step_leaves_encoder_and_discriminator_untouched(tmp_path) -> None:
    objective = AdversarialFeatureReplacement(View(RandomFieldMask(0.5), seed=0))
    module = PretrainModule(factory(), {"afr": objective}, schema=schema())
    generator = {id(p) for p in objective.generator_parameters()}
    spy = _GeneratorStepSpy(generator)
    gen_before = [p.clone() for p in objective.generator_parameters()]
    trainer(tmp_path, max_epochs=1, callbacks=[spy], enable_checkpointing=False).fit(
        module, train_dataloaders=loader(batches())
    )
    assert spy.checked == 3  # one generator step per batch (generator_interval=1)
    moved = [not torch.equal(a, b) for a, b in zip(gen_before, objective.generator_parameters(),
                                                   strict=True)]  # fmt: skip
    assert any(moved)


def test_fast_dev_run_composed_objectives_logs_per_objective(tmp_path) -> None:
    objectives = {
        "mfp": MaskedFeaturePrediction(),
        "nce": InfoNCE(),
        "rfd": ReplacedFeatureDetection(),
    }
    module = PretrainModule(factory(), objectives, weights={"nce": 0.5}, schema=schema())
    assert module.automatic_optimization
    t = trainer(tmp_path, fast_dev_run=1)
    t.fit(module, train_dataloaders=loader(batches()), val_dataloaders=loader(batches(1)))
    keys = set(t.callback_metrics)
    assert {"train/loss", "train/mfp/accuracy", "train/nce/alignment", "val/rfd/loss"} <= keys


def test_checkpoint_loads_into_ctr_module(tmp_path) -> None:
    module, path = fit_pretrain(tmp_path, {"mfp": MaskedFeaturePrediction()})
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["feature_schema"]["categorical"][2]["cardinality"] == 500
    ctr = CTRModule(factory(), schema(), init_from=path)
    mine = ctr.backbone.state_dict()
    for name, value in module.backbone.state_dict().items():
        if name.endswith("momentum"):  # the tables' Adagrad state restarts at fine-tuning
            assert not mine[name].any(), name
        elif torch.is_tensor(value):
            assert torch.equal(value, mine[name]), name
    rows = torch.arange(500)
    torch.testing.assert_close(ctr.backbone.entity_vectors("C3", rows),
                               module.backbone.entity_vectors("C3", rows))  # fmt: skip


def test_finetune_modes_and_embedding_lr(tmp_path) -> None:
    _, path = fit_pretrain(tmp_path, {"mfp": MaskedFeaturePrediction()})
    probe = CTRModule(
        factory(), schema(), init_from=path, finetune="linear_probe", embedding_lr=0.01
    )
    assert {spec.learning_rate for spec in probe.backbone.table_specs} == {0.01}
    before = {k: v.clone() for k, v in probe.backbone.state_dict().items() if torch.is_tensor(v)}
    trainer(tmp_path, max_epochs=1, enable_checkpointing=False).fit(
        probe, train_dataloaders=loader(batches(labels=True))
    )
    after = probe.backbone.state_dict()
    changed = [k for k, v in before.items() if k.endswith("store") and not torch.equal(v, after[k])]
    assert not changed  # frozen backbone: tables untouched
    with pytest.raises(ValueError, match="embedding_lr"):
        CTRModule(factory(), schema(), embedding_lr=0.0)


def test_finetune_from_other_precision_goes_through_dequantized_rows(tmp_path) -> None:
    module, path = fit_pretrain(tmp_path, {"mfp": MaskedFeaturePrediction()})
    ctr = CTRModule(factory("int8"), schema(), init_from=path)
    rows = torch.arange(500)
    src, dst = module.backbone.entity_vectors("C3", rows), ctr.backbone.entity_vectors("C3", rows)
    scale = (src.max(1).values - src.min(1).values) / 255
    assert ((src - dst).abs() <= scale.unsqueeze(1) * 0.51 + 1e-6).all()
    torch.testing.assert_close(
        ctr.backbone.encoder.state_dict(), module.backbone.encoder.state_dict()
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"objectives": {}}, ValueError, "at least one objective"),
        ({"weights": {"nope": 1.0}}, ValueError, r"unknown objectives \['nope'\]"),
        ({"weights": {"mfp": -1.0}}, ValueError, r"weights\['mfp'\] must be >= 0"),
        ({"learning_rate": 0.0}, ValueError, "learning_rate must be > 0"),
        ({"objectives": {"mfp": torch.nn.Linear(2, 2)}}, TypeError, "not an ssl_rec.objectives"),
        ({"schema": None}, ValueError, "needs `schema`"),
    ],
)
def test_bad_configuration_fails_clearly(kwargs, error, match) -> None:
    args = {"objectives": {"mfp": MaskedFeaturePrediction()}, "schema": schema(), **kwargs}
    with pytest.raises(error, match=match):
        PretrainModule(factory(), **args)


def test_cli_pretrain_then_finetune_in_another_precision(tmp_path) -> None:
    from ssl_rec.cli import run

    root = Path(__file__).resolve().parents[2]
    tiny = ["--data.init_args.n_train=256", "--data.init_args.n_val=64",
            "--data.init_args.n_test=64", "--data.init_args.batch_size=64",
            f"--data.init_args.cache_dir={tmp_path / 'data'}",
            "--data.init_args.synthetic.cardinality_scale=0.0002",
            "--trainer.logger=false"]  # fmt: skip
    run(["fit", "--config", str(root / "configs/pretrain/rfd.yaml"), *tiny,
         "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
         f"--trainer.default_root_dir={tmp_path / 'pre'}"])  # fmt: skip
    ckpt = tmp_path / "pre" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    pretrained = load_module(str(ckpt))  # the CLI stored its config: objectives rebuild
    assert isinstance(pretrained.objectives["rfd"], ReplacedFeatureDetection)
    cli = run(["fit", "--config", str(root / "configs/finetune/ctr.yaml"), *tiny,
               "--trainer.fast_dev_run=1", f"--trainer.default_root_dir={tmp_path / 'ft'}",
               f"--model.init_args.init_from={ckpt}",
               "--model.init_args.backbone.init_args.tables.precision=int8"])  # fmt: skip
    source = torch.load(ckpt, weights_only=True)["state_dict"]
    mask = source["backbone.embedding.mask_token"]
    assert cli.trainer.state.finished
    torch.testing.assert_close(cli.model.backbone.embedding.mask_token.detach(), mask)


def test_python_made_checkpoint_loads_alone(tmp_path) -> None:
    objective = MaskedFeaturePrediction(view=View(RandomFieldMask(0.4), seed=3))
    module, path = fit_pretrain(tmp_path, {"mfp": objective})
    hparams = torch.load(path, weights_only=True)["hyper_parameters"]
    view = hparams["objectives"]["mfp"]["init_args"]["view"]["init_args"]
    assert view["masking"]["init_args"]["rate"] == 0.4 and view["seed"] == 3
    assert hparams["backbone"]["init_args"]["tables"]["precision"] == "fp32"
    for again in (PretrainModule.load_from_checkpoint(path), load_module(path)):
        assert again.objectives["mfp"].view.masking.rate == 0.4
        mine = again.state_dict()
        for name, value in module.state_dict().items():
            if torch.is_tensor(value):
                assert torch.equal(value, mine[name]), name


def test_init_from_checkpoint_of_another_schema_names_the_mismatch(tmp_path) -> None:
    _, ckpt = fit_pretrain(tmp_path, {"mfp": MaskedFeaturePrediction()})
    other = FeatureSchema(("I1",), (CategoricalField("C1", 50), CategoricalField("C2", 9)), "y")
    with pytest.raises(ValueError, match="dense columns|does not match this model"):
        CTRModule(factory(), other.to_dict(), init_from=ckpt)
    with pytest.raises(FileNotFoundError):
        CTRModule(factory(), schema(), init_from=str(tmp_path / "missing.ckpt"))
