"""Stored precision of exported vectors: FP32, FP16 or 8-bit codes (FAISS ``SQ8`` layout).

``int8`` stores ``uint8[n, d]`` codes plus the quantizer's per-dimension ``[vmin, vdiff]``
(``float32[2 * d]``), exactly FAISS's ``ScalarQuantizer(d, QT_8bit)``, so the ``.npy`` files
and an ``SQ8`` index decode to the same vectors.
"""

from __future__ import annotations

import faiss
import numpy as np

from ssl_rec.evaluation.faiss_index import check_precision

NPY_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.uint8}


def _sq8(dim: int) -> faiss.ScalarQuantizer:
    return faiss.ScalarQuantizer(dim, faiss.ScalarQuantizer.QT_8bit)


def encode_vectors(vectors: np.ndarray, precision: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Encode ``float32[n, d]`` vectors for storage.

    Args:
        vectors: ``float32[n, d]``.
        precision: ``fp32``, ``fp16`` or ``int8``.

    Returns:
        ``(codes, params)``: ``codes`` is ``float32|float16|uint8[n, d]``; ``params`` is the
        ``float32[2 * d]`` quantizer state for ``int8``, else ``None``.

    """
    check_precision(precision)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if precision != "int8":
        return vectors.astype(NPY_DTYPES[precision]), None
    sq = _sq8(vectors.shape[1])
    sq.train(vectors)
    return sq.compute_codes(vectors), faiss.vector_to_array(sq.trained).astype(np.float32)


def decode_vectors(codes: np.ndarray, precision: str, params: np.ndarray | None) -> np.ndarray:
    """Inverse of :func:`encode_vectors`: ``float32[n, d]``."""
    check_precision(precision)
    if codes.dtype != NPY_DTYPES[precision]:
        raise ValueError(
            f"stored vectors have dtype {codes.dtype}, expected {np.dtype(NPY_DTYPES[precision])} "
            f"for precision {precision!r}"
        )
    if precision != "int8":
        return codes.astype(np.float32)
    dim = codes.shape[1]
    if params is None or params.shape != (2 * dim,):
        raise ValueError(
            f"int8 vectors need quantizer params float32[{2 * dim}], got "
            f"{None if params is None else params.shape}"
        )
    sq = _sq8(dim)
    faiss.copy_array_to_vector(np.ascontiguousarray(params, np.float32), sq.trained)
    return sq.decode(np.ascontiguousarray(codes))
