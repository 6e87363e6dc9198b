"""The kernels the embedding benchmarks compare (ids, lookups, training steps) and their
timing protocol (malloc settings, warm-up, rotated rounds, median of per-round ratios).

Every training step takes a batch dict from :func:`make_batch` and runs forward + backward of
26 tables with the optimizer fused or applied, so a step of one library and a step of the
other do the same work: look up B x 26 rows, apply the same optimizer to the touched rows.
Used by ``embedding.py``, ``embedding_table_size.py``, ``embedding_conditions.py`` and
``kernel_ab.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from ssl_rec.hardware import MixedPrecisionEmbeddingCollection, TableSpec, quantize_rows
from ssl_rec.hardware.freed_memory import MALLOC_ENV  # what the ssl-rec command asks for

DIM = 64
LR = 0.05
SKEWS = ("criteo", "uniform")
NUM_BATCHES = 8
THP_ENV = "THP_MEM_ALLOC_ENABLE"
OURS = {
    "int8_cache5": lambda opt: TableSpec("int8", 0.05, optimizer=opt),
    "int4_cache1": lambda opt: TableSpec("int4", 0.01, optimizer=opt),
    "fp32": lambda opt: TableSpec("fp32", optimizer=opt),
}
OPTIMIZERS = ("sgd", "rowwise_adagrad")

Step = Callable[[dict[str, torch.Tensor]], None]


def reexec_with_memory_env(all_huge_pages: bool) -> None:
    """Restart once with ``MALLOC_ENV`` (glibc reads it at start-up, and otherwise returns
    large freed outputs to the OS and pays page faults on the next call) and, with
    ``all_huge_pages``, ``THP_MEM_ALLOC_ENABLE=1``: PyTorch then asks for huge pages for every
    allocation of 2 MiB or more, FBGEMM's tables, gradients and outputs included."""
    env = {**MALLOC_ENV, **({THP_ENV: "1"} if all_huge_pages else {})}
    if all(os.environ.get(k) == v for k, v in env.items()) and (
        all_huge_pages or THP_ENV not in os.environ
    ):
        return
    base = {k: v for k, v in os.environ.items() if k != THP_ENV}
    os.execve(sys.executable, [sys.executable, *sys.argv], {**base, **env})


def timed_rounds(
    fns: dict[str, Callable[[], object]], rounds: int, warmup: int = NUM_BATCHES + 1
) -> dict[str, list[float]]:
    """Seconds per call: ``warmup`` calls per kernel, then ``rounds`` rotated rounds."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median_ratio(times: dict[str, list[float]], base: str, ours: str) -> float:
    """Median over rounds of ``time[base] / time[ours]`` (> 1: ours is faster)."""
    return statistics.median(b / o for b, o in zip(times[base], times[ours], strict=True))


class Cycle:
    """Calls ``step(batch)`` (or ``step(batch, next batch)``) cycling over fixed batches."""

    def __init__(self, step: Callable, batches: list[dict], pairs: bool = False) -> None:
        self.step, self.batches, self.pairs, self.i = step, batches, pairs, 0

    def __call__(self) -> None:
        n = len(self.batches)
        b = self.batches[self.i % n]
        self.step(b, self.batches[(self.i + 1) % n]) if self.pairs else self.step(b)
        self.i += 1


def hit_rates(colls: dict, before: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Hit rate of each cached collection over the calls since ``before``."""
    out = {}
    for name, emb in colls.items():
        s = emb.cache_stats()
        hits, misses = s["hits"] - before[name][0], s["misses"] - before[name][1]
        if hits + misses:
            out[name] = hits / (hits + misses)
    return out


def counters(colls: dict) -> dict[str, tuple[float, float]]:
    """(hits, misses) of every collection now."""
    return {n: (e.cache_stats()["hits"], e.cache_stats()["misses"]) for n, e in colls.items()}


def make_ids(cards: list[int], batch: int, seed: int, skew: str) -> torch.Tensor:
    """int64[B, F] ids: ``criteo`` = Zipf(1.1) ranks scattered by a multiplicative hash (a
    hot head and a long tail, as Criteo's categorical fields), ``uniform`` = every row
    equally likely (the cache holds only its fraction of the lookups: a low hit rate)."""
    rng = np.random.default_rng(seed)
    if skew == "uniform":
        return torch.from_numpy(rng.integers(0, np.asarray(cards), size=(batch, len(cards))))
    ranks = rng.zipf(1.1, size=(batch, len(cards))) - 1
    return torch.from_numpy(((ranks * 2654435761) % np.asarray(cards)).astype(np.int64))


def make_batch(cards: list[int], batch: int, seed: int, skew: str) -> dict[str, torch.Tensor]:
    """Ids and output gradient, in this library's and in fbgemm_gpu TBE's layouts."""
    ids = make_ids(cards, batch, seed, skew)
    grad = torch.randn(batch, len(cards), DIM, generator=torch.Generator().manual_seed(seed))
    grad = grad * 1e-3
    flat = ids.t().contiguous().flatten()  # TBE: table-major indices, one id per bag
    return {
        "ids": ids,
        "grad": grad,
        "flat": flat,
        "offs": torch.arange(flat.numel() + 1),
        "gflat": grad.reshape(batch, -1),
    }


def ours_step(cards: list[int], spec: TableSpec) -> tuple[Step, MixedPrecisionEmbeddingCollection]:
    """This library's training step: fused admission + lookup, fused optimizer in backward."""
    emb = MixedPrecisionEmbeddingCollection(cards, DIM, spec, seed=0).train()

    def step(b: dict[str, torch.Tensor]) -> None:
        emb(b["ids"]).backward(b["grad"])

    return step, emb


