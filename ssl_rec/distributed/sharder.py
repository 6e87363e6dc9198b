"""``MixedPrecisionCollectionSharder``: TorchRec's sharder for the library's collections.

TorchRec's ``shard_modules`` / ``DistributedModelParallel`` find every
``MixedPrecisionEmbeddingCollection`` in a model and call :meth:`shard` with that module's
``ParameterSharding`` per table (its ``sharding_type`` and ``ranks``); the planner asks
:meth:`shardable_parameters`, :meth:`sharding_types` and :meth:`compute_kernels`.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.fbgemm_qcomm_codec import (
    CommType,
    QCommsConfig,
    get_qcomm_codecs_registry,
)
from torchrec.distributed.types import (
    CommOp,
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ParameterSharding,
    QuantizedCommCodecs,
    ShardingEnv,
)

from ssl_rec.distributed.sharded_collection import ShardedMixedPrecisionEmbeddingCollection
from ssl_rec.distributed.table_placement import SHARDING_TYPES, TablePlacement
from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection

COMPUTE_KERNEL = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
COMM_PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")

__all__ = [
    "COMM_PRECISIONS",
    "MixedPrecisionCollectionSharder",
    "qcomm_registry",
    "to_torchrec_plan",
]


def qcomm_registry(
    forward: str = "fp32", backward: str = "fp32"
) -> dict[str, QuantizedCommCodecs] | None:
    """TorchRec codecs for the embedding all-to-alls in ``forward`` / ``backward`` precision.

    ``bf16`` falls back to ``fp16`` on gloo (TorchRec warns). ``int8`` applies to the pooled
    all-to-all of table-wise tables, which TorchRec's row-wise INT8 codec supports; the
    sequence all-to-all of row-split tables falls back to ``fp16`` (FBGEMM's INT8 codec views
    the flat buffer in fixed 32-value rows, which a variable number of ids does not fill).

    Raises:
        ValueError: for a precision outside :data:`COMM_PRECISIONS`.

    """
    for key, value in (("forward_precision", forward), ("backward_precision", backward)):
        if value not in COMM_PRECISIONS:
            raise ValueError(f"{key}={value!r} is not one of {list(COMM_PRECISIONS)}")
    if forward == backward == "fp32":
        return None
    cpu = torch.device("cpu")
    pooled = get_qcomm_codecs_registry(QCommsConfig(CommType(forward), CommType(backward)),
                                       [CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL], cpu)  # fmt: skip
    seq_fwd, seq_bwd = (("fp16" if p == "int8" else p) for p in (forward, backward))
    if "int8" in (forward, backward):
        warnings.warn("int8 comms apply to table-wise tables; row-split tables use fp16",
                      UserWarning, stacklevel=2)  # fmt: skip
    seq = get_qcomm_codecs_registry(QCommsConfig(CommType(seq_fwd), CommType(seq_bwd)),
                                    [CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL], cpu)  # fmt: skip
    return {**(pooled or {}), **(seq or {})}


def to_torchrec_plan(plan: dict[str, TablePlacement]) -> EmbeddingModuleShardingPlan:
    """TorchRec's per-module plan (``ParameterSharding`` per table) of a placement plan."""
    return EmbeddingModuleShardingPlan(
        {
            name: ParameterSharding(
                sharding_type=p.sharding_type, compute_kernel=COMPUTE_KERNEL, ranks=list(p.ranks)
            )
            for name, p in plan.items()
        }  # fmt: skip
    )


class MixedPrecisionCollectionSharder(ModuleSharder[MixedPrecisionEmbeddingCollection]):
    """Shards :class:`MixedPrecisionEmbeddingCollection` into the library's sharded module.

    Args:
        qcomm_codecs_registry: Quantized-comm codecs (see :func:`qcomm_registry`).

    """

    def __init__(self, qcomm_codecs_registry: dict[str, QuantizedCommCodecs] | None = None) -> None:
        super().__init__(qcomm_codecs_registry=qcomm_codecs_registry)

    @property
    def module_type(self) -> type[MixedPrecisionEmbeddingCollection]:
        """The module type this sharder handles."""
        return MixedPrecisionEmbeddingCollection

    def shard(
        self,
        module: MixedPrecisionEmbeddingCollection,
        params: EmbeddingModuleShardingPlan,
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
    ) -> ShardedMixedPrecisionEmbeddingCollection:
        """Build the sharded module from ``params`` (table name -> ``ParameterSharding``).

        A declared collection loaded with full tensors (``load_state_dict`` before sharding,
        e.g. ``--model.init_from``) gives each shard its rows of them: no rank copies more.
        """
        if device is not None and device.type != "cpu":
            raise ValueError(
                f"{module_fqn or 'collection'}: the library's kernels run on cpu, not {device}"
            )
        plan = {
            name: TablePlacement(ps.sharding_type, tuple(ps.ranks or ()))
            for name, ps in params.items()
        }
        sharded = ShardedMixedPrecisionEmbeddingCollection(
            module, plan, env, self.qcomm_codecs_registry
        )
        pending = module.take_pending_state()
        if pending is not None:  # full tensors: each rank copies its rows, no collective
            sharded.load_state_dict(pending)
        return sharded

    def shardable_parameters(
        self, module: MixedPrecisionEmbeddingCollection
    ) -> dict[str, nn.Parameter]:
        """One meta ``[R, D]`` stand-in per table (tables are buffers; the planner wants shapes)."""
        return {
            name: nn.Parameter(
                torch.empty(rows, module.embedding_dim, device="meta"), requires_grad=False
            )
            for name, rows in zip(module.table_names, module.cardinalities, strict=True)
        }

    def sharding_types(self, compute_device_type: str) -> list[str]:
        """Table-wise, row-wise, table-row-wise (rows split cyclically) and data-parallel."""
        return list(SHARDING_TYPES)

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> list[str]:
        """The library's kernels (TorchRec's ``CUSTOMIZED_KERNEL``)."""
        return [COMPUTE_KERNEL]


def shard_collections(
    root: nn.Module,
    plans: dict[str, dict[str, TablePlacement]],
    env: ShardingEnv,
    sharder: MixedPrecisionCollectionSharder,
) -> None:
    """Replace the collection at each path ``p`` of ``root`` by its shard with ``plans[p]``.

    TorchRec's ``shard_modules`` does the same but, being a composable API, refuses modules
    whose buffer names change; the sharded collection's state is not made of buffers.
    """
    for path, plan in plans.items():
        parent_path, _, name = path.rpartition(".")
        parent = root.get_submodule(parent_path)
        module = parent.get_submodule(name)
        sharded = sharder.shard(module, to_torchrec_plan(plan), env, torch.device("cpu"), path)
        parent.register_module(name, sharded)
