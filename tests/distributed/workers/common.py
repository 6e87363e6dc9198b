"""Shared pieces of the torchrun workers: synthetic data, the CTR model, result lines."""

from __future__ import annotations

import json
import os
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from ssl_rec.data.sources.synthetic_clicks import SyntheticClickModel, SyntheticConfig
from ssl_rec.hardware import TableSpec
from ssl_rec.lightning import CTRModule
from ssl_rec.models import Backbone
from ssl_rec.schema import CRITEO_CATEGORICAL, CRITEO_DENSE, CategoricalField, FeatureSchema
from ssl_rec.types import Batch

SPECS = {
    "int8_cache5": TableSpec("int8", 0.05, "lru", "rowwise_adagrad", 0.05),
    "fp32": TableSpec("fp32", optimizer="rowwise_adagrad", learning_rate=0.05),
}
TABLES_PATH = "backbone.embedding.tables"


def data(split: str, rows: int, scale: float = 0.001) -> tuple[FeatureSchema, Batch]:
    """``rows`` synthetic rows of ``split`` as one Batch (log1p counts, as the data modules)."""
    gen = SyntheticClickModel(SyntheticConfig(seed=0, cardinality_scale=scale))
    block = gen.rows(split, 0, rows)
    fields = [CategoricalField(n, c) for n, c in zip(CRITEO_CATEGORICAL, gen.cardinalities,
                                                     strict=True)]  # fmt: skip
    schema = FeatureSchema(list(CRITEO_DENSE), fields, "label")
    batch = Batch(
        dense=torch.from_numpy(np.log1p(block.dense).astype(np.float32)),
        sparse=torch.from_numpy(block.sparse.astype(np.int64)),
        label=torch.from_numpy(block.label.astype(np.float32)),
    )
    return schema, batch


def model(schema: FeatureSchema, spec: TableSpec) -> CTRModule:
    """The DLRM CTR model of configs/common/backbone/dlrm.yaml, same weights on every rank."""
    torch.manual_seed(0)
    return CTRModule(partial(Backbone, embedding_dim=16, tables=spec), schema.to_dict())


def part(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``start:stop`` of a batch."""
    return Batch(dense=batch.dense[start:stop], sparse=batch.sparse[start:stop],
                 label=batch.label[start:stop])  # fmt: skip


def report(**result) -> None:
    """Print one ``RESULT {json}`` line (rank 0 only); tests read these, not the exit code."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)


def finish() -> None:
    """Leave without the interpreter's teardown, whose rare abort would follow the result."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)


def vm_data() -> int:
    """This process's data segment in bytes (``VmData``: what ``RLIMIT_DATA`` limits)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")
