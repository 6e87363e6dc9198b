"""Fine-tuning a pretrained backbone: what transfers, per-part learning rates, LP-FT freezing."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint

from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.lightning.resumable_early_stopping import ResumableEarlyStopping
from ssl_rec.lightning.transfer_schedule import regroup_optimizer_state
from ssl_rec.models import Backbone, DLRMEncoder
from ssl_rec.objectives import FeatureAlignment
from ssl_rec.schema import CategoricalField, FeatureSchema

ROOT = Path(__file__).resolve().parents[2]
CARDS = (6, 30, 50)
IDS = torch.arange(1, 6)


def schema() -> dict:
    fields = tuple(CategoricalField(f"C{i + 1}", c) for i, c in enumerate(CARDS))
    return FeatureSchema(("I1", "I2"), fields, "label").to_dict()


def factory(seed: int = 0, top: tuple[int, ...] = (16,)) -> partial:
    encoder = partial(DLRMEncoder, bottom=(8,), top=top)
    return partial(Backbone, embedding_dim=8, tables=TableSpec("fp32"), encoder=encoder, seed=seed)


def pretrained(tmp_path: Path, top: tuple[int, ...] = (16,)) -> tuple[Backbone, str]:
    """A backbone unlike a fresh one (other table seed, perturbed dense parameters), saved."""
    torch.manual_seed(123)
    source = factory(seed=7, top=top)(schema())
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    path = tmp_path / "pre.ckpt"
    torch.save({"state_dict": {f"backbone.{k}": v for k, v in source.state_dict().items()}}, path)
    return source, str(path)


def build(**kwargs) -> CTRModule:
    torch.manual_seed(0)  # the same fresh encoder and head in every module built here
    return CTRModule(factory(), schema(), **kwargs)


def rows(backbone: Backbone) -> torch.Tensor:
    return torch.stack([backbone.entity_vectors(f"C{i + 1}", IDS) for i in range(len(CARDS))])


def test_transfer_backbone_loads_everything_and_tables_only_the_embeddings(tmp_path) -> None:
    source, path = pretrained(tmp_path)
    fresh = build().backbone
    whole, tables = (
        build(init_from=path).backbone,
        build(init_from=path, transfer="tables").backbone,
    )
    for loaded in (whole, tables):
        torch.testing.assert_close(rows(loaded), rows(source))
        torch.testing.assert_close(loaded.embedding.mask_token, source.embedding.mask_token)
    torch.testing.assert_close(dict(whole.encoder.state_dict()), dict(source.encoder.state_dict()))
    torch.testing.assert_close(dict(tables.encoder.state_dict()), dict(fresh.encoder.state_dict()))
    assert not torch.equal(rows(fresh), rows(source))
    # the dense statistics are still the data's to give (at setup), not the checkpoint's
    assert not tables.dense_statistics_set and whole.dense_statistics_set


def test_transfer_tables_takes_embeddings_into_another_encoder(tmp_path) -> None:
    source, path = pretrained(tmp_path, top=(32, 16))
    with pytest.raises(ValueError, match="backbone does not match"):
        build(init_from=path)
    module = build(init_from=path, transfer="tables")
    torch.testing.assert_close(rows(module.backbone), rows(source))
    assert module.hparams.transfer == "tables"


def test_encoder_lr_scale_gives_the_backbone_its_own_group() -> None:
    (single,) = build(learning_rate=0.01).configure_optimizers().param_groups
    assert single["lr"] == 0.01 and len(single["params"]) == len(list(build().parameters()))
    module = build(learning_rate=0.01, encoder_lr_scale=0.1)
    encoder, head = module.configure_optimizers().param_groups
    assert encoder["lr"] == pytest.approx(0.001) and head["lr"] == 0.01
    assert {id(p) for p in encoder["params"]} == {id(p) for p in module.backbone.parameters()}
    assert {id(p) for p in head["params"]} == {id(p) for p in module.head.parameters()}
    assert module.hparams.encoder_lr_scale == 0.1


def test_saved_optimizer_groups_are_split_to_this_runs() -> None:
    def groups(*sizes: int) -> list[dict]:
        return [{"params": [None] * n, "lr": 0.5 * (i + 1)} for i, n in enumerate(sizes)]

    state = {"state": {}, "param_groups": [{"lr": 0.1, "eps": 1e-3, "params": [0, 1, 2, 3, 4]}]}
    regroup_optimizer_state(state, groups(3, 2))
    assert [g["params"] for g in state["param_groups"]] == [[0, 1, 2], [3, 4]]
    assert [(g["lr"], g["eps"]) for g in state["param_groups"]] == [(0.5, 1e-3), (1.0, 1e-3)]
    regroup_optimizer_state(state, groups(5))
    assert [g["params"] for g in state["param_groups"]] == [[0, 1, 2, 3, 4]]
    regroup_optimizer_state(state, groups(2, 2))  # another model: left for Adam to refuse
    assert [g["params"] for g in state["param_groups"]] == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"transfer": "head"}, "transfer must be one of"),
        ({"encoder_lr_scale": 0.0}, "encoder_lr_scale must be a number > 0"),
        ({"freeze_backbone_epochs": -1}, "freeze_backbone_epochs must be an integer >= 0"),
        ({"freeze_backbone_epochs": 1.5}, "freeze_backbone_epochs must be an integer >= 0"),
        ({"freeze_backbone_epochs": 2, "finetune": "linear_probe"}, "needs finetune=full"),
        ({"freeze_backbone_epochs": 2, "objectives": {"a": FeatureAlignment()}}, "objectives"),
    ],
)
def test_bad_transfer_settings_are_refused(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        build(**kwargs)


class PhaseRecorder(pl.Callback):
    """The backbone's encoder, table rows and the head's weights at every epoch's end."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, torch.Tensor]] = []

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epochs.append(snapshot(pl_module))


