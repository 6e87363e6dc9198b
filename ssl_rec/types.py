"""Typed contracts passed between the rooms of the package.

Shapes use ``B`` for batch size, ``F`` for categorical fields, ``n_dense`` for dense
columns, ``D`` for the embedding dimension and ``H`` for the pooled representation size.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from ssl_rec.schema import FeatureSchema

if TYPE_CHECKING:
    from ssl_rec.vocab import Vocabularies


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

    def rows(self, index: torch.Tensor) -> Batch:
        """The rows ``index int64[k]`` (or ``bool[B]``), labels and row ids included; copies."""

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[index]

        return Batch(self.dense[index], self.sparse[index], take(self.label), take(self.row_id))

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
        numeric_emb: ``float32[B, F_num, D]`` the dense columns' tokens (after masking) when
            the backbone embeds them (``dims.n_numeric_tokens > 0``), else ``None``.

    """

    field_emb: torch.Tensor
    pooled: torch.Tensor
    dense_emb: torch.Tensor | None = None
    numeric_emb: torch.Tensor | None = None


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


@dataclass(frozen=True)
class BackboneDims:
    """The sizes a backbone gives the heads and objectives built on it.

    Args:
        n_fields: categorical fields ``F``.
        n_dense: dense columns ``n_dense`` of a batch (``batch.dense``'s width).
        embedding_dim: ``D`` of every field token.
        output_dim: ``H`` of the pooled vector.
        cardinalities: ids per field (including the reserved id 0), length ``F``.
        n_numeric_tokens: ``F_num``, dense columns the backbone embeds as tokens (0, or
            ``n_dense`` with a token ``dense_encoding``); the encoder sees ``n_tokens``.
        numeric_bins: classes of a numeric token's target (:meth:`BackboneProtocol.dense_bins`),
            0 without numeric tokens.

    """

    n_fields: int
    n_dense: int
    embedding_dim: int
    output_dim: int
    cardinalities: tuple[int, ...]
    n_numeric_tokens: int = 0
    numeric_bins: int = 0

    @property
    def n_tokens(self) -> int:
        """Tokens the encoder sees: ``F + F_num``."""
        return self.n_fields + self.n_numeric_tokens


@runtime_checkable
class EncoderProtocol(Protocol):
    """An interaction encoder: field tokens and dense features to one pooled vector.

    ``forward(field_emb float32[B, F, D], dense float32[B, n_dense])`` returns
    ``(pooled float32[B, H], dense_emb float32[B, D] | None)``; ``output_dim`` is ``H``.
    """

    output_dim: int

    def __call__(
        self, field_emb: torch.Tensor, dense: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Encode one batch."""
        ...


@runtime_checkable
class BackboneProtocol(Protocol):
    """What objectives, views, probes and exports may use of a backbone.

    ``embed`` looks ids up (``[MASK]`` tokens where ``field_mask`` is set), ``encode`` runs the
    interaction encoder, calling the backbone does both; ``entity_vectors`` reads table rows
    and ``vocabulary`` says which raw value each row stands for;
    ``clone_encoder`` / ``update_encoder_copy`` keep a momentum copy of the encoder, which
    takes dense values as ``standardize_dense`` returns them (``encode`` and calling the
    backbone take the preprocessed values and standardize them).
    """

    schema: FeatureSchema

    @property
    def dims(self) -> BackboneDims:
        """Sizes of the fields, tokens and pooled vector."""
        ...

    def __call__(self, batch: Batch, field_mask: torch.Tensor | None = None) -> Representation:
        """Embed and encode a batch (``field_mask bool[B, F]`` or ``[B, F + F_num]``: to hide)."""
        ...

    def embed(self, sparse: torch.Tensor, field_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``int64[B, F]`` ids to ``float32[B, F, D]`` tokens."""
        ...

    def encode(
        self,
        field_emb: torch.Tensor,
        dense: torch.Tensor,
        numeric_emb: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens and dense features to ``(pooled [B, H], dense_emb [B, D] | None)``.

        ``numeric_emb [B, F_num, D]``: the dense columns' tokens (``embed_dense``'s by default).
        """
        ...

    def embed_dense(
        self, dense: torch.Tensor, numeric_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``float32[B, n_dense]`` to numeric tokens ``float32[B, F_num, D]`` ([MASK] if masked)."""
        ...

    def dense_bins(self, dense: torch.Tensor) -> torch.Tensor:
        """``int64[B, F_num]`` quantile bins of the tokenized columns (masked-token targets)."""
        ...

    def entity_vectors(self, field: str, ids: torch.Tensor) -> torch.Tensor:
        """Table rows ``float32[n, D]`` of ``ids int64[n]`` of ``field``."""
        ...

    @property
    def vocabulary(self) -> Vocabularies | None:
        """What each id of each field means (the data's vocabularies), or ``None``."""
        ...

    def standardize_dense(self, dense: torch.Tensor) -> torch.Tensor:
        """Preprocessed ``float32[B, n_dense]`` -> the standardized values the encoder sees."""
        ...

    def unstandardize_dense(self, standardized: torch.Tensor) -> torch.Tensor:
        """Inverse of ``standardize_dense``."""
        ...

    def clone_encoder(self) -> torch.nn.Module:
        """A frozen copy of the encoder."""
        ...

    def update_encoder_copy(self, target: torch.nn.Module, momentum: float) -> None:
        """Move a ``clone_encoder`` copy towards the encoder (EMA)."""
        ...
