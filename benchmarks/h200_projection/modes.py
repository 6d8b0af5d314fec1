"""The three residency modes at the projected serving point, and the PCIe break-even buffer.

- dense-resident: every request's whole KV in HBM, dense attention. Concurrency is whatever
  fits: ``floor((usable HBM - weights) / KV of one request)``, at most the target.
- always-sparse: every request SPARSE with a hot buffer sized for its working set
  (``Workload.sparse_buffer_ratio`` x working-set pages); digests of every page stay hot.
- adaptive: as always-sparse, then the HBM left over promotes requests to FULL (every page hot,
  no misses) one by one while they fit; the rest stay SPARSE.

A mode that cannot fit the target concurrency runs at the concurrency that fits and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.h200_projection.constants import Hardware, Speculation, Workload
from benchmarks.h200_projection.shapes import ModelShape
from benchmarks.h200_projection.step_model import (
    Batch,
    StepCost,
    step_cost,
    working_set_pages,
)
from benchmarks.h200_projection.traces import HitCurve, TraceInputs

MODES = ("dense-resident", "always-sparse", "adaptive")


@dataclass(frozen=True)
class Projection:
    mode: str
    batch: Batch
    cost: StepCost
    fits_target: bool  # the target concurrency fits in usable HBM

    def as_dict(self, spec: Speculation) -> dict:
        return {
            "mode": self.mode,
            "concurrency": self.batch.num_requests,
            "num_full": self.batch.num_resident + self.batch.num_dense,
            "num_sparse": self.batch.num_sparse,
            "buffer_pages": self.batch.buffer_pages,
            "hit_rate": self.batch.hit_rate,
            "fits_target": self.fits_target,
            "tokens_per_s": self.cost.tokens_per_s,
            "tpot_ms": self.cost.step_s / spec.acceptance_length * 1e3 if self.batch.num_requests else None,
            "step_ms": self.cost.step_s * 1e3,
            "bottleneck": self.cost.bottleneck,
            "cost": self.cost.as_dict(),
        }


def dense_fit(shape: ModelShape, hw: Hardware, wl: Workload) -> int:
    """Requests whose whole KV fits beside the weights (not capped by the target)."""
    per_request = wl.context_pages * shape.kv_bytes_per_page(wl.page_size)
    return max(0, math.floor((hw.usable_hbm_bytes - shape.resident_weight_bytes) / per_request))


def sparse_buffer_pages(wl: Workload, spec: Speculation) -> int:
    return min(wl.context_pages, math.ceil(working_set_pages(wl, spec) * wl.sparse_buffer_ratio))


def sparse_fit(shape: ModelShape, hw: Hardware, wl: Workload, buffer_pages: int) -> int:
    """Requests that fit with digests of every page plus ``buffer_pages`` hot slots each."""
    per_request = (wl.context_pages * shape.digest_bytes_per_page(wl.digest_bytes_per_value)
                   + buffer_pages * shape.kv_bytes_per_page(wl.page_size))
    return max(0, math.floor((hw.usable_hbm_bytes - shape.resident_weight_bytes) / per_request))


def project_dense(shape, hw, wl, spec) -> Projection:
    fit = dense_fit(shape, hw, wl)
    batch = Batch(num_dense=min(fit, wl.num_requests))
    return Projection("dense-resident", batch, step_cost(shape, hw, wl, spec, batch), fit >= wl.num_requests)


def project_sparse(shape, hw, wl, spec, curve: HitCurve) -> Projection:
    buffer = sparse_buffer_pages(wl, spec)
    fit = sparse_fit(shape, hw, wl, buffer)
    batch = Batch(num_sparse=min(fit, wl.num_requests), buffer_pages=buffer, hit_rate=curve.hit_rate(buffer))
    return Projection("always-sparse", batch, step_cost(shape, hw, wl, spec, batch), fit >= wl.num_requests)


def project_adaptive(shape, hw, wl, spec, curve: HitCurve) -> Projection:
    buffer = sparse_buffer_pages(wl, spec)
    fit = sparse_fit(shape, hw, wl, buffer)
    n = min(fit, wl.num_requests)
    page = shape.kv_bytes_per_page(wl.page_size)
    sparse_only = step_cost(shape, hw, wl, spec, Batch(num_sparse=n, buffer_pages=buffer)).memory_bytes
    extra_per_full = (wl.context_pages - buffer) * page
    left = hw.usable_hbm_bytes - sparse_only
    num_full = n if extra_per_full <= 0 else min(n, max(0, math.floor(left / extra_per_full)))
    batch = Batch(num_resident=num_full, num_sparse=n - num_full, buffer_pages=buffer, hit_rate=curve.hit_rate(buffer))
    return Projection("adaptive", batch, step_cost(shape, hw, wl, spec, batch), fit >= wl.num_requests)


def project_all(shape, hw, wl, spec, curve: HitCurve) -> list[Projection]:
    return [project_dense(shape, hw, wl, spec), project_sparse(shape, hw, wl, spec, curve),
            project_adaptive(shape, hw, wl, spec, curve)]


def pcie_break_even(shape: ModelShape, hw: Hardware, wl: Workload, spec: Speculation, curve: HitCurve) -> dict:
    """Smallest hot buffer (pages per request) at which always-sparse is no longer PCIe-bound
    (PCIe time <= max(HBM time, compute time)), at the always-sparse concurrency.

    Memory for the buffer is not checked while searching (the question is how big it must be);
    ``fits`` says whether that buffer fits in usable HBM at this concurrency.
    """
    base = project_sparse(shape, hw, wl, spec, curve).batch
    n = base.num_requests
    if n == 0:
        return {"buffer_pages": None, "reason": "no request fits even with a working-set buffer"}

    def cost(b: int) -> StepCost:
        return step_cost(shape, hw, wl, spec, Batch(num_sparse=n, buffer_pages=b, hit_rate=curve.hit_rate(b)))

    def ok(c: StepCost) -> bool:
        return c.pcie_s <= max(c.hbm_s, c.compute_s)

    lo, hi = working_set_pages(wl, spec), wl.context_pages
    bound_at_working_set = not ok(cost(lo))
    if not ok(cost(hi)):
        return {"buffer_pages": None, "concurrency": n,
                "reason": "PCIe-bound even with every page hot (write-back of new rows)"}
    if bound_at_working_set:
        while hi - lo > 1:  # ok(hi), not ok(lo): PCIe time falls as the buffer (and hit rate) grows
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if ok(cost(mid)) else (mid, hi)
    else:
        hi = lo
    c = cost(hi)
    per_request_max = sparse_fit_buffer(shape, hw, wl, n)
    return {
        "buffer_pages": hi,
        "buffer_over_working_set": hi / working_set_pages(wl, spec),
        "hit_rate": curve.hit_rate(hi),
        "concurrency": n,
        "pcie_bound_at_working_set_buffer": bound_at_working_set,
        "memory_bytes": c.memory_bytes,
        "fits": c.memory_bytes <= hw.usable_hbm_bytes,
        "max_buffer_pages_that_fit": per_request_max,
        "tokens_per_s_at_break_even": c.tokens_per_s,
    }


def sparse_fit_buffer(shape: ModelShape, hw: Hardware, wl: Workload, num_requests: int) -> int:
    """Largest hot buffer per request (pages) that fits for ``num_requests`` SPARSE requests."""
    digests = num_requests * wl.context_pages * shape.digest_bytes_per_page(wl.digest_bytes_per_value)
    left = hw.usable_hbm_bytes - shape.resident_weight_bytes - digests
    return max(0, min(wl.context_pages, math.floor(left / num_requests / shape.kv_bytes_per_page(wl.page_size))))


def curve_for(trace: TraceInputs, wl: Workload, spec: Speculation) -> HitCurve:
    return trace.hit_curve(working_set_pages(wl, spec), wl.context_pages)
