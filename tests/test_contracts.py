"""Contracts every objective and every pretraining / fine-tuning YAML must honour."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch

import ssl_rec.objectives as objectives_module
from ssl_rec.cli import run as cli_run
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.objectives import Objective
from ssl_rec.schema import CategoricalField, FeatureSchema
from ssl_rec.types import Batch
from ssl_rec.views import View

ROOT = Path(__file__).resolve().parents[1]
OBJECTIVES = [
    obj
    for name in objectives_module.__all__
    if inspect.isclass(obj := getattr(objectives_module, name))
    and issubclass(obj, Objective)
    and obj is not Objective
]
# One invalid hyperparameter per objective; a new objective must add its own.
BAD_HYPERPARAMETERS = {
    "MaskedFeaturePrediction": {"num_candidates": 0},
    "MaskedDenseReconstruction": {"mask_rate": 1.5},
    "InfoNCE": {"temperature": 0.0},
    "MomentumContrast": {"temperature": -0.1},
    "ReplacedFeatureDetection": {"sample_temperature": 0.0},
    "AdversarialFeatureReplacement": {"tau": 0.0},
}
CARDS = (4, 9, 30, 200, 2000)


def tiny_backbone() -> Backbone:
    fields = tuple(CategoricalField(f"C{i + 1}", c) for i, c in enumerate(CARDS))
    schema = FeatureSchema(("I1", "I2"), fields, None)

    def encoder(f: int, n: int, d: int) -> DLRMEncoder:
        return DLRMEncoder(f, n, d, bottom=(8,), top=(32,))

    return Backbone(schema, embedding_dim=8, encoder=encoder)


def structured_batch(n: int = 96) -> Batch:
    g = torch.Generator().manual_seed(0)
    cluster = torch.randint(0, 6, (n,), generator=g)
    sparse = torch.stack([1 + (cluster * 5 + torch.randint(0, 2, (n,), generator=g)) % (c - 1)
                          for c in CARDS], 1)  # fmt: skip
    dense = torch.stack([cluster.float() / 3, (cluster % 2).float()], 1)
    return Batch(dense + 0.05 * torch.randn(n, 2, generator=g), sparse)


def restore_buffers(objective: Objective, buffers: dict) -> None:
    """Put back the objective's initial buffers (e.g. MoCo's queue of negatives).

    On a fixed batch the queue would fill with keys of the very same rows, so each step
    restores it: the fixed batch is contrasted against fixed negatives.
    """
    for name, buf in objective.named_buffers():
        if name in buffers and buffers[name].shape == buf.shape:
            buf.copy_(buffers[name])


def measured_loss(objective: Objective, backbone: Backbone, batch: Batch, buffers: dict) -> float:
    """Loss with the views' random streams and the objective's buffers reset."""
    for module in objective.modules():
        if isinstance(module, View):
            module.reseed()
    restore_buffers(objective, buffers)
    with torch.no_grad():
        return float(objective(batch, backbone).loss)


@pytest.mark.parametrize("cls", OBJECTIVES, ids=lambda c: c.__name__)
def test_objective_contract(cls: type[Objective]) -> None:
    torch.manual_seed(0)
    backbone, batch = tiny_backbone(), structured_batch()
    objective = cls()
    objective.setup(backbone)
    buffers = {n: b.clone() for n, b in objective.named_buffers()}
    out = objective(batch, backbone)
    assert torch.isfinite(out.loss) and out.loss.dim() == 0
    assert all(isinstance(k, str) and "/" not in k for k in out.logs)
    before = measured_loss(objective, backbone, batch, buffers)
    generator = {id(p) for p in objective.generator_parameters()}
    params = [p for p in [*backbone.parameters(), *objective.parameters()]
              if p.requires_grad and id(p) not in generator]  # fmt: skip
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(25):
        restore_buffers(objective, buffers)
        loss = objective(batch, backbone).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = measured_loss(objective, backbone, batch, buffers)
    assert after < before, (
        f"{cls.__name__}: loss did not fall on a fixed batch ({before} -> {after})"
    )


@pytest.mark.parametrize("cls", OBJECTIVES, ids=lambda c: c.__name__)
def test_objective_rejects_bad_hyperparameters(cls: type[Objective]) -> None:
    assert cls.__name__ in BAD_HYPERPARAMETERS, f"add a bad hyperparameter for {cls.__name__}"
    ((key, value),) = BAD_HYPERPARAMETERS[cls.__name__].items()
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{key}.*{value}"):
        cls(**{key: value})


CONFIGS = sorted([*ROOT.glob("configs/pretrain/*.yaml"), *ROOT.glob("configs/finetune/*.yaml")])


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data_cache")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_runs_two_steps(config: Path, data_cache: Path, tmp_path: Path) -> None:
    tiny = {"n_train": 512, "n_val": 128, "n_test": 128, "batch_size": 64,
            "cache_dir": str(data_cache), "synthetic.cardinality_scale": 0.0002}  # fmt: skip
    args = ["fit", "--config", str(config), "--trainer.fast_dev_run=2",
            "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}",
            *(f"--data.init_args.{k}={v}" for k, v in tiny.items())]  # fmt: skip
    cli = cli_run(args)
    assert cli.trainer.state.finished
    assert cli.model.schema.n_fields == 26
