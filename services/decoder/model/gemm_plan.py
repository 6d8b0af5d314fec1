"""Which GEMM kernel (``model/linear.py``) the model's projections run at each row count, measured
on this machine with the model's own weights.

``measure_plan`` times one pass over all the given ``Linear``s (weights streamed from DRAM, as in
a step) per kernel at each count of ``PLAN_ROWS``, kernels interleaved round by round, and keeps
the fastest median (kernels far behind after two rounds drop out). A count between two grid
points takes the kernel of the next point up; a count beyond the grid that of its last point
(``128``, where MKL packs do not go).

A grid point may also run padded: its counts get zero rows up to a larger grid point and run as
that point does, where that was measured faster than the point itself. On the AMD EPYC (AVX512)
machine a pass over SmolLM2-135M's projections takes 23.9 ms at 1 row (oneDNN, the fastest
kernel there) against 18-21 ms at 2 rows (``mm_w_xt``), so 1 row runs as 2: a 1-token decode
step 1.2-1.3x faster. oneDNN's 19.5 ms at 6 rows against 22.8 at 4 looked like a second such
gap, but padding 3-4 rows to 6 measured 0.99-1.05x in engine steps, inside the noise. Pads are
chosen head to head (``choose_pads``) and must save ``PAD_MIN_SAVING``: one round's noise is as
large as the effects.

``plan_for`` memoises the plan per process and on disk under ``cache_dir()/gemm_plans/``, keyed by
the CPU (model name, flags, cores), torch version, intra-op threads, dtype and the weights'
shapes: the first process on a machine pays the measurement (a few seconds for SmolLM2-135M),
every later one reads it, and all pick the same kernels (a kernel choice changes fp32 sums in
their last bits, so a per-process choice could flip a near-tie between runs). Delete the file to
measure again.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from services.decoder.model.linear import KERNELS, MIN_PACKED_ROWS, PACK_BUCKETS_ROWS, Linear, available_kernels, pack_bucket

log = logging.getLogger(__name__)

PLAN_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)
PLAN_REPEATS = 3
KEEP_WITHIN = 1.5  # a kernel whose best screening pass is slower than this x the fastest is not timed again
SCREEN_ROUNDS = 2  # interleaved rounds every kernel runs before the screen: one stalled pass (a CI run saw the
#                    fastest kernel at 16 and 128 rows read >1.5x slow once and drop out) no longer decides it
PAD_MIN_SAVING = 0.10  # a padded run must be this much faster than the point's own best (medians of 7 rounds still move ~5%)
PAD_CONFIRM_REPEATS = 7  # interleaved rounds of the point's own best and the padded runs that decide
PAD_MAX_ROWS = 16  # decode and verify sizes: only counts below it pad, and only up to it
PLAN_VERSION = 2  # in the cache key: plans measured before padding existed are measured again
_MEMO: dict[str, GemmPlan] = {}


def packs_serve(rows: tuple[int, ...], i: int) -> bool:
    """Whether MKL packs can run every count that grid point ``i`` of ``rows`` serves (those above
    the previous point up to ``rows[i]``; the last point serves every larger count too)."""
    lowest = rows[i - 1] + 1 if i else 1
    return i < len(rows) - 1 and pack_bucket(lowest) is not None and pack_bucket(rows[i]) is not None


@dataclass(frozen=True)
class GemmPlan:
    rows: tuple[int, ...]  # ascending grid of row counts
    kernels: tuple[str, ...]  # the kernel chosen at each (measured unpadded)
    ms: tuple[dict[str, float], ...] = ()  # per grid point: each candidate's median ms per pass (for logs and benchmarks)
    # per grid point: the rows its counts are zero-padded to (a larger grid point's count), or None
    # to run at their own size; () = no point pads
    pad_to: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_choices", {})  # num_rows -> (kernel, rows), filled by ``choice``
        if not self.rows or len(self.rows) != len(self.kernels) or list(self.rows) != sorted(set(self.rows)):
            raise ValueError("a GEMM plan needs strictly ascending rows, one kernel each")
        if self.pad_to:
            if len(self.pad_to) != len(self.rows):
                raise ValueError("a GEMM plan's pad_to needs one entry (rows or None) per grid point")
            for i, to in enumerate(self.pad_to):
                if to is None:
                    continue
                if i == len(self.rows) - 1 or to not in self.rows[i + 1 :]:
                    raise ValueError(f"grid point {self.rows[i]} can only pad to a larger grid point (not the "
                                     f"last, which serves every larger count), not to {to}")
        if unknown := set(self.kernels) - set(KERNELS):
            raise ValueError(f"unknown GEMM kernels {sorted(unknown)} (known: {', '.join(KERNELS)})")
        for i, kernel in enumerate(self.kernels):
            if kernel == "mkl_pack" and not packs_serve(self.rows, i):
                lowest = self.rows[i - 1] + 1 if i else 1
                raise ValueError(f"MKL packs serve {MIN_PACKED_ROWS}-{PACK_BUCKETS_ROWS[-1]} rows, not "
                                 f"{lowest}-{self.rows[i]}{' and beyond' if i == len(self.rows) - 1 else ''}")

    def choice(self, num_rows: int) -> tuple[str, int]:
        """``(kernel, rows it runs at)`` for ``num_rows`` rows: their grid point's kernel, or,
        padded, the kernel of the point they pad to at its rows (memoised: every projection of
        every step asks)."""
        found = self._choices.get(num_rows)
        if found is None:
            point = min(bisect.bisect_left(self.rows, num_rows), len(self.rows) - 1)
            to = self.pad_to[point] if self.pad_to else None
            found = (self.kernels[point], num_rows) if to is None else (self.kernels[self.rows.index(to)], to)
            self._choices[num_rows] = found
        return found

    def kernel(self, num_rows: int) -> str:
        return self.choice(num_rows)[0]

    def run_rows(self, num_rows: int) -> int:
        """The rows a product of ``num_rows`` rows is computed at (its grid point's pad, else itself)."""
        return self.choice(num_rows)[1]

    def unpadded(self) -> GemmPlan:
        """The same kernel choices with no point padding (for side-by-side benchmarks)."""
        return GemmPlan(self.rows, self.kernels, self.ms)

    def describe(self) -> str:
        """``1->6:onednn 2:mm_w_xt ...``: the choice at each grid point (padded: where to, and its kernel)."""
        return " ".join(f"{r}" + (f"->{self.run_rows(r)}" if self.run_rows(r) != r else "") + f":{self.kernel(r)}"
                        for r in self.rows)

    def to_json(self) -> dict:
        return {"rows": list(self.rows), "kernels": list(self.kernels), "ms": list(self.ms), "pad_to": list(self.pad_to)}

    @classmethod
    def from_json(cls, data: dict) -> GemmPlan:
        return cls(tuple(data["rows"]), tuple(data["kernels"]), tuple(data.get("ms", ())), tuple(data.get("pad_to", ())))


def measure_plan(linears: list[Linear], rows: tuple[int, ...] = PLAN_ROWS, repeats: int = PLAN_REPEATS) -> GemmPlan:
    """Times every kernel that can run all of ``linears`` at each count in ``rows`` (one pass over
    ``linears`` per timing, inputs ``[rows, in_features]`` of the weights' dtype; an untimed pass
    first where a kernel's weight copies are not built yet) and picks the fastest median over
    ``repeats`` rounds; after ``SCREEN_ROUNDS`` rounds only kernels whose best pass is within
    ``KEEP_WITHIN`` of the fastest pass run again."""
    gen = torch.Generator().manual_seed(0)
    chosen, timings = [], []
    for i, num_rows in enumerate(rows):
        runnable = set.intersection(*(set(available_kernels(lin.weight, num_rows)) for lin in linears))
        if not packs_serve(rows, i):
            runnable.discard("mkl_pack")
        kernels = [k for k in KERNELS if k in runnable]
        inputs = pass_inputs(linears, num_rows, gen)

        def one_pass(kernel: str) -> float:
            return pass_seconds(linears, inputs, kernel)

        for k in kernels:  # untimed: the first call builds a kernel's weight copies
            if any(lin.needs_build(k, num_rows) for lin in linears):
                one_pass(k)
        seconds: dict[str, list[float]] = {k: [] for k in kernels}
        screen_rounds = min(SCREEN_ROUNDS, repeats)
        for _ in range(screen_rounds):
            for k in kernels:
                seconds[k].append(one_pass(k))
        best = min(min(s) for s in seconds.values())
        survivors = [k for k in kernels if min(seconds[k]) <= KEEP_WITHIN * best]  # the rest cannot win
        for _ in range(repeats - screen_rounds):
            for k in survivors:
                seconds[k].append(one_pass(k))
        ms = {k: round(statistics.median(s) * 1e3, 3) for k, s in seconds.items()}
        chosen.append(min(survivors, key=ms.__getitem__))
        timings.append(ms)
    pad_to = choose_pads(linears, tuple(rows), chosen)
    return GemmPlan(tuple(rows), tuple(chosen), tuple(timings), tuple(pad_to) if any(pad_to) else ())


def choose_pads(linears: list[Linear], rows: tuple[int, ...], kernels: list[str]) -> list[int | None]:
    """Per grid point below ``PAD_MAX_ROWS``, the larger grid point up to ``PAD_MAX_ROWS`` to pad
    its counts to, or None. The point's own best kernel and every candidate's run head to head,
    ``PAD_CONFIRM_REPEATS`` interleaved rounds: the fastest median wins if it is more than
    ``PAD_MIN_SAVING`` faster than the point's own (the first round's timings alone are as noisy
    as the effect: oneDNN at 4 rows read 19.5 ms in one plan and 22.8 ms over 15 rounds)."""
    gen = torch.Generator().manual_seed(1)
    inputs = {n: pass_inputs(linears, n, gen) for n in rows if n <= PAD_MAX_ROWS}
    pads: list[int | None] = [None] * len(rows)
    for i in range(len(rows) - 1):
        candidates = [j for j in range(i + 1, len(rows) - 1) if rows[j] <= PAD_MAX_ROWS]
        if rows[i] >= PAD_MAX_ROWS or not candidates:
            continue
        seconds: dict[int, list[float]] = {j: [] for j in (i, *candidates)}
        for _ in range(PAD_CONFIRM_REPEATS):
            for j in seconds:
                seconds[j].append(pass_seconds(linears, inputs[rows[j]], kernels[j]))
        median = {j: statistics.median(s) for j, s in seconds.items()}
        best = min(candidates, key=lambda j: (median[j], j))
        if median[best] < (1 - PAD_MIN_SAVING) * median[i]:
            pads[i] = rows[best]
    return pads


def pass_inputs(linears: list[Linear], num_rows: int, gen: torch.Generator) -> dict[int, torch.Tensor]:
    """One random input ``[num_rows, in_features]`` in the weights' dtype per input width of ``linears``."""
    return {n: torch.randn(num_rows, n, generator=gen).to(linears[0].weight.dtype)
            for n in {lin.weight.shape[1] for lin in linears}}


def pass_seconds(linears: list[Linear], inputs: dict[int, torch.Tensor], kernel: str | None) -> float:
    """Seconds of one pass over ``linears`` in order (as a step runs them) through ``kernel``
    (None: each one's own plan), each on the input of its width."""
    start = time.perf_counter()
    with torch.inference_mode():
        for lin in linears:
            x = inputs[lin.weight.shape[1]]
            lin(x) if kernel is None else lin.run(x, kernel)
    return time.perf_counter() - start


def apply_plan(linears: list[Linear], plan: GemmPlan) -> None:
    """Every ``Linear`` follows ``plan``; weight copies of kernels the plan never runs are freed."""
    used = set(plan.kernels)
    for lin in linears:
        lin.plan = plan
        lin.drop_packs(used)


@functools.cache
def _cpu_signature() -> str:
    """The CPU's model name and feature flags (read once per process)."""
    try:
        with open("/proc/cpuinfo") as f:
            return "".join(sorted({ln for ln in f if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor()


def plan_key(linears: list[Linear]) -> str:
    """What a plan depends on: the CPU, torch, threads, dtype and the weights' shapes (and the
    plan's own format, ``PLAN_VERSION``)."""
    parts = [f"v{PLAN_VERSION}", _cpu_signature(), str(os.cpu_count()), torch.__version__, str(torch.get_num_threads()), str(linears[0].weight.dtype),
             str(linears[0].weight.device), ";".join(str(tuple(lin.weight.shape)) for lin in linears)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def plan_for(linears: list[Linear], cache_dir: Path | None = None) -> GemmPlan:
    """The plan for ``linears`` on this machine: memoised, else read from ``cache_dir`` (None: no
    disk cache), else measured (and written there)."""
    key = plan_key(linears)
    if key in _MEMO:
        return _MEMO[key]
    path = None if cache_dir is None else Path(cache_dir) / f"{key}.json"
    plan = None
    if path is not None and path.exists():
        try:
            plan = GemmPlan.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable GEMM plan %s (%s); measuring again", path, exc)
    if plan is None:
        start = time.perf_counter()
        plan = measure_plan(linears)
        log.info("measured the GEMM plan in %.1f s: %s", time.perf_counter() - start, plan.describe())
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(plan.to_json(), indent=1))
            tmp.replace(path)  # atomic: concurrent first processes each write a whole plan
    _MEMO[key] = plan
    return plan
