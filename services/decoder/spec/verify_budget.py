"""How many drafted tokens each request verifies this step (the verify budget).

``fixed``: all the drafter proposes (up to ``spec_tokens``).

``adaptive`` (in the spirit of DSpark's budget): the draft lengths that maximise the step's
expected committed tokens per second of step time (``choose_draft_lengths``: jointly over the
step's requests, since each verified token costs every request step time); for one request,

    E(k) / (step_s(T + k) + fetch_s(k) + draft_s),      E(k) = 1 + sum_{i=1..k} p_1 ... p_i,

where p_i is the probability that draft position i survives given its prefix did (the drafter's
confidence; the n-gram drafter and DFlash have none, so p_i is the drafter's pooled survival at
depth i, ``spec/depth_survival.py``, scaled by how the request's drafts have survived against it),
``step_s`` is the engine's measured step time at ``T`` batch tokens (a table profiled at
start-up, interpolated; a count that the GEMM plan pads up to an MKL pack's bucket costs that
bucket; ``T`` = the step's other tokens + 1) plus the attention of its query tokens, priced
per key row each reads (``spec/attention_costs.py``: a position 4K tokens into a document
costs more than one 300 tokens into a chat), and ``fetch_s(k)`` is what nobody
else charges: a SPARSE request's larger working set must fetch pages from the host, k more
verified positions x its measured misses per position x the measured seconds per fetched
page-layer. Under hot-tier pressure (high miss rate) the budget shrinks.

``draft_s`` is the drafter's own forward (profiled at start-up too: per call, plus per position
asked). It is spent before any confidence is known, so the engine first asks the same question
with each request's running survival estimate and the drafter's cost: when no draft would pay
for it, the drafter does not run that step, and speculation costs no more than its feature
capture (see ``engine/speculation.py``). Both tables are corrected while serving by the step and
drafter times the engine measures (``CalibratedCosts``).
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass



@dataclass(frozen=True)
class CostTable:
    """Measured seconds at a few counts (ascending): the step's seconds vs its batch tokens, or the
    drafter's seconds vs the requests it drafts for in one call."""

    counts: tuple[int, ...]
    seconds: tuple[float, ...]
    # counts whose matmuls run padded (MKL packs, ``model/linear.pack_bucket``, where the GEMM plan
    # picks them): ``(count, padded count)`` pairs, each padded count a profiled count. Such a count
    # costs what its padded count costs: 9 verified tokens cost the 16-row GEMM, which
    # interpolating between 8 and 16 would price at about half of the way up
    pads: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.counts or len(self.counts) != len(self.seconds) or list(self.counts) != sorted(set(self.counts)):
            raise ValueError("counts must be strictly ascending and match seconds one to one")
        if not {to for _, to in self.pads} <= set(self.counts):
            raise ValueError(f"padded counts {sorted({to for _, to in self.pads})} must be profiled counts")
        object.__setattr__(self, "_pad_to", dict(self.pads))

    def padded(self, count: int) -> int:
        return self._pad_to.get(count, count)

    def seconds_at(self, count: int) -> float:
        """The padded count's seconds: linear interpolation; beyond the last point, the last
        slope (or flat with one point)."""
        count = self.padded(count)
        cs, ss = self.counts, self.seconds
        i = bisect.bisect_left(cs, count)
        if i < len(cs) and cs[i] == count:
            return ss[i]
        if len(cs) == 1:
            return ss[0]
        lo = min(max(i - 1, 0), len(cs) - 2)
        slope = (ss[lo + 1] - ss[lo]) / (cs[lo + 1] - cs[lo])
        return max(ss[lo] + slope * (count - cs[lo]), 0.0)


class MachineSpeed:
    """How fast the machine runs now against its start-up profile (1: as profiled; 1.2: every
    cost 20% dearer): a geometric moving average that every ``CalibratedCosts`` sharing it moves
    with each measurement. One engine's step table and drafter table share one: what slows the
    machine (other load on its cores, memory bandwidth taken by neighbours) slows the target and
    the drafter alike, so a slow spell leaves their ratio, which the gate decides on, alone. With
    a speed of its own, each table followed its own noise: a drafting step measured in a slow
    spell raised the step prices and not the drafter's, and drafting then looked cheap (c=4,
    DSpark: a plain step priced at 47.3 ms on average where drafting was decided, 39.4 ms where
    plain steps ran; in a trace of the same setting sharing one speed, 35.9 ms priced, 36.2 taken)."""

    def __init__(self):
        self.value = 1.0