def snapshot(module: CTRModule) -> dict[str, torch.Tensor]:
    return {
        "encoder": torch.cat([p.detach().flatten() for p in module.backbone.encoder.parameters()]),
        "tables": rows_of(module.backbone).clone(),
        "head": torch.cat([p.detach().flatten() for p in module.head.parameters()]),
    }


def rows_of(backbone: Backbone) -> torch.Tensor:
    names = backbone.schema.field_names
    return torch.stack([backbone.entity_vectors(n, torch.arange(1, 4)) for n in names])


@pytest.fixture
def lp_ft_fit(tmp_path: Path, fit_synthetic_ctr) -> Callable[..., CTRModule]:
    """``lp_ft_fit(callbacks, max_epochs, ckpt_path=None, **module_args)``: the fitted module."""

    def fit(callbacks: list, max_epochs: int, ckpt_path: str | None = None,
            **module_args) -> CTRModule:  # fmt: skip
        _, module = fit_synthetic_ctr(
            tmp_path, callbacks, n_train=512, n_val=128, tables=TableSpec("fp32"), hidden=8,
            ckpt_path=ckpt_path, module_args=module_args, max_epochs=max_epochs,
            enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        )  # fmt: skip
        return module

    return fit


def test_lp_ft_trains_the_head_alone_then_everything(lp_ft_fit) -> None:
    torch.manual_seed(0)
    recorder, start = PhaseRecorder(), {}

    class Start(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            start.update(snapshot(pl_module))

    lp_ft_fit([Start(), recorder], 2, freeze_backbone_epochs=1)
    frozen, unfrozen = recorder.epochs
    assert torch.equal(frozen["encoder"], start["encoder"])
    assert torch.equal(frozen["tables"], start["tables"])
    assert not torch.equal(frozen["head"], start["head"])
    assert not torch.equal(unfrozen["encoder"], frozen["encoder"])
    assert not torch.equal(unfrozen["tables"], frozen["tables"])


def test_a_run_resumed_in_its_frozen_phase_stays_frozen(tmp_path, lp_ft_fit) -> None:
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_epochs=1)
    first = lp_ft_fit([saver], 1, freeze_backbone_epochs=2)
    after_one = snapshot(first)
    recorder = PhaseRecorder()
    # another encoder_lr_scale splits the optimizer's groups: the saved state is regrouped
    resumed = lp_ft_fit(
        [recorder], 2, str(tmp_path / "ckpt" / "last.ckpt"),
        freeze_backbone_epochs=2, encoder_lr_scale=0.5,
    )  # fmt: skip
    (second,) = recorder.epochs
    assert torch.equal(second["encoder"], after_one["encoder"])
    assert torch.equal(second["tables"], after_one["tables"])
    assert not torch.equal(second["head"], after_one["head"])
    groups = resumed.trainer.optimizers[0].param_groups
    assert [g["lr"] for g in groups] == pytest.approx([5e-4, 1e-3])


def test_early_stopping_waits_for_the_end_of_the_frozen_phase(lp_ft_fit) -> None:
    # min_delta 1: no validation ever improves, so the patience of 1 runs out at the
    # second validation that counts
    stopper = ResumableEarlyStopping(monitor="val/auc", mode="max", patience=1, min_delta=1.0)
    module = lp_ft_fit([stopper], 8, freeze_backbone_epochs=3)
    assert module.trainer.current_epoch == 5  # epochs 0-2 frozen, 3 sets the best, 4 stops
    assert stopper.stopped_early


def _fit_args(csv: Path, tmp_path: Path) -> list[str]:
    return ["fit", "--config", str(ROOT / "configs/finetune/tabular.yaml"),
            f"--data.path={csv}", "--data.label=clicked", "--data.dense=[price]",
            "--data.categorical=[user,item]", f"--data.cache_dir={tmp_path / 'cache'}",
            f"--trainer.default_root_dir={tmp_path / 'run'}", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", "--trainer.max_epochs=1"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--model.encoder_lr_scale=-1"], ["encoder_lr_scale", "> 0"]),
        (["--model.freeze_backbone_epochs=2", "--model.finetune=linear_probe"],
         ["freeze_backbone_epochs", "finetune=full"]),
    ],
    ids=["negative scale", "freeze with linear probe"],
)  # fmt: skip
def test_cli_bad_transfer_settings_exit_2_in_one_line(tmp_path, write_clicks, cli_refuses, extra,
                                                      expected) -> None:  # fmt: skip
    csv = tmp_path / "clicks.csv"
    write_clicks(csv, n=300)
    cli_refuses([*_fit_args(csv, tmp_path), *extra], *expected)
