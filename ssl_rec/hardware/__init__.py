"""Low-precision cached embeddings: formats, stochastic rounding, row cache, fused kernels.

Tables are stored row-wise quantized (FBGEMM fused rows) or in fp16/bf16, the hot rows are
trained in an FP32 cache, and the optimizer step is fused into the embedding backward.
"""

from ssl_rec.hardware.collection import MixedPrecisionEmbeddingCollection
from ssl_rec.hardware.embedding import MixedPrecisionEmbedding
from ssl_rec.hardware.inference import quantized_bag_lookup, serving_kernels, uncached_tables
from ssl_rec.hardware.memory import estimate_memory
from ssl_rec.hardware.precision import Precision
from ssl_rec.hardware.quantization import dequantize_rows, quantize_rows
from ssl_rec.hardware.spec import OPTIMIZERS, POLICIES, TableSpec
from ssl_rec.hardware.table_allocation import TableMemoryError, declare_tables

__all__ = [
    "OPTIMIZERS",
    "POLICIES",
    "Precision",
    "MixedPrecisionEmbedding",
    "MixedPrecisionEmbeddingCollection",
    "TableMemoryError",
    "TableSpec",
    "declare_tables",
    "dequantize_rows",
    "estimate_memory",
    "quantize_rows",
    "quantized_bag_lookup",
    "serving_kernels",
    "uncached_tables",
]
