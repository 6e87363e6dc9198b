"""``TableGroup``: tables looked up by one fused kernel call, the optimizer fused into backward.

As in FBGEMM's table-batched embeddings (TBE):

A training forward runs ``train_forward`` (cache admission with eviction write-back, and
lookup + dequantize, in one pass) over all tables in one call. The autograd Function takes a
0-element placeholder that requires grad, as FBGEMM does, so autograd calls its backward;
backward runs ``update`` (per-row gradient aggregation, optimizer step, FP32 cache write or
stochastically rounded store write) and returns no gradient: no dense gradient of a table
is ever materialised.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from ssl_rec.hardware.kernels.dispatch import get_kernels
from ssl_rec.hardware.kernels.layout import TableTensors
from ssl_rec.hardware.memory import summarize
from ssl_rec.hardware.table import EmbeddingTable

__all__ = ["TableGroup"]


class _FusedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, placeholder, ids, group, update):  # noqa: D102
        ctx.group, ctx.update = group, update
        out, slots = group.admit_and_lookup(ids)
        ctx.save_for_backward(ids, slots)
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        if ctx.update:
            ids, slots = ctx.saved_tensors
            ctx.group.apply_update(ids, grad, slots)
        return None, None, None, None


class TableGroup(nn.Module):
    """Tables sharing one kernel call, one RNG seed and one step counter.

    Args:
        tables: The tables, all of the same dimension D.
        seed: Seed of the stochastic-rounding RNG.

    Attributes:
        step: int64 scalar buffer, the RNG step counter (saved in ``state_dict``).

    Example:
        >>> from ssl_rec.hardware.spec import TableSpec
        >>> g = TableGroup([EmbeddingTable(10, 4, TableSpec("int8"), stream=0)], seed=0)
        >>> g.tables[0].init_normal(0.05, 0)
        >>> g(torch.tensor([[1], [2]]), train=False).shape
        torch.Size([2, 1, 4])

    """

    def __init__(self, tables: list[EmbeddingTable], seed: int) -> None:
        super().__init__()
        dims = {t.dim for t in tables}
        if len(dims) != 1:
            raise ValueError(f"all tables of a group need one embedding_dim, got {sorted(dims)}")
        self.tables = nn.ModuleList(tables)
        self.seed = seed
        self.register_buffer("step", torch.zeros((), dtype=torch.int64))
        self._meta = torch.tensor([t.meta_row() for t in tables], dtype=torch.int64)
        hp = [[t.spec.learning_rate, t.spec.eps] for t in tables]
        self._hparams = torch.tensor(hp, dtype=torch.float32)
        self._limits = torch.tensor([t.num_rows for t in tables], dtype=torch.int64)

    def tensors(self, tables: list[int] | None = None) -> TableTensors:
        """The kernels' view of (a subset of) the tables."""
        idx = list(range(len(self.tables))) if tables is None else tables
        ts = [self.tables[i] for i in idx]
        return TableTensors(
            stores=[t.store for t in ts],
            cache_rows=[t.cache.rows for t in ts],
            cache_tags=[t.cache.tags for t in ts],
            cache_state=[t.cache.state for t in ts],
            stats=[t.cache.stats for t in ts],
            momentum=[t.momentum for t in ts],
            meta=self._meta[idx],
            hparams=self._hparams[idx],
        )

    def check_ids(self, ids: torch.Tensor, limits: torch.Tensor | None = None) -> None:
        """Raise IndexError naming the table, the id and the cardinality of a bad id.

        Args:
            ids: int64[B, T] ids.
            limits: int64[T] cardinalities (default: all tables').

        """
        limits = self._limits if limits is None else limits
        bad = (ids < 0) | (ids >= limits)
        if bool(bad.any()):
            b, f = (int(v) for v in bad.nonzero()[0])
            raise IndexError(
                f"table {f}: id {int(ids[b, f])} out of range [0, {int(limits[f])}) "
                f"(cardinality {int(limits[f])}) at sample {b}"
            )

    def _next_step(self) -> int:
        step = int(self.step)
        self.step += 1
        return step

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Current values (cache if cached, else store): float32[B, T, D], no side effects."""
        return get_kernels().forward(self.tensors(), ids)

    def admit_and_lookup(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Admit ids int64[B, T] into the caches and look them up in one fused pass.

        Returns:
            float32[B, T, D] values and int32[B, T] cache slots (hints for ``apply_update``).

        """
        return get_kernels().train_forward(self.tensors(), ids, self.seed, self._next_step())

    def apply_update(
        self, ids: torch.Tensor, grad: torch.Tensor, slots: torch.Tensor | None = None
    ) -> None:
        """Fused optimizer step for gradient float32[B, T, D] of the output for ids[B, T].

        ``slots`` are the int32[B, T] hints of ``admit_and_lookup`` (results never depend
        on them).
        """
        get_kernels().update(
            self.tensors(), ids, grad.float().contiguous(), self.seed, self._next_step(), slots
        )

    def forward(self, ids: torch.Tensor, train: bool) -> torch.Tensor:
        """Look up one id per (sample, table).

        Args:
            ids: int64[B, T] table-local ids.
            train: Admit rows into the caches and attach the fused-update backward.

        Returns:
            float32[B, T, D]; requires grad when ``train`` and grad mode is on.

        """
        ids = ids.to(torch.int64).contiguous()
        self.check_ids(ids)
        if not (train and torch.is_grad_enabled()):
            with torch.no_grad():
                return self.lookup(ids)
        placeholder = torch.empty(0, requires_grad=True)
        return _FusedLookup.apply(placeholder, ids, self, True)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Step every table's fused optimizer with ``learning_rate`` from now on (> 0)."""
        if not learning_rate > 0:
            raise ValueError(f"learning_rate={learning_rate!r} must be > 0")
        for t in self.tables:
            t.spec = dataclasses.replace(t.spec, learning_rate=float(learning_rate))
        self._hparams[:, 0] = float(learning_rate)

    @torch.no_grad()
    def dequantize_rows(self, table: int, ids: torch.Tensor) -> torch.Tensor:
        """Current float32[n, D] values of rows ``ids`` (int64[n]) of table ``table``."""
        if not 0 <= table < len(self.tables):
            raise IndexError(f"table {table} out of range [0, {len(self.tables)})")
        ids = ids.to(torch.int64).reshape(-1, 1).contiguous()
        self.check_ids(ids, self._limits[table : table + 1])
        return get_kernels().forward(self.tensors([table]), ids)[:, 0, :]

    def memory_report(self) -> dict:
        """Per-table and total bytes (see ``memory.summarize``)."""
        return summarize([t.memory() for t in self.tables])

    def cache_stats(self) -> dict[str, float]:
        """Aggregated (``hit_rate``, ``evictions``, ...) and per-table (``table{i}/...``) stats."""
        per = [t.cache_stats() for t in self.tables]
        out: dict[str, float] = {}
        for key in ("hits", "misses", "evictions", "store_writes", "writeback_bytes"):
            out[key] = sum(p[key] for p in per)
        out["capacity_rows"] = sum(p["capacity_rows"] for p in per)
        lookups = out["hits"] + out["misses"]
        out["hit_rate"] = out["hits"] / lookups if lookups else 0.0
        for i, p in enumerate(per):
            out.update({f"table{i}/{k}": v for k, v in p.items()})
        return out
