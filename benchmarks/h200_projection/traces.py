"""Inputs measured on our CPU runs: hit rate vs hot-buffer size, working-set union, acceptance.

A trace file (``--trace path.json``) looks like::

    {
      "source": "what run recorded it",
      "context_tokens": 8192,            # context the trace was recorded at
      "hit_rate_curve": [{"buffer_pages": 64, "hit_rate": 0.71}, ...],
      "hit_rate_curve_over_working_set": [{"buffer_over_working_set": 1.5, "hit_rate": 0.9}, ...],
      "working_set_union_factor": 1.4,   # |union of a verify block's selections| / |one selection|
      "mean_acceptance_length": 2.9,     # tokens committed per verify step (bonus included)
      "gamma": 8                          # draft tokens per verify block
    }

Every key is optional; a missing one falls back to the default in ``constants`` and is reported
as ASSUMED. A ``benchmarks.selection_trace`` result (``selection_trace.json``) holds its trace under
``"trace"``; that is read as the trace.

Two ways to give the hit-rate curve, at most one per trace:
- ``hit_rate_curve_over_working_set`` (what ``benchmarks.selection_trace`` records): buffer sizes in
  multiples of a step's mean working set; the projection applies the same multiple to its own
  working set (a buffer 2x the working set hits as often at 100K as at 8K). With a fixed top-k
  budget the working set does not grow with the context, so this is the natural unit.
- ``hit_rate_curve``: buffer sizes in pages at ``context_tokens``. Buffer sizes in the trace are scaled to the projected context LINEARLY in page
count (``buffer_pages x context / traced_context``): a buffer holding 1/8 of an 8K context is
taken to hit as often as one holding 1/8 of a 100K context. That is the stated scaling rule, not
a measurement; with a fixed top-k budget the working set does not grow with context, so linear
scaling is pessimistic for the projected buffer size.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.h200_projection import constants as C


@dataclass(frozen=True)
class HitCurve:
    """Piecewise-linear, non-decreasing hit rate of the working set vs hot-buffer pages per
    request. Beyond the last point it rises linearly to 1.0 at ``full_pages`` (every page hot)."""

    points: tuple[tuple[float, float], ...]  # (buffer_pages, hit_rate), buffer ascending
    full_pages: float

    def __post_init__(self):
        xs = [p[0] for p in self.points]
        ys = [p[1] for p in self.points]
        if xs != sorted(xs) or any(b > a for a, b in zip(ys[1:], ys)):
            raise ValueError(f"hit curve must be ascending in buffer and non-decreasing in hit: {self.points}")
        if any(not 0.0 <= y <= 1.0 for y in ys):
            raise ValueError("hit rates must lie in [0, 1]")

    def hit_rate(self, buffer_pages: float) -> float:
        if buffer_pages >= self.full_pages:
            return 1.0
        pts = [p for p in self.points if p[0] < self.full_pages]
        if not pts or pts[0][0] > 0:
            pts = [(0.0, 0.0)] + pts
        pts.append((self.full_pages, 1.0))
        xs = [p[0] for p in pts]
        i = bisect.bisect_right(xs, buffer_pages)
        if i == 0:
            return pts[0][1]
        (x0, y0), (x1, y1) = pts[i - 1], pts[i]
        if x1 == x0:
            return max(y0, y1)
        return y0 + (y1 - y0) * (buffer_pages - x0) / (x1 - x0)

    @classmethod
    def from_ratios(cls, ratios, working_set_pages: float, full_pages: float) -> "HitCurve":
        return cls(tuple((r * working_set_pages, h) for r, h in ratios), full_pages)


@dataclass
class TraceInputs:
    """What the projection takes from CPU traces, with provenance per field."""

    hit_points: tuple[tuple[float, float], ...] | None = None  # scaled to the projected context
    hit_ratios: tuple[tuple[float, float], ...] | None = None  # (buffer / working set, hit rate)
    working_set_union_factor: float = C.SPEC_WORKING_SET_UNION_FACTOR
    acceptance_length: float = C.SPEC_ACCEPTANCE_LENGTH
    gamma: int = C.SPEC_GAMMA
    provenance: dict = field(default_factory=lambda: {
        "hit_rate_curve": "ASSUMED (constants.DEFAULT_HIT_CURVE_RATIOS, relative to the working set)",
        "working_set_union_factor": "ASSUMED (constants.SPEC_WORKING_SET_UNION_FACTOR)",
        "mean_acceptance_length": "ASSUMED (constants.SPEC_ACCEPTANCE_LENGTH)",
        "gamma": "ASSUMED (constants.SPEC_GAMMA)",
    })
    source: str | None = None
    scaling: str | None = None

    def hit_curve(self, working_set_pages: float, full_pages: float) -> HitCurve:
        if self.hit_points is not None:
            return HitCurve(self.hit_points, full_pages)
        return HitCurve.from_ratios(self.hit_ratios or C.DEFAULT_HIT_CURVE_RATIOS, working_set_pages, full_pages)

    def as_dict(self) -> dict:
        return {
            "source": self.source,
            "hit_rate_curve_pages_at_projected_context": [list(p) for p in self.hit_points] if self.hit_points else None,
            "hit_rate_curve_over_working_set": [list(p) for p in self.hit_ratios] if self.hit_ratios else None,
            "working_set_union_factor": self.working_set_union_factor,
            "mean_acceptance_length": self.acceptance_length,
            "gamma": self.gamma,
            "provenance": self.provenance,
            "page_count_scaling": self.scaling,
        }


def load_trace(path: str | Path | None, context_tokens: int = C.CONTEXT_TOKENS) -> TraceInputs:
    """Reads a trace file (None: all defaults, ASSUMED) and scales its page counts to ``context_tokens``."""
    inputs = TraceInputs()
    if path is None:
        return inputs
    raw = json.loads(Path(path).read_text())
    if raw.get("benchmark") == "selection_trace":
        raw = raw["trace"]
    if "hit_rate_curve" in raw and "hit_rate_curve_over_working_set" in raw:
        raise ValueError("a trace gives hit_rate_curve or hit_rate_curve_over_working_set, not both")
    inputs.source = raw.get("source", str(path))
    where = f"TRACE {path}"
    if "hit_rate_curve" in raw:
        traced_context = raw.get("context_tokens")
        if not traced_context:
            raise ValueError("a trace with hit_rate_curve must give context_tokens (to scale page counts)")
        scale = context_tokens / traced_context
        pts = sorted((float(p["buffer_pages"]) * scale, float(p["hit_rate"])) for p in raw["hit_rate_curve"])
        inputs.hit_points = tuple(pts)
        inputs.provenance["hit_rate_curve"] = f"{where}, buffer pages scaled linearly x{scale:.4g}"
        inputs.scaling = (f"linear in page count: traced at {traced_context} tokens, projected at "
                          f"{context_tokens} tokens (x{scale:.4g})")
    if "hit_rate_curve_over_working_set" in raw:
        inputs.hit_ratios = tuple(sorted((float(p["buffer_over_working_set"]), float(p["hit_rate"]))
                                         for p in raw["hit_rate_curve_over_working_set"]))
        inputs.provenance["hit_rate_curve"] = f"{where}, buffer in multiples of the working set"
        inputs.scaling = "buffer pages as the same multiple of the projected working set"
    for key, attr in (("working_set_union_factor", "working_set_union_factor"),
                      ("mean_acceptance_length", "acceptance_length"), ("gamma", "gamma")):
        if key in raw:
            setattr(inputs, attr, type(getattr(inputs, attr))(raw[key]))
            inputs.provenance[key] = where
    return inputs