class CalibratedCosts:
    """A profiled ``CostTable`` corrected by what the engine measures while it serves: the
    machine's current ``speed`` (every measurement, whatever its count; a ``MachineSpeed`` that
    other tables may share) times a *shape*
    correction per count, a moving average of measured / (speed x profiled) seconds at the
    ``ANCHOR_COUNTS`` (a measurement updates the two anchors around its count, weighted by
    distance on the log2 axis). Between anchors that have measurements the shape is
    interpolated; beyond them the nearest one holds; with none it is 1. A count is read and
    measured as the count its GEMMs run padded to (``CostTable.padded``): a 1-token step that
    runs as 2 rows is priced by what 2-token steps measure. The start-up profile
    times one request on an idle engine; serving steps carry many requests (per-request
    attention, sampling, verification) on a machine that may be busy, and the budget must price
    what a verified token really costs there.

    Why two factors: the budget compares steps of different sizes (a step with drafts against
    the same step without), and on a shared machine the step time drifts by 20-30% within a
    minute. With one correction per anchor, an anchor that was last measured a while ago keeps
    the speed of then: at c=1, while every step drafted (4 batch tokens), the 1-token anchor kept
    a slow minute's 56 ms while 4-token steps measured 46 ms, every draft looked 20% better than
    it was, the gate's promises fell short and the shortfall then kept the drafter off where
    it paid. The speed moves every anchor at once (``SPEED_WEIGHT``, fast); the shape learns what
    differs between counts (``WEIGHT``, slow)."""

    # every count up to 8 (the verify steps of low concurrency, between which the GEMM plan
    # switches kernels: a 3-token step took 37.1 ms where a 4-token one took 35.7 and a 2-token
    # one 30.2, and anchors at powers of 2 priced 3 between 2 and 4, below what it costs, so the
    # budget kept verifying 2-token drafts at c=1 that lost to 1-token ones), then powers of 2
    ANCHOR_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
    _X = tuple(math.log2(c) for c in ANCHOR_COUNTS)  # the anchors on the log2 axis
    # of the newest measurement at its anchor's shape, once the plain mean of its first ones has
    # reached it (1 / WEIGHT measurements): a tenth of the speed's, so a lasting change measured
    # at one count moves the speed ~90% of the way and that anchor's shape the rest (the two
    # cannot be told apart from one count). Before that, the mean: a count measured rarely (the
    # verify steps of a drafter's occasional probes) would otherwise keep its first measurement
    # (sparse code c=1: 4-token steps priced 37.2 ms after 48 of them, which took 42.3 on average)
    WEIGHT = 0.01
    SPEED_WEIGHT = 0.1  # of the newest measurement in the speed (geometric)
    LIMITS = (0.1, 10.0)  # the correction never goes beyond these factors (outliers: a preempted step)
    # one measurement counts as at most this factor off the current estimate: a one-off (a GEMM
    # pack built on first use, a page fault) must not set an anchor outright, since a budget
    # that then never drafts would never measure again to correct it
    MAX_JUMP = 2.0
    # an anchor not measured for STALE_AFTER measurements at other counts moves STALE_RELAX of
    # the way to the mean shape of the anchors still measured (the profile, at the level the
    # table reads now: after a spell the speed and the shapes may have traded a factor) with each
    # further one, and its weight decays alike, so a fresh plain mean starts when it is measured.
    # A slow spell during the steps of one size (a drafter's probes) set that size's shape 2.5x
    # high; the gate then never verified that size, and nothing measured it again (c=1 chat,
    # DSpark: 1-token drafts only, for good)
    STALE_AFTER = 64
    STALE_RELAX = 0.02

    def __init__(self, table: CostTable, speed: MachineSpeed | None = None):
        """``speed``: shared with other tables (then measured by all of them, and ``relax``
        leaves it be); None: this table's own."""
        self.table = table
        self.shared_speed = speed is not None
        self._speed = speed or MachineSpeed()
        self.ratios = [1.0] * len(self._X)  # the shape at each anchor
        self.weights = [0.0] * len(self._X)  # measurement weight each anchor has seen
        self._seen: list[int] = []  # anchors with a measurement, ascending (the budget reads often)
        self._seen_x: list[float] = []  # their log2 counts
        self._measurements = 0  # observe calls so far
        self._last_measured = [0] * len(self._X)  # the observe call that last measured each anchor

    def _log2(self, count: int) -> float:
        """The log2 of the count ``count`` runs as (its pad), within the anchors."""
        return min(max(math.log2(max(self.table.padded(count), 1)), 0.0), self._X[-1])

    def shape_at(self, count: int) -> float:
        x = self._log2(count)
        seen = self._seen
        if not seen:
            return 1.0
        i = bisect.bisect_right(self._seen_x, x)  # seen x[i - 1] <= x < seen x[i]
        if i == 0:
            return self.ratios[seen[0]]
        lo = seen[i - 1]
        if self._X[lo] == x or i == len(seen):
            return self.ratios[lo]
        hi = seen[i]
        frac = (x - self._X[lo]) / (self._X[hi] - self._X[lo])
        return self.ratios[lo] * (1 - frac) + self.ratios[hi] * frac

    @property
    def speed(self) -> float:
        return self._speed.value

    def ratio_at(self, count: int) -> float:
        return self.speed * self.shape_at(count)

    def seconds_at(self, count: int) -> float:
        return self.table.seconds_at(count) * self.ratio_at(count)

    def observe(self, count: int, seconds: float, shape_weight: float | None = None) -> None:
        """One measurement: ``seconds`` for ``count`` (batch tokens, or requests drafted).
        ``shape_weight``: the count's shape moves at least this share of the way (default
        ``WEIGHT``), for a measurement that must set its count's price now (a control step of the
        speculator)."""
        profiled = self.table.seconds_at(count)
        if profiled <= 0 or seconds <= 0:
            return
        current = self.ratio_at(count)
        observed = min(max(seconds / profiled, current / self.MAX_JUMP), current * self.MAX_JUMP)
        observed = min(max(observed, self.LIMITS[0]), self.LIMITS[1])
        self._speed.value *= (observed / current) ** self.SPEED_WEIGHT
        shape = observed / self.speed
        x = self._log2(count)
        lo = min(bisect.bisect_right(self._X, x) - 1, len(self._X) - 2)
        frac = (x - self._X[lo]) / (self._X[lo + 1] - self._X[lo])
        for index, share in ((lo, 1 - frac), (lo + 1, frac)):
            if share <= 0:
                continue
            # a plain mean (weighted by share) of the anchor's first measurements, then WEIGHT
            w = max(share / (self.weights[index] + share), (shape_weight or self.WEIGHT) * share)
            self.ratios[index] += w * (shape - self.ratios[index])
            if self.weights[index] == 0:
                at = bisect.bisect_left(self._seen, index)
                self._seen.insert(at, index)
                self._seen_x.insert(at, self._X[index])
            self.weights[index] += share
            self._last_measured[index] = self._measurements
        self._measurements += 1
        stale, fresh = [], []
        for index in self._seen:
            (stale if self._measurements - self._last_measured[index] > self.STALE_AFTER else fresh).append(index)
        if stale:
            level = sum(self.ratios[i] for i in fresh) / len(fresh) if fresh else 1.0
            for index in stale:
                self.ratios[index] += self.STALE_RELAX * (level - self.ratios[index])
                self.weights[index] *= 1.0 - self.STALE_RELAX

    def relax(self, rate: float) -> None:
        """Moves the speed and every shape correction ``rate`` of the way back to 1 (the profile):
        called while the table is not being measured (the drafter skipped), so that an estimate
        made high by measurements no longer current lets the drafter run, and be measured, again.
        A shared speed stays: the other tables keep measuring it."""
        if not self.shared_speed:
            self._speed.value += rate * (1.0 - self._speed.value)
        for index in self._seen:
            self.ratios[index] += rate * (1.0 - self.ratios[index])


