"""Post-training quantization for serving: NE-budget search, numeric debugger, monitor.

A trained CTR model's tables go to INT8/INT4/INT2 fused rows (FP16 when tiny) and its
dense layers to bfloat16, FP16 or INT8 (FBGEMM's dynamic kernel in torch, or torchao),
each unit as low as a greedy sensitivity search allows within a normalized-entropy budget.
See ``docs/inference.md``.
"""

from ssl_rec.quantize.dense import DENSE_PRECISIONS, PrecisionLayer, convert_layer, dense_layers
from ssl_rec.quantize.explain import explain, format_explanation
from ssl_rec.quantize.fbgemm_linear import FbgemmInt8Linear
from ssl_rec.quantize.model import (
    Architecture,
    DenseCTR,
    FloatCTR,
    InferenceCTRModel,
    ModelBuilder,
)
from ssl_rec.quantize.monitor import compare_on_slice, format_comparison
from ssl_rec.quantize.ptq import build_report, quantize_ctr
from ssl_rec.quantize.quantization_plan import QuantizationPlan, Unit
from ssl_rec.quantize.quantized_directory import (
    is_quantized_dir,
    load_quantized,
    read_manifest,
    read_report,
    read_vocabularies,
    save_quantized,
)
from ssl_rec.quantize.scoring import Rows, logits_of, ne_of, pair_agreement, summary, throughput
from ssl_rec.quantize.search import SearchResult, SearchStep, search_plan
from ssl_rec.quantize.tables import QuantizedTables
from ssl_rec.quantize.workflow import (
    check_schema,
    format_summary,
    labeled_rows,
    quantize_to_directory,
)

__all__ = [
    "DENSE_PRECISIONS",
    "Architecture",
    "DenseCTR",
    "FbgemmInt8Linear",
    "FloatCTR",
    "InferenceCTRModel",
    "ModelBuilder",
    "PrecisionLayer",
    "QuantizationPlan",
    "QuantizedTables",
    "Rows",
    "SearchResult",
    "SearchStep",
    "Unit",
    "build_report",
    "check_schema",
    "compare_on_slice",
    "convert_layer",
    "dense_layers",
    "explain",
    "format_comparison",
    "format_explanation",
    "format_summary",
    "is_quantized_dir",
    "labeled_rows",
    "load_quantized",
    "logits_of",
    "ne_of",
    "pair_agreement",
    "quantize_ctr",
    "quantize_to_directory",
    "read_manifest",
    "read_report",
    "read_vocabularies",
    "save_quantized",
    "search_plan",
    "summary",
    "throughput",
]
