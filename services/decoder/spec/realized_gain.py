"""How much of the throughput the adaptive verify budget promises a drafting step the step delivers.

Before the drafter runs, the budget's gate (``engine/speculation.py``) promises a step
``expected`` committed tokens in ``priced`` seconds: the target pass from the calibrated step
table, the drafter's call and asked positions from its own table. Each table is corrected by what
it measures, but a step's promise also rests on what neither table sees: the survival estimates
that picked the lengths, the deferred context work the drafter does before its call, the
verification's bookkeeping, and how the step table's error at the drafting step's size relates
to its error at the size of the same step without drafts (the anchors are corrected by
measurements of both, on a machine whose neighbours come and go). At concurrency 4 on a 2-core
CPU those unpriced parts summed to a loss: drafting steps promised 1.26x the throughput of not
drafting and delivered 0.89x.

So every drafting step also reports what it delivered: ``committed`` tokens in ``seconds`` (the
proposal, the drafter's call included, plus the target pass). ``RealizedGain`` keeps moving
averages of the tokens and seconds promised and delivered, their ratio is the delivered share of
the promised tokens per second, and the gate asks a draft to
promise ``(1 + min_gain) / factor`` times the throughput of no draft: a budget whose promises fall
short by 10% needs a 10% larger promise to draft. Only a shortfall is applied (``factor <= 1``):
steps that beat their promises only offset shortfalls in the averages, and a drafter that keeps
its promises is gated by the tables alone. While the gate keeps the drafter off, nothing is
measured, so the shortfall relaxes towards none each skipped step and the drafter is probed
again.
"""

from __future__ import annotations


class RealizedGain:
    WEIGHT = 0.1  # of the newest drafting step in each moving average (~10 steps of memory)
    MAX_SLOWDOWN = 2.0  # one step counts as at most 2x its promised seconds (a preempted step, a page fault)

    def __init__(self):
        # moving averages over drafting steps of tokens promised / committed and seconds promised /
        # taken; a ratio of averages, not an average of per-step ratios: one request's step commits
        # 1 token or 5 around a promise of 2.4, and the mean log of such ratios sits well below 0
        # for a gate that keeps its promises on average (c=1: it read 0.75 where 0.97 was true)
        self.promised_committed = self.committed = 0.0
        self.promised_s = self.seconds = 0.0
        self.num_steps = 0

    @property
    def factor(self) -> float:
        """Delivered / promised throughput of recent drafting steps, at most 1."""
        if self.num_steps == 0:
            return 1.0
        delivered = (self.committed / self.promised_committed) * (self.promised_s / self.seconds)
        return min(delivered, 1.0)

    def required_gain(self, min_gain: float) -> float:
        """The fraction more than no draft's throughput a draft must promise: ``min_gain``
        scaled up by the shortfall."""
        return (1.0 + min_gain) / self.factor - 1.0

    def observe(self, promised_committed: float, promised_s: float, committed: int, seconds: float) -> None:
        """A drafting step promised ``promised_committed`` tokens in ``promised_s`` seconds and
        committed ``committed`` tokens in ``seconds``."""
        if promised_committed <= 0 or promised_s <= 0 or seconds <= 0:
            raise ValueError("a drafting step's promise and its duration must be positive")
        seconds = min(seconds, promised_s * self.MAX_SLOWDOWN)
        # the first step sets the averages; later ones average in
        w = 1.0 if self.num_steps == 0 else self.WEIGHT
        self.promised_committed += w * (promised_committed - self.promised_committed)
        self.committed += w * (committed - self.committed)
        self.promised_s += w * (promised_s - self.promised_s)
        self.seconds += w * (seconds - self.seconds)
        self.num_steps += 1

    def relax(self, rate: float) -> None:
        """Moves what was delivered ``rate`` of the way to what was promised (a step the gate
        skipped): the shortfall fades."""
        self.committed += rate * (self.promised_committed - self.committed)
        self.seconds += rate * (self.promised_s - self.seconds)