@dataclass(frozen=True)
class BudgetProfile:
    """What the adaptive budget measured on this engine at start-up (``engine/step_profile.py``)."""

    step_costs: CostTable  # step seconds vs batch tokens
    draft_costs: CostTable  # the drafter's propose seconds vs requests drafted in one call, one position each
    fetch_s_per_page_layer: float = 0.0  # one host page of one layer into the hot pool; 0 without a host tier
    # seconds of each position asked beyond one per request vs requests drafted in one call (a
    # block drafter's heads run per asked position; measured at 4 requests on 2 cores: 0.35 ms
    # each, at 16: 0.21 ms, at 1: 0.7 ms); None: asked positions cost nothing extra
    draft_position_costs: CostTable | None = None
    # decode / verify attention of the profile's steps per step size and path, dense (key rows,
    # context rows, seconds), page-list (key rows, seconds) (``AttentionWork``;
    # ``spec/attention_costs.py``); none on either path: not measured, and ``step_costs`` holds
    # the attention
    dense_attention_points: tuple[tuple[int, int, float], ...] = ()
    page_list_attention_points: tuple[tuple[int, float], ...] = ()

    def draft_s_per_position(self, num_requests: int) -> float:
        """What one more asked position costs a call drafting for ``num_requests`` requests."""
        return 0.0 if self.draft_position_costs is None else self.draft_position_costs.seconds_at(num_requests)


