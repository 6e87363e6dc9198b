"""``ShardedTablesStrategy``: Lightning DDP for dense layers, TorchRec sharding for the tables.

Lightning has no TorchRec strategy; this one is a ``DDPStrategy`` that, before wrapping the
model, replaces every ``MixedPrecisionEmbeddingCollection`` with its sharded twin through
TorchRec's ``shard_modules`` (plan from :mod:`ssl_rec.distributed.planner`), on a process
group of its own. The sharded tables are not DDP's business: they hold no parameters or
buffers DDP could see. Checkpoints are torch.distributed.checkpoint directories that every
rank writes into a staging directory that rank 0 then swaps into place with the library's
manifest (:mod:`ssl_rec.distributed.dcp_checkpoint`); they load on any number of ranks
(resharded) or in one process. A torchrun worker running this strategy ends when its
launcher dies (:func:`ssl_rec.distributed.launcher.follow_launcher`).

Plain multi-process strategies would keep one full copy of the tables per rank, each updated
by its own samples only (the fused optimizer runs in backward, outside DDP), and DDP's buffer
broadcast cannot even send the int16 cache tags over gloo: :func:`refuse_unsharded_tables`
stops such runs with a message instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy
from pytorch_lightning.utilities.rank_zero import rank_zero_info
from torch import nn

from ssl_rec.distributed.dcp_checkpoint import (
    load_distributed_checkpoint,
    remove_stale_staging,
    save_distributed_checkpoint,
)
from ssl_rec.distributed.grad_hooks import GRADIENT_PRECISIONS, gradient_hook
from ssl_rec.distributed.launcher import follow_launcher
from ssl_rec.distributed.planner import SHARDING_CHOICES, plan_collection, read_plan_file
from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection
from ssl_rec.lightning.checkpoint_loading import read_checkpoint
from ssl_rec.lightning.table_prefetch import TablePrefetch

__all__ = ["ShardedTablesStrategy", "refuse_unsharded_tables"]


def _collections(module: nn.Module) -> dict[str, MixedPrecisionEmbeddingCollection]:
    return {n: m for n, m in module.named_modules() if type(m) is MixedPrecisionEmbeddingCollection}


def refuse_unsharded_tables(trainer: pl.Trainer, module: nn.Module) -> None:
    """Raise when a multi-process run would replicate the tables instead of sharding them.

    Called from the LightningModules' ``setup``, before any strategy wraps the model.

    Raises:
        ValueError: ``trainer.world_size > 1`` with a strategy other than
            :class:`ShardedTablesStrategy` and a model holding embedding tables.

    """
    if trainer.world_size <= 1 or isinstance(trainer.strategy, ShardedTablesStrategy):
        return
    if not _collections(module):
        return
    raise ValueError(
        f"strategy {type(trainer.strategy).__name__} on {trainer.world_size} processes would give "
        "every process its own copy of the embedding tables, each trained on its own samples "
        "(the fused optimizer runs outside DDP) and broadcast by DDP as buffers; use "
        "ssl_rec.lightning.ShardedTablesStrategy (e.g. --trainer.strategy "
        "configs/common/strategy/table_wise.yaml), which shards the tables across processes"
    )


class ShardedTablesStrategy(DDPStrategy):
    """Data-parallel dense layers, embedding tables sharded over the ranks by TorchRec.

    Args:
        sharding: ``auto`` (TorchRec's planner with the library's storage and cost
            estimates), ``table_wise`` or ``row_wise`` (every table that splits exactly,
            the rest table-wise).
        table_overrides: Table name -> ``{sharding_type, ranks}``, applied over the plan.
        plan_file: A plan written by ``ssl-rec plan`` (JSON); replaces ``sharding``.
        forward_precision: Embedding all-to-all precision in forward: ``fp32 | fp16 | bf16
            | int8`` (TorchRec qcomm codecs; see ``ssl_rec.distributed.sharder.qcomm_registry``).
        backward_precision: Same, for the gradients in backward.
        gradient_precision: Dense gradient all-reduce (DDP comm hook): ``fp32 | fp16 | bf16``.
        pipeline: Pipelined steps: each next batch's input dist (its ids' all-to-all) runs
            during the current step, with the unpipelined step's results (adds the
            :class:`~ssl_rec.lightning.table_prefetch.TablePrefetch` callback if absent).

    Example:
        >>> strategy = ShardedTablesStrategy("row_wise", forward_precision="fp16")
        >>> trainer = pl.Trainer(strategy=strategy, devices=2)  # doctest: +SKIP

    """

    strategy_name = "sharded_tables"

    def __init__(
        self,
        sharding: str = "auto",
        table_overrides: dict[str, dict[str, Any]] | None = None,
        plan_file: str | None = None,
        forward_precision: str = "fp32",
        backward_precision: str = "fp32",
        gradient_precision: str = "fp32",
        pipeline: bool = False,
    ) -> None:
        if sharding not in SHARDING_CHOICES:
            raise ValueError(
                f"ShardedTablesStrategy.sharding={sharding!r} is not one of "
                f"{list(SHARDING_CHOICES)}"
            )
        if gradient_precision not in GRADIENT_PRECISIONS:
            raise ValueError(
                f"ShardedTablesStrategy.gradient_precision={gradient_precision!r} is not one of "
                f"{list(GRADIENT_PRECISIONS)}"
            )
        if plan_file is not None and not os.path.isfile(plan_file):
            raise FileNotFoundError(f"ShardedTablesStrategy.plan_file not found: {plan_file}")
        follow_launcher()
        # Objectives leave some dense parameters out of some losses (e.g. [MASK] tokens in CTR).
        super().__init__(find_unused_parameters=True)
        self.sharding, self.plan_file = sharding, plan_file
        self.table_overrides = dict(table_overrides or {})
        self.precisions = (forward_precision, backward_precision)
        self.gradient_precision = gradient_precision
        self.pipeline = bool(pipeline)
        self._table_group: dist.ProcessGroup | None = None
        self.plans: dict[str, dict] = {}

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Restore after the tables are sharded, into the sharded layout."""
        return True

    def setup(self, trainer: pl.Trainer) -> None:
        """Shard the tables, then let DDP wrap what is left (dense layers).

        Rank 0 first removes the staging directories killed saves left in the checkpoint
        directories (before this run's first save). With ``pipeline`` the trainer gets a
        ``TablePrefetch`` callback (before a checkpoint is restored into it).
        """
        if self.is_global_zero:
            for callback in trainer.checkpoint_callbacks:
                if getattr(callback, "dirpath", None):
                    remove_stale_staging(callback.dirpath)
        self._shard_tables()
        if self.pipeline and not any(isinstance(c, TablePrefetch) for c in trainer.callbacks):
            trainer.callbacks.append(TablePrefetch())
        super().setup(trainer)

    def _shard_tables(self) -> None:
        from torchrec.distributed.types import ShardingEnv

        from ssl_rec.distributed.sharder import (
            MixedPrecisionCollectionSharder,
            qcomm_registry,
            shard_collections,
        )

        collections = _collections(self.lightning_module)
        if not collections:
            return
        if self._table_group is None:
            self._table_group = dist.new_group(backend="gloo")
        world = dist.get_world_size(self._table_group)
        plans = {path: self._plan(path, c, world) for path, c in collections.items()}
        env = ShardingEnv.from_process_group(self._table_group)
        sharder = MixedPrecisionCollectionSharder(qcomm_registry(*self.precisions))
        shard_collections(
            self.lightning_module, {p: r.placements for p, r in plans.items()}, env, sharder
        )
        self.plans = {path: p.to_dict() for path, p in plans.items()}

    def _plan(self, path: str, collection: MixedPrecisionEmbeddingCollection, world: int):
        overrides = read_plan_file(self.plan_file) if self.plan_file else {}
        overrides.update(self.table_overrides)
        sharding = "table_wise" if self.plan_file else self.sharding
        result = plan_collection(collection, world, self.num_processes, sharding, overrides)
        [result] = self.broadcast([result])  # every rank shards with rank 0's plan
        rank_zero_info(f"Sharding plan of {path or 'the model'}:\n{result.format()}")
        return result

    def _register_ddp_hooks(self) -> None:
        # Lightning registers DDP comm hooks on CUDA only; gloo runs them as well.
        hook = gradient_hook(self.gradient_precision)
        if hook is not None:
            self.model.register_comm_hook(state=None, hook=hook)
        super()._register_ddp_hooks()

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath, storage_options: Any = None
    ) -> None:
        """Collective: every rank writes its table blocks; ``filepath`` is replaced whole.

        A failed or killed save leaves the previous checkpoint at ``filepath`` (or nothing).
        """
        save_distributed_checkpoint(checkpoint, filepath)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """Load a checkpoint into this run's sharded layout.

        A DCP directory (any save-time world size) is resharded. A one-process checkpoint
        file is read with its tables left in the file (read-only views, checksums and class
        paths checked): :meth:`load_model_state_dict` then copies each rank's rows.
        """
        if os.path.isfile(checkpoint_path):
            return read_checkpoint(checkpoint_path, mapped=True)
        if not os.path.isdir(checkpoint_path):
            raise FileNotFoundError(f"checkpoint not found: {checkpoint_path}")
        return load_distributed_checkpoint(checkpoint_path, self.lightning_module.state_dict())

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load the model state (a collective: sharded tables redistribute their rows)."""
        self.lightning_module.load_state_dict(checkpoint["state_dict"], strict=strict)
