"""``MixedPrecisionEmbedding``: one low-precision cached table with sum/mean bag pooling."""

from __future__ import annotations

import torch
from torch import nn

from ssl_rec.hardware.spec import TableSpec
from ssl_rec.hardware.table import EmbeddingTable
from ssl_rec.hardware.table_group import TableGroup

POOLINGS: tuple[str, ...] = ("sum", "mean")

__all__ = ["MixedPrecisionEmbedding"]


class MixedPrecisionEmbedding(nn.Module):
    """A single embedding table stored in low precision with an FP32 cache.

    The low-precision twin of ``nn.EmbeddingBag`` (``from_float`` converts one); updates
    are fused into backward (see :class:`MixedPrecisionEmbeddingCollection`).

    Args:
        num_embeddings: Rows R.
        embedding_dim: D.
        spec: Storage, cache and optimizer choice.
        seed: Seed of initialisation and of the stochastic-rounding RNG.
        init_std: Standard deviation of the N(0, std^2) initial rows.
        store_path: Memory-map the store to this file, so a table larger than RAM trains
            with only its cache in memory.

    Shape:
        - ids: int64[N]; offsets: int64[B + 1] bag boundaries (``offsets[-1] == N``) or None.
        - output: float32[B, D] pooled, or float32[N, D] when ``offsets`` is None.

    Example:
        >>> emb = MixedPrecisionEmbedding(1000, 16, TableSpec("int4", 0.05))
        >>> emb(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3]), pooling="mean").shape
        torch.Size([2, 16])

    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        spec: TableSpec = TableSpec(),  # noqa: B008 - frozen dataclass
        seed: int = 0,
        init_std: float = 0.05,
        store_path: str | None = None,
    ) -> None:
        super().__init__()
        rows, width = spec.stored_shape(num_embeddings, embedding_dim, "MixedPrecisionEmbedding")
        table = EmbeddingTable(rows, width, spec, stream=0, store_path=store_path)
        table.init_normal(init_std, seed)
        self.group = TableGroup([table], seed)
        self.num_embeddings, self.embedding_dim, self.spec = num_embeddings, embedding_dim, spec
        self.frozen = False

    @classmethod
    def from_float(
        cls, weight: torch.Tensor, spec: TableSpec, seed: int = 0, store_path: str | None = None
    ) -> MixedPrecisionEmbedding:
        """Quantize float32[R, D] weights (e.g. ``nn.EmbeddingBag.weight``) into a new table."""
        emb = cls(weight.shape[0], weight.shape[1], spec, seed, 0.0, store_path)
        emb.group.tables[0].load_float(weight.detach())
        return emb

    def forward(
        self, ids: torch.Tensor, offsets: torch.Tensor | None = None, pooling: str = "sum"
    ) -> torch.Tensor:
        """Look up and optionally pool.

        Args:
            ids: int64[N] row ids.
            offsets: int64[B + 1] bag starts plus N, or None for no pooling.
            pooling: ``sum | mean`` (empty bags give zeros).

        Returns:
            float32[B, D] or float32[N, D].

        """
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is not one of {list(POOLINGS)}")
        values = self.group(ids.reshape(-1, 1), train=self.training and not self.frozen)[:, 0]
        if offsets is None:
            return values
        offsets = offsets.to(torch.int64)
        if offsets.dim() != 1 or offsets.numel() < 1 or int(offsets[-1]) != ids.numel():
            raise ValueError(f"offsets must be int64[B + 1] ending at N={ids.numel()}")
        counts = offsets.diff()
        bags = torch.repeat_interleave(torch.arange(counts.numel()), counts)
        pooled = values.new_zeros(counts.numel(), self.embedding_dim).index_add(0, bags, values)
        if pooling == "mean":
            pooled = pooled / counts.clamp(min=1).to(pooled.dtype)[:, None]
        return pooled

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Current float32[n, D] values of rows ``ids`` int64[n] (cache if cached, else store)."""
        return self.group.dequantize_rows(0, ids)

    def memory_report(self) -> dict:
        """Byte report (see ``MixedPrecisionEmbeddingCollection.memory_report``)."""
        return self.group.memory_report()

    def cache_stats(self) -> dict[str, float]:
        """Cache statistics (``hit_rate``, ``evictions``, ...)."""
        return self.group.cache_stats()