def survival_from_acceptance_length(mean_length: float, draft_tokens: int) -> float:
    """The per-position survival ``p`` with ``1 + p + p^2 + ... + p^draft_tokens == mean_length``:
    a drafter's mean acceptance length on drafts of ``draft_tokens`` tokens (bonus included, as
    its held-out evaluation reports it) as the survival estimate the budget starts from.
    ``mean_length`` outside ``[1, 1 + draft_tokens]`` is an error."""
    if draft_tokens < 1 or not 1.0 <= mean_length <= 1.0 + draft_tokens:
        raise ValueError(f"a mean acceptance length of {mean_length} is impossible with {draft_tokens} draft tokens")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: the sum grows with p
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(draft_tokens + 1)) < mean_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_committed(confidences: list[float]) -> float:
    """1 (the bonus token) + expected accepted draft tokens, ``confidences[i]`` = P(position i
    survives | position i-1 survived)."""
    total, alive = 1.0, 1.0
    for p in confidences:
        alive *= p
        total += alive
    return total


@dataclass(frozen=True)
class DraftPlan:
    """The verify budget's choice for one step and what it expects of it."""

    lengths: list[int]  # draft tokens each request verifies
    expected_committed: float  # tokens the step commits in expectation (bonus tokens included)
    seconds: float  # what the step is priced at: target pass + fetches + the drafter's asks (+ its call)
    base_rate: float  # committed tokens per second of the same step without any draft

    @property
    def gain(self) -> float:
        """Expected committed tokens per second over ``base_rate``."""
        return self.expected_committed / max(self.seconds, 1e-12) / max(self.base_rate, 1e-12)


def choose_draft_lengths(confidences: list[list[float]], committed_base: int, tokens_base: int,
                         costs: CostTable | CalibratedCosts,
                         fetch_s_per_position: list[float] | None = None, draft_s: float = 0.0,
                         min_gain: float = 0.0, draft_s_per_position: float = 0.0,
                         attend_s_per_position: list[float] | None = None, base_extra_s: float = 0.0) -> list[int]:
    """``choose_draft_plan(...).lengths``."""
    return choose_draft_plan(confidences, committed_base, tokens_base, costs, fetch_s_per_position, draft_s,
                             min_gain, draft_s_per_position, attend_s_per_position, base_extra_s).lengths


