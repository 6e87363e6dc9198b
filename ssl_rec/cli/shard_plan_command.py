"""``ssl-rec plan``: the sharding plan of a config's tables over N ranks, printed and as JSON.

    ssl-rec plan --config configs/dist/synthetic_int8_row_wise.yaml --world_size 8
    ssl-rec plan --config CFG --world_size 8 --cardinalities criteo_kaggle --out plan.json
    ssl-rec plan --config CFG --world_size 8 --ckpt_path runs/ctr/checkpoints/last.ckpt

The model is built from the config (its data module gives the cardinalities; further
``--data.init_args...`` style flags are passed on); the sharding, overrides and plan file of
a ``ShardedTablesStrategy`` in the config apply. ``--cardinalities criteo_kaggle`` plans the
same tables at Criteo-Kaggle sizes. ``--ckpt_path CKPT`` plans the tables of a fit's
checkpoint instead, with the hit rates its caches counted in training; ``--stats_batches K``
measures the caches' hit rates on K training batches first (a data pass); otherwise they are
assumed uniform. The flags are parsed by jsonargparse, like every non-Lightning subcommand.
"""

from __future__ import annotations

from collections.abc import Sequence
from inspect import signature
from typing import Any, Literal

from jsonargparse import ArgumentParser

from ssl_rec._io import atomic_write_json
from ssl_rec.cli.allow_class_option import ALLOW_HELP
from ssl_rec.cli.commands import instantiate
from ssl_rec.data import CRITEO_KAGGLE_CARDINALITIES
from ssl_rec.distributed.cost_model import TableInfo, default_hit_rate
from ssl_rec.distributed.planner import PlanResult, plan_tables, read_plan_file, tables_of
from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection
from ssl_rec.lightning.checkpoint_loading import load_module
from ssl_rec.lightning.strategy import ShardedTablesStrategy

__all__ = ["plan_main"]

# Fit flags that are not the plan's own go on to the config's LightningCLI parser.
_FIT_FLAGS_HELP = (
    "Other flags (--data.*, --model.*, --trainer.* overrides) go on to the fit config's "
    "parser, as after `ssl-rec fit`. "
)


def _plan_options(
    world_size: int,
    ckpt_path: str | None = None,
    local_world_size: int | None = None,
    cardinalities: Literal["config", "criteo_kaggle"] = "config",
    stats_batches: int = 0,
    out: str = "plan.json",
) -> None:
    """The plan's own flags (jsonargparse reads this signature and docstring).

    Args:
        world_size: ranks to plan for.
        ckpt_path: a checkpoint of the config's model written by ``ssl-rec fit``: plan its
            tables with the hit rates its caches counted in training.
        local_world_size: ranks per host (default: all on one host).
        cardinalities: the config's table sizes, or Criteo-Kaggle's (26 tables).
        stats_batches: measure the caches' hit rates on this many training batches first.
        out: the plan's JSON file.

    """


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="ssl-rec plan", description=__doc__.splitlines()[0],
                            epilog=_FIT_FLAGS_HELP + ALLOW_HELP, exit_on_error=False)  # fmt: skip
    parser.add_argument("--config", action="append", required=True, help="fit config (repeatable)")
    parser.add_function_arguments(_plan_options, as_group=False)
    return parser


def _own_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``argv`` split into the plan's own flags (with their values) and the fit's overrides."""
    options = signature(_plan_options).parameters
    own_names = {"-h", "--help", "--config", *(f"--{name}" for name in options)}
    own, fit = [], []
    args = iter(argv)
    for arg in args:
        name = arg.split("=", 1)[0]
        if name not in own_names:
            fit.append(arg)
            continue
        own.append(arg)
        if "=" not in arg and name not in ("-h", "--help"):
            value = next(args, None)
            if value is not None:
                own.append(value)
    return own, fit


def _data_pass(model: Any, datamodule: Any, collection, batches: int) -> None:
    """Run ``batches`` training batches through the tables' caches (no update) for hit rates."""
    datamodule.prepare_data()
    datamodule.setup("fit")
    collection.train()
    for i, batch in enumerate(datamodule.train_dataloader()):
        if i >= batches:
            break
        collection.group.admit_and_lookup(batch.sparse.to(collection.group.step.device))


def _strategy_settings(trainer: Any) -> tuple[str, dict]:
    strategy = trainer.strategy
    if not isinstance(strategy, ShardedTablesStrategy):
        return "auto", {}
    overrides = read_plan_file(strategy.plan_file) if strategy.plan_file else {}
    overrides.update(strategy.table_overrides)
    return ("table_wise" if strategy.plan_file else strategy.sharding), overrides


def plan_main(argv: Sequence[str]) -> PlanResult:
    """Entry of ``ssl-rec plan``; returns the plan (also printed and written to ``--out``).

    Args:
        argv: the command line after ``plan``; ``--help`` lists the flags.

    """
    own, rest = _own_flags(argv)
    args = _parser().parse_args(own)
    if args.world_size < 1:
        raise ValueError(f"--world_size must be >= 1, got {args.world_size}")
    configs = [item for path in args.config for item in ("--config", path)]
    cli = instantiate([*configs, *rest])
    model = load_module(args.ckpt_path) if args.ckpt_path else cli.model
    found = [m for m in model.modules() if type(m) is MixedPrecisionEmbeddingCollection]
    if len(found) != 1:
        where = args.ckpt_path or args.config
        raise ValueError(f"{where}: the model holds {len(found)} embedding collections, not 1")
    collection = found[0]
    if args.stats_batches:
        _data_pass(model, cli.datamodule, collection, args.stats_batches)
    tables = tables_of(collection)
    if args.cardinalities == "criteo_kaggle":
        if len(tables) != len(CRITEO_KAGGLE_CARDINALITIES):
            raise ValueError(
                f"--cardinalities criteo_kaggle needs 26 tables, the model has {len(tables)}"
            )
        tables = [TableInfo(t.name, rows, t.dim, t.spec, default_hit_rate(t.spec))
                  for t, rows in zip(tables, CRITEO_KAGGLE_CARDINALITIES, strict=True)]  # fmt: skip
    sharding, overrides = _strategy_settings(cli.trainer)
    result = plan_tables(tables, args.world_size, args.local_world_size, sharding, overrides)
    print(result.format())
    atomic_write_json(args.out, result.to_dict())
    print(f"wrote {args.out}")
    return result
