"""``MixedPrecisionEmbeddingCollection``: many low-precision cached tables, one id per field.

All tables are looked up and updated by one fused kernel call each (FBGEMM TBE style).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ssl_rec.hardware.memory import estimate_memory
from ssl_rec.hardware.spec import TableSpec
from ssl_rec.hardware.table import EmbeddingTable
from ssl_rec.hardware.table_allocation import (
    declared_state,
    declaring,
    reading_declared_state,
)
from ssl_rec.hardware.table_group import TableGroup

__all__ = ["MixedPrecisionEmbeddingCollection"]


def _load_hook(
    module: MixedPrecisionEmbeddingCollection, state_dict: dict[str, Any], prefix: str,
    *args: object,
) -> None:  # fmt: skip
    """Before a load: declared tables keep full tensors as pending values, else allocate.

    The load goes on with meta stand-ins (no data read), so nn.Module still checks keys and
    shapes against the declared tables, and ``_extra_state`` the formats.
    """
    ours = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    tensors = {k: v for k, v in ours.items() if isinstance(v, torch.Tensor)}
    if not module.declared or any(type(v) is not torch.Tensor or v.is_meta
                                  for v in tensors.values()):  # fmt: skip
        module.allocate()
        return
    if tensors:  # a later load (strict=False, other keys) adds to an earlier one
        module._pending = {**(module._pending or {}), **ours}
    with declared_state():
        own = module.state_dict()
    for key, value in tensors.items():  # pre-hooks may change the state they load
        if isinstance(own.get(key), torch.Tensor) and own[key].is_meta:
            state_dict[prefix + key] = value.to("meta")


def _state_hook(module: MixedPrecisionEmbeddingCollection, *args: object) -> None:
    if not reading_declared_state():
        module.allocate()


def _expand_specs(specs: Sequence[TableSpec] | TableSpec, n: int) -> list[TableSpec]:
    if isinstance(specs, TableSpec):
        return [specs] * n
    specs = list(specs)
    if len(specs) != n:
        raise ValueError(f"len(specs)={len(specs)} must equal len(cardinalities)={n}")
    return specs


class MixedPrecisionEmbeddingCollection(nn.Module):
    """One embedding table per sparse field, each with its own :class:`TableSpec`.

    The optimizer is fused into backward (tables are buffers, not Parameters): a training
    forward returns a tensor that requires grad, and its backward updates the tables in place
    when ``self.training and not self.frozen``. Mixed-precision storage with an FP32 cache
    follows Yang et al., 2020 (https://arxiv.org/abs/2010.11305); the fused update follows
    FBGEMM TBE (https://github.com/pytorch/FBGEMM).

    Args:
        cardinalities: Rows per table, each ``> 0``.
        embedding_dim: D, shared by all tables.
        specs: One spec per table, or one for all.
        seed: Seed of initialisation and of the stochastic-rounding RNG.
        init_std: Standard deviation of the N(0, std^2) initial rows.
        table_names: One name per table (default ``t0, t1, ...``), e.g. the field names;
            sharding plans address tables by these names.

    Built inside :func:`~ssl_rec.hardware.table_allocation.declare_tables`, the tables are
    only declared (meta device, no memory): a sharded run allocates each rank's rows
    (``ssl_rec.distributed``); in one process the first forward, ``state_dict`` or
    :meth:`allocate` allocates and initializes them whole, with the values an allocated
    collection would have had. ``load_state_dict`` of full tensors into declared tables
    keeps them declared: the tensors (e.g. read-only views of a checkpoint file) are held
    as pending values, which the sharder gives each shard its rows of and which
    :meth:`allocate` loads whole.

    Attributes:
        frozen: When True, backward computes no update and forward admits nothing to caches.
        init_std: The standard deviation the tables were (or will be) initialized with.

    Shape:
        - ids: int64[B, F], ``0 <= ids[:, f] < cardinalities[f]``.
        - output: float32[B, F, D].

    Example:
        >>> emb = MixedPrecisionEmbeddingCollection([100, 50], 8, TableSpec("int8", 0.1))
        >>> out = emb(torch.tensor([[1, 2], [3, 4]]))
        >>> out.sum().backward()  # fused row-wise Adagrad step on the touched rows
        >>> out.shape
        torch.Size([2, 2, 8])

    """

    def __init__(
        self,
        cardinalities: list[int],
        embedding_dim: int,
        specs: list[TableSpec] | TableSpec = TableSpec(),  # noqa: B008 - frozen dataclass
        seed: int = 0,
        init_std: float = 0.05,
        table_names: list[str] | None = None,
    ) -> None:
        super().__init__()
        if not cardinalities:
            raise ValueError("cardinalities must name at least one table")
        bad = [c for c in cardinalities if int(c) <= 0]
        if bad:
            raise ValueError(f"cardinalities must be > 0, got {bad}")
        if init_std < 0:
            raise ValueError(f"init_std={init_std} must be >= 0")
        specs = _expand_specs(specs, len(cardinalities))
        names = [f"t{i}" for i in range(len(cardinalities))] if table_names is None else table_names
        if len(names) != len(cardinalities) or len(set(names)) != len(names):
            raise ValueError(
                f"table_names={list(names)} must be {len(cardinalities)} distinct names"
            )
        self.cardinalities = [int(c) for c in cardinalities]
        self.table_names = list(names)
        self.embedding_dim = embedding_dim
        self.specs = specs
        self.frozen = False
        self.init_std, self._seed = float(init_std), seed
        self.declared = declaring()
        self._pending: dict[str, Any] | None = None  # see take_pending_state
        self.group = TableGroup(self._tables(meta=self.declared), seed)
        # Whatever allocates tables that were declared must run before a state is read.
        self.register_state_dict_pre_hook(_state_hook)
        self._register_load_state_dict_pre_hook(_load_hook, with_module=True)

    def _tables(self, meta: bool) -> list[EmbeddingTable]:
        tables = []
        for i, (rows, spec) in enumerate(zip(self.cardinalities, self.specs, strict=True)):
            name = self.table_names[i]
            stored_rows, width = spec.stored_shape(rows, self.embedding_dim, f"table {name!r}")
            table = EmbeddingTable(stored_rows, width, spec, stream=i, name=name, meta=meta)
            if not meta:
                table.init_normal(self.init_std, self._seed)
            tables.append(table)
        return tables

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 - nn.Module's signature
        # Declared tables hold nothing to move or cast (``.cpu()``, ``.to()``); they are
        # allocated on the CPU, where the kernels run.
        return self if self.declared else super()._apply(fn, recurse)

    def allocate(self) -> None:
        """Allocate and initialize declared tables whole (nothing if they are allocated).

        Raises:
            TableMemoryError: A table does not fit (names the table and its bytes).

        """
        if not self.declared:
            return
        group = TableGroup(self._tables(meta=False), self._seed)
        group.step.copy_(self.group.step)
        self.group, self.declared = group, False
        pending = self.take_pending_state()
        if pending is not None:  # its keys and shapes were checked when it was given
            self.load_state_dict(pending, strict=False)

    def take_pending_state(self) -> dict[str, Any] | None:
        """The state a declared collection was loaded with (then forgotten), else ``None``.

        Full tensors under this collection's ``state_dict`` keys, as given to
        ``load_state_dict``; the sharder loads each shard's rows of them.
        """
        pending, self._pending = self._pending, None
        return pending

    @property
    def num_tables(self) -> int:
        """Number of tables F."""
        return len(self.cardinalities)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up one id per field.

        Args:
            ids: int64[B, F] table-local ids.

        Returns:
            float32[B, F, D]; requires grad in training mode unless frozen.

        Raises:
            ValueError: ``ids`` is not ``[B, F]`` (checked by the table group).
            IndexError: An id is outside ``[0, cardinality)`` (names table, id, cardinality).

        """
        if self.declared:
            self.allocate()
        return self.group(ids, train=self.training and not self.frozen)

    def dequantize_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Current values (cache if cached, else store) of rows ``ids`` int64[n]: float32[n, D]."""
        self.allocate()
        return self.group.dequantize_rows(table, ids)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Use ``learning_rate`` (> 0) for every table's fused optimizer, e.g. to fine-tune."""
        self.group.set_learning_rate(learning_rate)
        self.specs = [t.spec for t in self.group.tables]

    def load_float(self, table: int, weight: torch.Tensor) -> None:
        """Quantize float32[R, D] ``weight`` into table ``table`` (any source precision)."""
        self.allocate()
        self.group.wait()
        self.group.tables[table].load_float(weight)

    @torch.no_grad()
    def float_weights(self) -> list[torch.Tensor]:
        """Current FP32 ``[R, D]`` weights of every table: the store, overridden by cached rows.

        The source of a precision conversion: pass them to :meth:`load_float` of a collection
        stored in another format (``from_float``-style, as torchrec's quantized modules do).
        """
        return [
            self.dequantize_rows(i, torch.arange(rows, dtype=torch.int64))
            for i, rows in enumerate(self.cardinalities)
        ]

    def get_extra_state(self) -> dict:
        """The tables' specs travel in ``state_dict()``, so a saved state says its own format."""
        return {
            "cardinalities": list(self.cardinalities),
            "embedding_dim": self.embedding_dim,
            "specs": [spec.to_dict() for spec in self.specs],
            "seed": self.group.seed,
        }

    def set_extra_state(self, state: dict) -> None:
        """Refuse a state saved in other formats (loading it would reinterpret the stores)."""
        if not self.matches_state({"_extra_state": state}):
            theirs = [str(s["precision"]) for s in state["specs"]]
            ours = [str(s.precision) for s in self.specs]
            raise ValueError(
                "embedding state has other tables than this collection (precisions "
                f"{theirs} vs {ours}); convert it with from_state_dict(...).float_weights()"
            )

    def matches_state(self, state: Mapping[str, Any]) -> bool:
        """Whether ``state`` (a ``state_dict()``) holds tables in this collection's formats."""
        extra = state.get("_extra_state")
        if not isinstance(extra, Mapping):
            return False
        try:
            theirs = [TableSpec(**spec).layout() for spec in extra["specs"]]
        except (KeyError, TypeError, ValueError):
            return False
        return (
            list(extra.get("cardinalities", [])) == self.cardinalities
            and extra.get("embedding_dim") == self.embedding_dim
            and theirs == [spec.layout() for spec in self.specs]
        )

    def weights_from_state(self, state: Mapping[str, Any]) -> list[torch.Tensor]:
        """FP32 ``[R, D]`` weights of the tables saved in ``state``, whatever their formats."""
        return type(self).from_state_dict(state).float_weights()

    def load_weights(self, weights: Sequence[torch.Tensor]) -> None:
        """Quantize one float32 ``[R, D]`` weight per table into this collection's formats."""
        if len(weights) != self.num_tables:
            raise ValueError(f"got {len(weights)} weights for {self.num_tables} tables")
        for index, weight in enumerate(weights):
            self.load_float(index, weight)

    def reset_optimizer_state(self) -> None:
        """Zero every table's row-wise Adagrad accumulator.

        Declared tables start with zero accumulators: pending ones get zeros (no memory).
        """
        if self.declared:
            pending = self._pending or {}
            for key, value in pending.items():
                if key.endswith(".momentum"):
                    pending[key] = torch.zeros((), dtype=value.dtype).expand(value.shape)
            return
        self.group.wait()
        for table in self.group.tables:
            table.momentum.zero_()

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, torch.Tensor]
    ) -> MixedPrecisionEmbeddingCollection:
        """Rebuild the collection that produced ``state`` (a ``state_dict()``), then load it."""
        extra = state.get("_extra_state")
        if not isinstance(extra, Mapping) or "specs" not in extra:
            raise ValueError(
                "state holds no '_extra_state' with table specs (not a saved collection)"
            )
        specs = [TableSpec(**spec) for spec in extra["specs"]]
        collection = cls(list(extra["cardinalities"]), int(extra["embedding_dim"]), specs,
                         seed=int(extra["seed"]), init_std=0.0)  # fmt: skip
        collection.load_state_dict(state)
        return collection

    def memory_report(self) -> dict:
        """Bytes per table and in total.

        Returns:
            ``{"tables": [...], "total": {...}, "compression": fp32 / total}`` with keys
            ``quantized_rows, scales_biases, cache_rows, cache_metadata, optimizer_state,
            total_bytes, fp32_bytes``; ``total_bytes`` excludes ``optimizer_state``.

        """
        return self.group.memory_report()

    def cache_stats(self) -> dict[str, float]:
        """``hit_rate``, ``hits``, ``misses``, ``evictions``, ... aggregated and per table."""
        return self.group.cache_stats()

    def prefetch_next(self, ids: torch.Tensor | None, background: bool = True) -> None:
        """Admit the next batch's ``ids`` int64[B, F] right after the next training forward.

        The admission runs on a helper thread when ``background``, beside the dense layers;
        results are identical either way (see ``TableGroup.schedule_prefetch``). ``None``
        cancels; eval mode and frozen tables ignore it.
        """
        if ids is not None and (ids.dim() != 2 or ids.shape[1] != self.num_tables):
            raise ValueError(f"ids shape {tuple(ids.shape)} must be [B, {self.num_tables}]")
        if self.training and not self.frozen:
            self.allocate()
            self.group.schedule_prefetch(ids, background)

    @staticmethod
    def estimate_memory(
        cardinalities: Sequence[int],
        embedding_dim: int,
        specs: Sequence[TableSpec] | TableSpec = TableSpec(),  # noqa: B008
    ) -> dict:
        """``memory_report()`` of a collection that is never allocated (same byte counting)."""
        return estimate_memory(cardinalities, embedding_dim, specs)