def choose_draft_plan(confidences: list[list[float]], committed_base: int, tokens_base: int,
                      costs: CostTable | CalibratedCosts,
                      fetch_s_per_position: list[float] | None = None, draft_s: float = 0.0,
                      min_gain: float = 0.0, draft_s_per_position: float = 0.0,
                      attend_s_per_position: list[float] | None = None, base_extra_s: float = 0.0,
                      base_s: float | None = None, draft_s_per_request: float = 0.0) -> DraftPlan:
    """Draft lengths for all requests of a step at once, maximising the step's expected committed
    tokens per second: ``(committed_base + sum of accepted-position probabilities) /
    (step_s(tokens_base + verified draft tokens) + fetch seconds)``.

    ``confidences[r]``: request r's per-position survival probabilities (see
    ``expected_committed``); ``committed_base``: tokens the step commits with no draft at all (one
    per decoding request); ``tokens_base``: its batch tokens without drafts. Every request's draft
    costs every other request step time, so the lengths are chosen jointly: draft positions are
    taken in decreasing order of acceptance probability per marginal second (the step's slope
    plus the request's fetches; within a request that is position order), and the best prefix of
    that order wins (ties go to fewer tokens; the empty prefix, no
    speculation, is always a candidate). ``draft_s``: seconds charged once if any position is
    taken (the drafter's own forward, when it has not run yet), and ``draft_s_per_position`` for
    each position taken (what asking the drafter for one more position costs). ``min_gain``: drafts must
    promise at least this fraction more tokens per second than none (a margin for the noise of
    the estimates that picked them, and what the model leaves out). ``attend_s_per_position[r]``:
    the attention of one more query token of request r (``spec/attention_costs.py``; the table
    ``costs`` then prices the step without attention); ``base_extra_s``: what the step's tokens
    without drafts cost beyond the table (their attention and host fetches). ``base_s``: the
    measured seconds of the step without drafts, where known (it replaces ``base_extra_s``): every
    price is shifted by what it differs from the table's (the table keeps the marginal seconds of
    the drafted positions). ``draft_s_per_request``: seconds charged once per request that
    drafts (the positions it is asked for beyond its length: ``LENGTH_HEADROOM``)."""
    fetch = fetch_s_per_position or [0.0] * len(confidences)
    attend = attend_s_per_position or [0.0] * len(confidences)
    # marginal seconds of one more verified position of request r: the step's slope + its fetches
    # + its attention + asking the drafter for it
    slope = max((costs.seconds_at(tokens_base + 16) - costs.seconds_at(tokens_base)) / 16, 1e-9)
    price = [slope + f + a + draft_s_per_position for f, a in zip(fetch, attend)]
    heap = []  # (-P(position accepted) / its price, request, position index)
    for r, conf in enumerate(confidences):
        if conf:
            heapq.heappush(heap, (-conf[0] / (price[r] + draft_s_per_request), r, 0))
    alive = [1.0] * len(confidences)
    lengths = [0] * len(confidences)
    # position_s: the seconds the step costs beyond the table's (the base step's attention and
    # host fetches, or what the measured base differs by; the positions' fetches, attention and
    # the drafter's asks)
    expected, tokens = float(committed_base), tokens_base
    step_s = costs.seconds_at(tokens)
    position_s = base_extra_s if base_s is None else base_s - step_s
    base_rate = best_rate = expected / max(step_s + position_s, 1e-12)
    best = DraftPlan(list(lengths), expected, step_s + position_s, base_rate)
    # every position not taken yet could add at most its whole expectation, and a step with more
    # positions never costs less (the step is non-decreasing, the rest adds up, the drafter's
    # call is charged with the first): once even all of them at the seconds of now cannot beat
    # the best, or the minimum gain, no longer prefix can. At c=16, where no draft pays, this
    # stops after about one position per request instead of pricing all 7 of each
    left = sum(expected_committed(conf) - 1.0 for conf in confidences)
    bar = base_rate * (1 + min_gain)
    seconds = step_s + position_s + draft_s
    while heap:
        if (expected + left) / max(seconds, 1e-12) <= max(best_rate * (1 + 1e-9), bar * (1 - 1e-12)):
            break
        _, r, k = heapq.heappop(heap)
        alive[r] *= confidences[r][k]
        expected += alive[r]
        left -= alive[r]
        tokens += 1
        position_s += fetch[r] + attend[r] + draft_s_per_position + (draft_s_per_request if k == 0 else 0.0)
        lengths[r] = k + 1
        # a step with more tokens never costs less: a calibrated table can dip between anchors
        # measured at different times (a slow first decode step next to a fast prefill)
        step_s = max(step_s, costs.seconds_at(tokens))
        seconds = step_s + position_s + draft_s
        rate = expected / max(seconds, 1e-12)
        if rate > best_rate * (1 + 1e-9) and rate >= base_rate * (1 + min_gain):
            best_rate, best = rate, DraftPlan(list(lengths), expected, seconds, base_rate)
        if k + 1 < len(confidences[r]):
            heapq.heappush(heap, (-alive[r] * confidences[r][k + 1] / price[r], r, k + 1))
    return best


def choose_draft_length(confidences: list[float], other_tokens: int, costs: CostTable,
                        fetch_s_per_position: float = 0.0) -> int:
    """One request alone: the k in ``0..len(confidences)`` maximising E(k) /
    (step_s(other_tokens + 1 + k) + k * fetch_s_per_position); ties go to the shorter draft."""
    return choose_draft_lengths([confidences], 1, other_tokens + 1, costs, [fetch_s_per_position])[0]
