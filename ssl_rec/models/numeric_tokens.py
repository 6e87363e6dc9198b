"""Dense columns embedded as ``D``-dim tokens, so the encoder sees them like categorical fields.

Gorishniy et al., "On Embeddings for Numerical Features in Tabular Deep Learning", NeurIPS
2022, https://arxiv.org/abs/2203.05556: piecewise-linear encoding over quantile bins (Section
3.2, "PLE") and periodic features ``[cos(2 pi c x), sin(2 pi c x)]`` followed by a linear layer
and a ReLU (Section 3.3, "PLR"), each column with its own weights. The tokenizer reads the
*standardized* values (``(x - mean) / std``), and its bin edges are the training split's
quantile edges in that space, so the bins are the data's and travel with the weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ssl_rec.vocab import DenseStatistics

TOKEN_ENCODINGS = ("quantile_tokens", "periodic_tokens")
# Edges until statistics are set: even bins over +-3 standard deviations.
_DEFAULT_SPAN = 3.0
_MIN_WIDTH = 1e-9


def is_token_encoding(encoding: str) -> bool:
    """Whether ``encoding`` turns the dense columns into tokens."""
    return encoding in TOKEN_ENCODINGS


def piecewise_linear_encoding(x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """PLE of ``x float32[B, n]`` over ``edges float32[n, T + 1]``: ``float32[B, n, T]``.

    Component ``t`` is 0 left of bin ``t``, 1 right of it and linear inside; a bin of zero
    width (a frequent value repeats an edge) is a step at that value. Values beyond the
    training range saturate at the first or last bin (no extrapolation of outliers).
    """
    left, right = edges[:, :-1], edges[:, 1:]
    width = right - left
    ratio = (x.unsqueeze(-1) - left) / width.clamp_min(_MIN_WIDTH)
    step = (x.unsqueeze(-1) >= right).to(x.dtype)
    return torch.where(width > _MIN_WIDTH, ratio.clamp(0.0, 1.0), step)


def quantile_bin_ids(x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Quantile bin of each value: ``int64[B, n]`` in ``0..T-1`` (``edges [n, T + 1]``).

    Bin ``t`` holds ``edges[t] <= x < edges[t + 1]``; values below the first edge fall in
    bin 0, values at or above the last in bin ``T - 1``.
    """
    inner = edges[:, 1:-1]
    bins = (x.unsqueeze(-1) >= inner).sum(-1)
    return bins.clamp(0, edges.shape[1] - 2)


