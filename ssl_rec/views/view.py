"""A view: field masking + corruptions + embedding dropout, encoded by the backbone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ssl_rec._checks import check_rate
from ssl_rec._config import RecordsConfig
from ssl_rec.types import BackboneProtocol, Batch, Representation


@dataclass(frozen=True)
class ViewOutput:
    """One encoded view of a batch.

    Args:
        rep: the backbone's :class:`Representation` of the corrupted batch.
        batch: the corrupted batch that was encoded.
        field_mask: ``bool[B, F]`` fields replaced by ``[MASK]`` tokens (all False if no mask).
        numeric_mask: ``bool[B, F_num]`` numeric tokens replaced by ``[MASK]`` tokens (``F_num
            = 0`` unless the backbone embeds its dense columns as tokens).

    """

    rep: Representation
    batch: Batch
    field_mask: torch.Tensor
    numeric_mask: torch.Tensor | None = None


class View(RecordsConfig, nn.Module):
    """Random augmentation of a batch, applied inside the model step and seeded.

    Order: corruptions (id dropout, swaps, dense noise) on the raw batch, then the field
    mask (``[MASK]`` tokens in the backbone's embedding), then element-wise dropout on
    the field embeddings before the encoder. A backbone that embeds its dense columns as
    tokens (``dims.n_numeric_tokens > 0``) has them masked like fields, by the same masker
    over ``F + F_num`` columns (the columns' quantile bins stand in for their ids), unless
    ``mask_numeric`` is off.

    Args:
        masking: a field masker ``(sparse int64[B, F], rng) -> bool[B, F]`` such as
            :class:`RandomFieldMask` or :class:`CorrelatedFieldMask`, or ``None``.
        corruptions: batch corruptions applied in order (:class:`IdDropout`,
            :class:`FeatureSwap`, :class:`DenseNoise`).
        embedding_dropout: dropout probability on ``field_emb`` entries, in [0, 1).
        seed: seed of this view's ``torch.Generator`` (views are reproducible run to run).
        mask_numeric: mask numeric tokens too (backbones with a token ``dense_encoding``).

    Example:
        >>> from ssl_rec.models import Backbone
        >>> from ssl_rec.schema import CategoricalField, FeatureSchema
        >>> from ssl_rec.views import IdDropout, RandomFieldMask
        >>> fields = [CategoricalField("user", 10), CategoricalField("item", 20)]
        >>> backbone = Backbone(FeatureSchema(["price"], fields, "label"), embedding_dim=8)
        >>> batch = Batch(torch.rand(4, 1), torch.randint(1, 10, (4, 2)), torch.zeros(4))
        >>> view = View(RandomFieldMask(0.3), [IdDropout(0.1)], seed=0)
        >>> out = view(batch, backbone)
        >>> out.field_mask.shape, out.rep.field_emb.shape
        (torch.Size([4, 2]), torch.Size([4, 2, 8]))

    """

    def __init__(
        self,
        masking: nn.Module | None = None,
        corruptions: Sequence[nn.Module] = (),
        embedding_dropout: float = 0.0,
        seed: int = 0,
        mask_numeric: bool = True,
    ) -> None:
        super().__init__()
        if check_rate("View", "embedding_dropout", embedding_dropout) >= 1.0:
            raise ValueError(f"View.embedding_dropout must be < 1, got {embedding_dropout}")
        self.masking = masking
        self.corruptions = nn.ModuleList(corruptions)
        self.embedding_dropout = float(embedding_dropout)
        self.seed = int(seed)
        self.mask_numeric = bool(mask_numeric)
        self._rng: torch.Generator | None = None

    def rng(self, device: torch.device) -> torch.Generator:
        """Return the view's random stream on ``device`` (created and seeded on first use)."""
        if self._rng is None or self._rng.device != torch.device(device):
            self._rng = torch.Generator(device=device).manual_seed(self.seed)
        return self._rng

    def reseed(self) -> None:
        """Restart the random stream from ``seed`` (the next draws repeat the first ones)."""
        self._rng = None

    def get_extra_state(self) -> dict:
        """The random stream's position, saved in ``state_dict`` so a resumed run continues it."""
        if self._rng is None:
            return {}
        return {"rng": self._rng.get_state(), "device": str(self._rng.device)}

    def set_extra_state(self, state: dict) -> None:
        """Restore :meth:`get_extra_state` (an empty state restarts from ``seed``)."""
        if not state or state.get("rng") is None:
            self._rng = None
            return
        self._rng = torch.Generator(device=state.get("device", "cpu"))
        self._rng.set_state(state["rng"])

    def corrupt(
        self, batch: Batch, backbone: BackboneProtocol | None = None
    ) -> tuple[Batch, torch.Tensor]:
        """Apply the corruptions and draw the field mask: ``(batch', bool[B, F])``.

        Given a ``backbone`` with numeric tokens (and ``mask_numeric``), the mask is
        ``bool[B, F + F_num]``: its last columns mask the numeric tokens.
        """
        gen = self.rng(batch.sparse.device)
        for corruption in self.corruptions:
            batch = corruption(batch, gen)
        ids = batch.sparse
        if backbone is not None and self.mask_numeric and backbone.dims.n_numeric_tokens:
            # Bin ids shifted past 0, the id maskers may treat as "missing".
            ids = torch.cat([ids, backbone.dense_bins(batch.dense) + 1], dim=1)
        if self.masking is None:
            mask = torch.zeros_like(ids, dtype=torch.bool)
        else:
            mask = self.masking(ids, gen)
        return batch, mask

    def forward(self, batch: Batch, backbone: BackboneProtocol) -> ViewOutput:
        """Corrupt ``batch`` and encode it with ``backbone``."""
        batch, mask = self.corrupt(batch, backbone)
        n_fields = batch.sparse.shape[1]
        field_mask, numeric_mask = mask[:, :n_fields], mask[:, n_fields:]
        if self.embedding_dropout == 0.0:
            return ViewOutput(backbone(batch, mask), batch, field_mask, numeric_mask)
        # Dropout sits between the lookup and the encoder, so the view calls the backbone's
        # two stages itself.
        field_emb = self._drop(backbone.embed(batch.sparse, field_mask))
        if not backbone.dims.n_numeric_tokens:
            pooled, dense_emb = backbone.encode(field_emb, batch.dense)
            rep = Representation(field_emb, pooled, dense_emb)
            return ViewOutput(rep, batch, field_mask, numeric_mask)
        numeric_mask = numeric_mask if numeric_mask.shape[1] else None
        numeric_emb = self._drop(backbone.embed_dense(batch.dense, numeric_mask))
        pooled, dense_emb = backbone.encode(field_emb, batch.dense, numeric_emb)
        rep = Representation(field_emb, pooled, dense_emb, numeric_emb)
        if numeric_mask is None:
            numeric_mask = torch.zeros(rep.numeric_emb.shape[:2], dtype=torch.bool,
                                       device=field_emb.device)  # fmt: skip
        return ViewOutput(rep, batch, field_mask, numeric_mask)

    def _drop(self, emb: torch.Tensor) -> torch.Tensor:
        gen = self.rng(emb.device)
        keep = torch.rand(emb.shape, generator=gen, device=emb.device) >= self.embedding_dropout
        return emb * keep / (1.0 - self.embedding_dropout)