def eval_step(emb: MixedPrecisionEmbeddingCollection) -> Step:
    """This library's validation lookup: no admission, no autograd, nothing written."""

    def step(b: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            emb(b["ids"])

    return step


def embedding_bag_step(cards: list[int]) -> Step:
    """26 nn.EmbeddingBag(sparse=True) + torch.optim.SGD: forward, backward, step."""
    bags = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(c, DIM, mode="sum", sparse=True) for c in cards
    )
    opt = torch.optim.SGD(bags.parameters(), lr=LR)

    def step(b: dict[str, torch.Tensor]) -> None:
        ids = b["ids"]
        offsets = torch.arange(ids.shape[0])
        outs = [bag(ids[:, f], offsets) for f, bag in enumerate(bags)]
        torch.autograd.backward(outs, list(b["grad"].unbind(1)))
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def fbgemm_modules(cards: list[int]) -> dict[str, torch.nn.Module] | None:
    """fbgemm_gpu TBE: FP32 training (exact SGD, exact row-wise Adagrad) and INT8/INT4
    inference, or None when fbgemm_gpu is not installed.

    The training tables are filled with random rows before timing, like this library's: a
    TBE allocates zeroed tables, whose untouched pages would read as one shared zero page.
    """
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
            PoolingMode,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
            IntNBitTableBatchedEmbeddingBagsCodegen,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )
    except Exception:  # noqa: BLE001 - optional comparison
        return None
    out: dict[str, torch.nn.Module] = {}
    for name, opt in (
        ("sgd", EmbOptimType.EXACT_SGD),
        ("rowwise_adagrad", EmbOptimType.EXACT_ROWWISE_ADAGRAD),
    ):
        specs = [(c, DIM, EmbeddingLocation.HOST, ComputeDevice.CPU) for c in cards]
        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            specs, optimizer=opt, learning_rate=LR, pooling_mode=PoolingMode.SUM
        )
        tbe.init_embedding_weights_uniform(-0.05, 0.05)
        out[f"train_{name}"] = tbe
    for bits, st in ((8, SparseType.INT8), (4, SparseType.INT4)):
        tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
            [("", c, DIM, st, EmbeddingLocation.HOST) for c in cards],
            device="cpu",
            pooling_mode=PoolingMode.SUM,
        )
        tbe.fill_random_weights()
        out[f"int{bits}"] = tbe
    return out


def tbe_step(tbe: torch.nn.Module) -> Step:
    """A TBE training step: pooled forward (bags of one id), backward with fused optimizer."""

    def step(b: dict[str, torch.Tensor]) -> None:
        tbe(b["flat"], b["offs"]).backward(b["gflat"])

    return step


def lookup_fns(cards: list[int], ids: torch.Tensor, kernels, fb) -> dict[str, Callable]:
    """Inference lookups of every table, ours vs torch.ops.quantized vs TBE IntNBit.

    Each kernel reads its own copy of the stores: on shared stores the kernel timed second
    finds the rows the first just brought into the CPU caches (same ids).
    """
    fns: dict[str, Callable] = {}
    offsets = torch.arange(ids.shape[0] + 1)
    cols = [ids[:, f].contiguous() for f in range(len(cards))]
    for bits, op in (
        (8, torch.ops.quantized.embedding_bag_byte_rowwise_offsets),
        (4, torch.ops.quantized.embedding_bag_4bit_rowwise_offsets),
    ):
        gen = torch.Generator().manual_seed(bits)
        stores = [
            quantize_rows(torch.randn(c, DIM, generator=gen) * 0.05, f"int{bits}") for c in cards
        ]
        copies = [s.clone() for s in stores]
        fns[f"int{bits}_ours"] = lambda s=stores, b=bits: [
            kernels.bag_lookup(t, b, c, offsets, DIM) for t, c in zip(s, cols, strict=True)
        ]
        fns[f"int{bits}_torch_fbgemm"] = lambda s=copies, o=op: [
            o(t, c, offsets[:-1]) for t, c in zip(s, cols, strict=True)
        ]
    if fb:
        flat = ids.t().contiguous().flatten().int()
        offs = torch.arange(flat.numel() + 1, dtype=torch.int32)
        fns["int8_fbgemm_tbe"] = lambda: fb["int8"](flat, offs)
        fns["int4_fbgemm_tbe"] = lambda: fb["int4"](flat, offs)
    return fns


class DenseStep:
    """Embedding lookup + a DLRM-sized MLP, forward and backward, with the next batch's
    admission not prefetched, prefetched inline, or prefetched on the helper thread."""

    def __init__(self, cards: list[int], spec: TableSpec, mode: str) -> None:
        self.emb = MixedPrecisionEmbeddingCollection(cards, DIM, spec, seed=0).train()
        torch.manual_seed(0)
        width = len(cards) * DIM
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512),
            torch.nn.ReLU(), torch.nn.Linear(512, 1),
        )  # fmt: skip
        self.mode = mode

    def __call__(self, b: dict[str, torch.Tensor], nxt: dict[str, torch.Tensor]) -> None:
        if self.mode != "none":
            self.emb.prefetch_next(nxt["ids"], background=self.mode == "background")
        out = self.mlp(self.emb(b["ids"]).flatten(1))
        out.sum().backward()
        self.mlp.zero_grad(set_to_none=True)
