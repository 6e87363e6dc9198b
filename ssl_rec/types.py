"""Typed contracts passed between the rooms of the package.

Shapes use ``B`` for batch size, ``F`` for categorical fields, ``n_dense`` for dense
columns, ``D`` for the embedding dimension and ``H`` for the pooled representation size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class Batch:
    """One mini-batch of Criteo-style rows.

    Args:
        dense: ``float32[B, n_dense]`` preprocessed dense features (``log1p`` of counts).
        sparse: ``int64[B, F]`` one id per categorical field, already mapped to
            ``0..cardinality-1``; id 0 is reserved for missing or out-of-vocabulary values.
        label: ``float32[B]`` click labels in {0, 1}, or ``None`` for unlabeled data.
        row_id: ``int64[B]`` position of each row in its split, or ``None``.

    Example:
        >>> b = Batch(torch.zeros(2, 13), torch.zeros(2, 26, dtype=torch.long))
        >>> b.batch_size
        2

    """

    dense: torch.Tensor
    sparse: torch.Tensor
    label: torch.Tensor | None = None
    row_id: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        """Number of rows ``B``."""
        return int(self.sparse.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Return a copy with every tensor moved to ``device``."""

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return Batch(move(self.dense), move(self.sparse), move(self.label), move(self.row_id))

    def head(self, n: int) -> Batch:
        """The first ``n`` rows (all rows when ``n >= B``); views, not copies."""
        if n >= self.batch_size:
            return self

        def cut(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[:n]

        return Batch(self.dense[:n], self.sparse[:n], cut(self.label), cut(self.row_id))

    def with_features(
        self, dense: torch.Tensor | None = None, sparse: torch.Tensor | None = None
    ) -> Batch:
        """Return a copy whose dense and/or sparse features are replaced (labels kept)."""
        return replace(
            self,
            dense=self.dense if dense is None else dense,
            sparse=self.sparse if sparse is None else sparse,
        )


@dataclass(frozen=True)
class Representation:
    """What a backbone computes for a batch.

    Args:
        field_emb: ``float32[B, F, D]`` per-field token embeddings (after masking), used by
            generative and adversarial objectives.
        pooled: ``float32[B, H]`` one vector per row, used by contrastive objectives, heads
            and FAISS.
        dense_emb: ``float32[B, D]`` the dense features' embedding (DLRM bottom MLP), or
            ``None`` when the encoder has none.

    """

    field_emb: torch.Tensor
    pooled: torch.Tensor
    dense_emb: torch.Tensor | None = None


@dataclass(frozen=True)
class ObjectiveOutput:
    """A loss and the scalars an objective wants logged.

    Args:
        loss: scalar ``float32[]`` tensor to minimise (already weighted by nothing; the
            caller applies objective weights).
        logs: name -> scalar tensor or float; the LightningModule logs them as
            ``{stage}/{objective}/{name}``.

    """

    loss: torch.Tensor
    logs: dict[str, torch.Tensor | float] = field(default_factory=dict)
