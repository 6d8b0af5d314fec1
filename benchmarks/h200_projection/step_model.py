"""Bytes, FLOPs and time of one decode (or verify) step on one GPU.

A step serves a batch made of three kinds of request (``Batch``):
- ``num_dense``: every page in HBM, dense attention over the whole context (the vLLM baseline;
  no digests, no host tier);
- ``num_resident``: every page hot (FULL residency) but attention reads only the selection;
- ``num_sparse``: SPARSE residency, an LRU hot buffer of ``buffer_pages`` slots per request;
  ``1 - hit_rate`` of each step's working-set pages are missing and come over PCIe.

Per step (``q`` = query tokens per request: 1 for decode, ``gamma + 1`` for verify):

    HBM bytes   = weights read once
                + dense KV:  num_dense x context_pages x page_bytes
                + sparse KV: (resident + sparse) x working_set_pages x page_bytes
                + digests:   (resident + sparse) x context_pages x digest_page_bytes
                + writes:    PCIe misses landing in HBM + q new KV rows per request
    FLOPs       = tokens x 2 x params + attention over the context (dense) or each query's own
                  selection (sparse) + digest scoring of every page by every query token
    PCIe bytes  = H2D misses: sparse x working_set_pages x (1 - hit) x page_bytes
                  D2H write-back of committed rows (tau per request per step; not for dense)

``page_bytes`` is one page in all layers; working_set_pages is per layer (the union of the
block's selections: ``ceil(selected_pages x union_factor)``, at most the context), and each
layer's working set is resolved against that layer's hot buffer. A sparse attention kernel reads
each working-set page once per step for all ``q`` query tokens of its request.

    step = (max(hbm, compute, pcie)              if PCIe copies overlap (Hardware.pcie_overlapped)
            max(hbm, compute) + pcie             otherwise) + step overhead
    step x= 1 + drafter overhead fraction        when speculating
    tokens/s = requests x tau / step;  TPOT = step / tau
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from benchmarks.h200_projection.constants import Hardware, Speculation, Workload
from benchmarks.h200_projection.shapes import ModelShape


@dataclass(frozen=True)
class Batch:
    num_dense: int = 0
    num_resident: int = 0
    num_sparse: int = 0
    buffer_pages: int = 0  # hot-buffer slots per SPARSE request
    hit_rate: float = 1.0  # of a SPARSE request's working-set pages, per layer

    @property
    def num_requests(self) -> int:
        return self.num_dense + self.num_resident + self.num_sparse

    @property
    def num_selective(self) -> int:
        """Requests whose attention reads only their selection (and who keep digests)."""
        return self.num_resident + self.num_sparse


@dataclass(frozen=True)
class StepCost:
    weight_bytes: float
    dense_kv_bytes: float
    sparse_kv_bytes: float
    digest_bytes: float
    hbm_write_bytes: float
    pcie_h2d_bytes: float
    pcie_d2h_bytes: float
    flops: float
    hbm_s: float
    compute_s: float
    pcie_s: float
    step_s: float
    tokens_per_step: float
    memory_bytes: float

    @property
    def hbm_read_bytes(self) -> float:
        return self.weight_bytes + self.dense_kv_bytes + self.sparse_kv_bytes + self.digest_bytes

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s if self.tokens_per_step else 0.0

    @property
    def bottleneck(self) -> str:
        return max((("hbm", self.hbm_s), ("compute", self.compute_s), ("pcie", self.pcie_s)), key=lambda kv: kv[1])[0]

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(hbm_read_bytes=self.hbm_read_bytes, tokens_per_s=self.tokens_per_s, bottleneck=self.bottleneck)
        return d


def working_set_pages(wl: Workload, spec: Speculation) -> int:
    """Pages per request per layer one step reads: the union of its query tokens' selections."""
    return min(wl.context_pages, math.ceil(wl.selected_pages * spec.working_set_union_factor))


def pcie_miss_bytes(shape: ModelShape, wl: Workload, num_missed_pages_per_layer: float) -> float:
    """Bytes over PCIe for that many missed pages in every layer (one page-layer = page_size rows)."""
    return num_missed_pages_per_layer * shape.kv_bytes_per_page(wl.page_size)


def memory_bytes(shape: ModelShape, wl: Workload, batch: Batch) -> float:
    """HBM this batch needs: weights, whole KV of dense and FULL requests, the hot buffers of
    SPARSE requests, and the digests of every page of every selective request."""
    page = shape.kv_bytes_per_page(wl.page_size)
    digests = batch.num_selective * wl.context_pages * shape.digest_bytes_per_page(wl.digest_bytes_per_value)
    kv = (batch.num_dense + batch.num_resident) * wl.context_pages * page + batch.num_sparse * batch.buffer_pages * page
    return shape.resident_weight_bytes + kv + digests


def step_cost(shape: ModelShape, hw: Hardware, wl: Workload, spec: Speculation, batch: Batch) -> StepCost:
    q = spec.query_tokens
    tau = spec.acceptance_length
    page = shape.kv_bytes_per_page(wl.page_size)
    ws_pages = working_set_pages(wl, spec)

    weight_bytes = shape.weight_bytes_read_per_step if batch.num_requests else 0.0
    dense_kv = batch.num_dense * wl.context_pages * page
    sparse_kv = batch.num_selective * ws_pages * page
    digests = batch.num_selective * wl.context_pages * shape.digest_bytes_per_page(wl.digest_bytes_per_value)
    h2d = pcie_miss_bytes(shape, wl, batch.num_sparse * ws_pages * (1.0 - batch.hit_rate))
    d2h = batch.num_selective * tau * shape.kv_bytes_per_token
    writes = h2d + batch.num_requests * q * shape.kv_bytes_per_token

    tokens = batch.num_requests * q
    selected_tokens = min(wl.context_tokens, wl.selected_pages * wl.page_size)
    flops = (
        tokens * shape.matmul_flops_per_token
        + batch.num_dense * q * wl.context_tokens * shape.attention_flops_per_attended_token_per_layer * shape.num_layers
        + batch.num_selective * q * selected_tokens * shape.attention_flops_per_attended_token_per_layer * shape.num_layers
        + batch.num_selective * q * wl.context_pages * shape.digest_flops_per_page_per_layer * shape.num_layers
    )

    bw = hw.hbm_bandwidth_bytes_per_s
    hbm_s = ((weight_bytes + digests + writes) / (bw * hw.weights_hbm_efficiency)
             + dense_kv / (bw * hw.kv_dense_hbm_efficiency)
             + sparse_kv / (bw * hw.kv_sparse_hbm_efficiency))
    compute_s = flops / (hw.bf16_flops_per_s * hw.compute_efficiency)
    pcie_s = max(h2d, d2h) / hw.pcie_one_way_bytes_per_s
    core = max(hbm_s, compute_s, pcie_s) if hw.pcie_overlapped else max(hbm_s, compute_s) + pcie_s
    step_s = (core + hw.step_overhead_s) * (1.0 + spec.drafter_overhead_fraction)
    return StepCost(
        weight_bytes=weight_bytes, dense_kv_bytes=dense_kv, sparse_kv_bytes=sparse_kv, digest_bytes=digests,
        hbm_write_bytes=writes, pcie_h2d_bytes=h2d, pcie_d2h_bytes=d2h, flops=flops, hbm_s=hbm_s,
        compute_s=compute_s, pcie_s=pcie_s, step_s=step_s, tokens_per_step=batch.num_requests * tau,
        memory_bytes=memory_bytes(shape, wl, batch),
    )
