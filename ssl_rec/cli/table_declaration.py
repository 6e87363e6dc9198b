"""Models of sharded runs are built with declared tables: each rank then allocates its rows.

Under ``ShardedTablesStrategy`` the command line instantiates the model inside
:func:`~ssl_rec.hardware.declare_tables`, so no process allocates a whole table before the
strategy shards it (docs/scale-out.md, "Shard-local construction"). What reads a model's
tables before sharding reads shapes only (the resume check of ``fit --ckpt_path``,
``table_allocation.declared_state``) or leaves them pending: ``--model.init_from`` gives the
declared tables the checkpoint's, mapped from the file, and each rank copies its rows when
they are sharded (a checkpoint in other table formats is converted whole).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from ssl_rec.hardware.table_allocation import declare_tables

__all__ = ["model_tables", "shards_tables"]


def _strategy_class(strategy: Any) -> type | None:
    """The class a ``--trainer.strategy`` value names: a class path, an instance, or ``None``."""
    if strategy is None or isinstance(strategy, str | bool):
        return None  # registry names ("ddp", "auto"): none of them is the sharded strategy
    if isinstance(strategy, type):
        return strategy
    class_path = strategy.get("class_path") if hasattr(strategy, "get") else None
    if not isinstance(class_path, str):
        return type(strategy)
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None  # the trainer's own instantiation reports it


def shards_tables(config: Any) -> bool:
    """Whether the command's trainer shards the tables (``ShardedTablesStrategy`` or a subclass).

    Args:
        config: The subcommand's parsed configuration (with ``trainer.strategy``).

    """
    from ssl_rec.lightning.strategy import ShardedTablesStrategy

    trainer = config.get("trainer") if hasattr(config, "get") else None
    strategy = trainer.get("strategy") if hasattr(trainer, "get") else None
    cls = _strategy_class(strategy)
    return isinstance(cls, type) and issubclass(cls, ShardedTablesStrategy)


def model_tables(config: Any) -> contextlib.AbstractContextManager[None]:
    """The context to instantiate the command's model in: declared tables when sharded.

    Example:
        >>> from jsonargparse import Namespace
        >>> strategy = Namespace(class_path="ssl_rec.lightning.ShardedTablesStrategy")
        >>> from ssl_rec.hardware.table_allocation import declaring
        >>> with model_tables(Namespace(trainer=Namespace(strategy=strategy))):
        ...     declaring()
        True

    """
    return declare_tables() if shards_tables(config) else contextlib.nullcontext()