class NumericTokenizer(nn.Module):
    """``n`` standardized dense columns to ``n`` tokens of width ``D``, with ``[MASK]`` tokens.

    Args:
        n_dense: number of dense columns ``n``.
        embedding_dim: ``D``.
        kind: ``"quantile_tokens"`` (PLE over ``bins`` quantile bins, then a per-column
            linear map ``T -> D``) or ``"periodic_tokens"`` (``frequencies`` learned
            frequencies per column, cos/sin, a per-column linear map ``2k -> D``, ReLU).
        bins: quantile bins ``T`` per column (the statistics' bins replace it when set).
        frequencies: ``k`` of the periodic encoding.
        sigma: standard deviation of the periodic frequencies' initialisation.
        seed: initialisation seed.

    Shape:
        ``forward(standardized float32[B, n], mask bool[B, n] | None) -> float32[B, n, D]``.

    Example:
        >>> tok = NumericTokenizer(2, 8, "quantile_tokens", bins=4)
        >>> tok(torch.randn(5, 2)).shape
        torch.Size([5, 2, 8])

    """

    def __init__(
        self,
        n_dense: int,
        embedding_dim: int,
        kind: str = "quantile_tokens",
        bins: int = 32,
        frequencies: int = 16,
        sigma: float = 0.5,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if kind not in TOKEN_ENCODINGS:
            raise ValueError(f"numeric tokens must be one of {list(TOKEN_ENCODINGS)}, got {kind!r}")
        if bins < 1 or frequencies < 1:
            raise ValueError(f"need bins >= 1 and frequencies >= 1, got {bins}, {frequencies}")
        self.kind = kind
        gen = torch.Generator().manual_seed(seed)
        edges = torch.linspace(-_DEFAULT_SPAN, _DEFAULT_SPAN, bins + 1).expand(n_dense, -1)
        self.register_buffer("edges", edges.clone())
        width = bins if kind == "quantile_tokens" else 2 * frequencies
        bound = 1.0 / math.sqrt(width)
        weight = torch.rand(n_dense, width, embedding_dim, generator=gen) * 2 - 1
        self.weight = nn.Parameter(weight * bound)
        bias = torch.rand(n_dense, embedding_dim, generator=gen) * 2 - 1
        self.bias = nn.Parameter(bias * bound)
        if kind == "periodic_tokens":
            self.frequency = nn.Parameter(torch.randn(n_dense, frequencies, generator=gen) * sigma)
        self.mask_token = nn.Parameter(torch.randn(n_dense, embedding_dim, generator=gen) * 0.01)

    @property
    def n_dense(self) -> int:
        """Number of columns ``n``."""
        return int(self.edges.shape[0])

    @property
    def bins(self) -> int:
        """Quantile bins ``T`` per column (the classes of :meth:`bin_ids`)."""
        return int(self.edges.shape[1]) - 1

    def set_statistics(self, statistics: DenseStatistics, std: torch.Tensor) -> None:
        """Take the training quantile edges, standardized with ``mean`` and ``std`` (``[n]``).

        Raises:
            ValueError: when the statistics have another number of bins than this tokenizer
                was built with (its weights' shape depends on it).

        """
        if statistics.bins != self.bins:
            raise ValueError(
                f"dense statistics have {statistics.bins} quantile bins, the numeric tokens "
                f"{self.bins}"
            )
        edges = torch.as_tensor(statistics.quantile_edges, dtype=torch.float32)
        mean = torch.as_tensor(statistics.mean, dtype=torch.float32)
        self.edges.copy_((edges - mean[:, None]) / std.to(torch.float32)[:, None])

    def bin_ids(self, standardized: torch.Tensor) -> torch.Tensor:
        """``int64[B, n]`` quantile bin of each standardized value (masked-token targets)."""
        return quantile_bin_ids(standardized, self.edges.to(standardized.dtype))

    def forward(self, standardized: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Tokens ``float32[B, n, D]``; the ``[MASK]`` token of the column where ``mask``."""
        if self.kind == "quantile_tokens":
            features = piecewise_linear_encoding(standardized, self.edges.to(standardized.dtype))
        else:
            angle = 2 * math.pi * standardized.unsqueeze(-1) * self.frequency
            features = torch.cat([torch.cos(angle), torch.sin(angle)], dim=-1)
        tokens = torch.einsum("bnw,nwd->bnd", features, self.weight) + self.bias
        if self.kind == "periodic_tokens":
            tokens = torch.relu(tokens)
        if mask is not None:
            tokens = torch.where(mask.unsqueeze(-1), self.mask_token.to(tokens.dtype), tokens)
        return tokens

    def extra_repr(self) -> str:
        """``n_dense=…, kind=…, bins=…``."""
        return f"n_dense={self.n_dense}, kind={self.kind!r}, bins={self.bins}"


class TokenEncoder(nn.Module):
    """The numeric tokenizer and the interaction encoder as one module (momentum copies).

    Takes what the plain encoder takes, ``(field_emb float32[B, F, D], standardized dense
    float32[B, n])`` and an optional ``numeric_mask bool[B, n]``, and appends the dense
    columns' tokens before encoding.

    Args:
        tokenizer: a :class:`NumericTokenizer`.
        encoder: an encoder built for ``F + n`` tokens and no dense input.

    """

    def __init__(self, tokenizer: NumericTokenizer, encoder: nn.Module) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.output_dim = int(encoder.output_dim)

    def forward(
        self,
        field_emb: torch.Tensor,
        standardized: torch.Tensor,
        numeric_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(pooled float32[B, H], dense_emb)``; ``[MASK]`` where ``numeric_mask bool[B, n]``."""
        numeric = self.tokenizer(standardized, numeric_mask).to(field_emb.dtype)
        tokens = torch.cat([field_emb, numeric], dim=1)
        return self.encoder(tokens, standardized[:, :0])
