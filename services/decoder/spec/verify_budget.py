"""How many drafted tokens each request verifies this step (the verify budget).

``fixed``: all the drafter proposes (up to ``spec_tokens``).

``adaptive`` (in the spirit of DSpark's budget): per request, the draft length k that maximises
expected committed tokens per second of step time,

    E(k) / (step_s(T + k) + fetch_s(k)),      E(k) = 1 + sum_{i=1..k} p_i,

where p_i is the probability that draft position i survives given its prefix did (the drafter's
confidence; the n-gram drafter has none, so the request's running acceptance rate a gives
p_i = a ** i), ``step_s`` is the engine's measured step time at ``T`` batch tokens (a table
profiled at start-up, interpolated; ``T`` = the step's other tokens + 1), and ``fetch_s(k)`` is
what nobody else charges: a SPARSE request's larger working set must fetch pages from the host,
k more verified positions x its measured misses per position x the measured seconds per fetched
page-layer. Under hot-tier pressure (high miss rate) the budget shrinks.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCostTable:
    """Measured step seconds at a few batch token counts (ascending)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.tokens or len(self.tokens) != len(self.seconds) or list(self.tokens) != sorted(set(self.tokens)):
            raise ValueError("tokens must be strictly ascending and match seconds one to one")

    def step_s(self, num_tokens: int) -> float:
        """Linear interpolation; beyond the last point, the last slope (or flat with one point)."""
        ts, ss = self.tokens, self.seconds
        i = bisect.bisect_left(ts, num_tokens)
        if i < len(ts) and ts[i] == num_tokens:
            return ss[i]
        if len(ts) == 1:
            return ss[0]
        lo = min(max(i - 1, 0), len(ts) - 2)
        slope = (ss[lo + 1] - ss[lo]) / (ts[lo + 1] - ts[lo])
        return max(ss[lo] + slope * (num_tokens - ts[lo]), 0.0)


@dataclass
class AcceptanceEstimate:
    """A request's running acceptance rate: the share of drafted positions accepted, as an
    exponential moving average over verify steps, starting from ``prior``."""

    rate: float = 0.7
    weight: float = 0.3  # of the newest step

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted > 0:
            # per-position survival that would accept this many of this many in expectation
            observed = num_accepted / num_drafted
            self.rate = (1 - self.weight) * self.rate + self.weight * observed


def expected_committed(confidences: list[float]) -> float:
    """1 (the bonus token) + expected accepted draft tokens, ``confidences[i]`` = P(position i
    survives | position i-1 survived)."""
    total, alive = 1.0, 1.0
    for p in confidences:
        alive *= p
        total += alive
    return total


def choose_draft_length(confidences: list[float], other_tokens: int, costs: StepCostTable,
                        fetch_s_per_position: float = 0.0) -> int:
    """The k in ``0..len(confidences)`` maximising E(k) / (step_s(other_tokens + 1 + k) +
    k * fetch_s_per_position); ties go to the shorter draft."""
    best_k, best_rate = 0, -1.0
    for k in range(len(confidences) + 1):
        cost = costs.step_s(other_tokens + 1 + k) + k * fetch_s_per_position
        rate = expected_committed(confidences[:k]) / cost if cost > 0 else float("inf")
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate = k, rate
    return best_k
