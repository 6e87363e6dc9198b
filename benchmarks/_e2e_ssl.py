"""Pretraining step time of each shipped objective against the supervised step, as users run it.

Every ``configs/pretrain/*.yaml`` is fitted by the Lightning Trainer (``ssl_rec.cli.instantiate``,
as ``ssl-rec fit`` builds it) for a few steps on the synthetic data it ships with, and so is the
supervised ``configs/ctr/synthetic.yaml``: the same DLRM backbone (``configs/common/backbone/
dlrm.yaml``) and batch size. A callback times each step from ``on_train_batch_start`` to
``on_train_batch_end`` (the loader's time is outside), its backward passes (the tables' fused
update included), the views' corruptions and masks (``View.corrupt``), and forward hooks time
the table lookups, the backbone's encoder and any copy of it (a momentum encoder);
``rest_of_forward`` is what remains: heads, losses, candidate sampling, the optimizer step,
Lightning's own work. A config whose data block reads the user's table (``tabular*.yaml``)
runs on the synthetic unlabeled data block instead (same objectives and model).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from pytorch_lightning import Callback
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
SUPERVISED = "configs/ctr/synthetic.yaml"
SYNTHETIC_UNLABELED = "configs/common/data/synthetic_unlabeled.yaml"
QUIET = ["--trainer.logger=false", "--trainer.enable_checkpointing=false",
         "--trainer.callbacks=null", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0",
         "--trainer.limit_val_batches=0"]  # fmt: skip
PARTS = ("views", "tables", "encoder", "encoder_copies")
# --quick: a key encoder (encoder_copies) and a user-file config run on the synthetic data
QUICK_CONFIGS = ("moco", "tabular_contrastive")


def pretrain_configs(quick: bool = False) -> list[Path]:
    """Every shipped pretraining config, by name (``quick``: those of :data:`QUICK_CONFIGS`)."""
    paths = sorted((ROOT / "configs" / "pretrain").glob("*.yaml"))
    return [p for p in paths if p.stem in QUICK_CONFIGS] if quick else paths


class StepTimer(Callback):
    """Wall seconds of each training step, of its backward passes and of hooked modules."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []
        self._now: dict[str, float] = {}
        self._start = self._backward = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001, D102
        self._now = {"backward": 0.0, **{p: 0.0 for p in PARTS}, "encoder_calls": 0.0}
        self._start = time.perf_counter()

    def on_before_backward(self, trainer, pl_module, loss) -> None:  # noqa: ANN001, D102
        self._backward = time.perf_counter()

    def on_after_backward(self, trainer, pl_module) -> None:  # noqa: ANN001, D102
        self._now["backward"] += time.perf_counter() - self._backward

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # noqa: ANN001, D102
        self._now["total"] = time.perf_counter() - self._start
        self.steps.append(self._now)

    def hook(self, module: nn.Module, part: str) -> None:
        """Add the forward time of ``module`` to ``part`` of the running step."""
        started: list[float] = []

        def pre(*_: Any) -> None:
            started.append(time.perf_counter())

        def post(*_: Any) -> None:
            if self._now and started:
                self._now[part] += time.perf_counter() - started.pop()
                if part == "encoder":
                    self._now["encoder_calls"] += 1

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def wrap(self, owner: object, method: str, part: str) -> None:
        """Add the time of ``owner.method(...)`` calls to ``part`` of the running step."""
        inner = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if self._now:
                    self._now[part] += time.perf_counter() - start

        object.__setattr__(owner, method, timed)


def _hook_parts(timer: StepTimer, model: nn.Module) -> None:
    from ssl_rec.views import View

    backbone = model.backbone
    timer.hook(backbone.embedding, "tables")
    timer.hook(backbone.encoder, "encoder")
    for module in model.modules():
        if isinstance(module, View):  # the corruptions and masks; its backbone call is apart
            timer.wrap(module, "corrupt", "views")
        elif type(module) is type(backbone.encoder) and module is not backbone.encoder:
            timer.hook(module, "encoder_copies")


def fit_steps(config: str, steps: int, batch: int, unlabeled_data: bool) -> dict[str, float]:
    """Median milliseconds per step (and per part) of ``config`` over ``steps`` steps.

    The first third of the steps (at least one) is warm-up and not counted.
    """
    from ssl_rec.cli import instantiate

    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*LeafSpec.*")
    rows = batch * (steps + 1)
    with tempfile.TemporaryDirectory(prefix="e2e-ssl-") as tmp:
        data = ["--data", str(ROOT / SYNTHETIC_UNLABELED)] if unlabeled_data else []
        cli = instantiate(["--config", config, *data, *QUIET, f"--trainer.max_steps={steps}",
                           "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp}",
                           f"--data.init_args.batch_size={batch}",
                           f"--data.init_args.n_train={rows}", "--data.init_args.n_val=64",
                           "--data.init_args.n_test=64"])  # fmt: skip
        timer = StepTimer()
        _hook_parts(timer, cli.model)
        cli.trainer.callbacks.append(timer)
        cli.trainer.fit(cli.model, cli.datamodule)
    measured = timer.steps[max(1, steps // 3) :]
    out = {k: 1e3 * statistics.median(m[k] for m in measured) for k in measured[0]}
    out["encoder_calls"] = statistics.median(m["encoder_calls"] for m in measured)
    out["rest_of_forward"] = out["total"] - out["backward"] - sum(out[p] for p in PARTS)
    out["steps_timed"] = len(measured)
    return out


def reads_user_file(config: Path) -> bool:
    """Whether ``config``'s data block is not the synthetic data (a user's table)."""
    import yaml

    data = (yaml.safe_load(config.read_text()) or {}).get("data")
    return "synthetic" not in str(data).lower()


def measure_ssl(threads: int, steps: int, batch: int, quick: bool = False) -> dict[str, Any]:
    """Each pretraining config's step over the supervised step's (fresh-process entry point).

    ``quick``: only the configs of :data:`QUICK_CONFIGS` (a smoke run).

    A config that fails to fit is reported under ``errors`` (its message's last line) and
    left out of the ratios, so one config cannot lose the others' figures.
    """
    torch.set_num_threads(threads)
    supervised = fit_steps(str(ROOT / SUPERVISED), steps, batch, False)
    breakdown: dict[str, Any] = {"supervised": supervised}
    ratios, errors, substituted = {}, {}, []
    for path in pretrain_configs(quick):
        user_file = reads_user_file(path)
        if user_file:
            substituted.append(path.stem)
        try:
            figures = fit_steps(str(path), steps, batch, user_file)
        except Exception as e:  # noqa: BLE001 - recorded, the other configs still run
            errors[path.stem] = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            continue
        breakdown[path.stem] = figures
        ratios[path.stem] = figures["total"] / supervised["total"]
    return {"ratios": ratios, "breakdown_ms": breakdown, "threads": threads, "batch": batch,
            "synthetic_data_instead_of_user_file": substituted, "errors": errors}  # fmt: skip
