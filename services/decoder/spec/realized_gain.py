"""How much of the step time the adaptive verify budget promises a drafting step the step keeps to.

Before the drafter runs, the budget's gate (``engine/speculation.py``) promises a step
``expected`` committed tokens in ``priced`` seconds: the target pass from the calibrated step
table, the drafter's call and asked positions from its own table. Each table is corrected by what
it measures, but a step's price also leaves out what neither table sees: the budget's own
arithmetic, the verification's bookkeeping (the deferred context work the drafter does before
its call is priced at its measured average, ``context_s``). At concurrency 4 on a 2-core CPU
those unpriced parts, the context work then among them, summed to a loss: drafting steps
promised 1.26x the throughput of not drafting and delivered 0.89x.

So every drafting step also reports the ``seconds`` it took (the proposal, the drafter's call
included, plus the target pass). ``RealizedGain`` keeps moving averages of the seconds promised
and taken; their ratio is the share of the promised throughput the step's time allowed, and the
gate asks a draft to promise ``(1 + min_gain) / factor`` times the throughput of no draft: a
budget whose steps take 10% longer than priced needs a 10% larger promise to draft. Only a
shortfall is applied (``factor <= 1``).

The tokens a step commits are not held to the promise here: they are the survival estimates'
business (``spec/depth_survival.py``, ``ConfidenceCalibration``), each with a memory that suits
its noise. A step commits 1 token or 4 around a promise of 1.6, and a 10-step average of that
read 0.78 of the promise at c=1 (DFlash, 4 chat prompts) where the seconds were within 5% of
it: the raised bar then kept the drafter off 30% of the steps, where drafting paid 1.2x. While
the gate keeps the drafter off, nothing is measured, so the shortfall relaxes towards none each
skipped step and the drafter is probed again.

The tokens matter too. Before the call the gate predicts each request's draft from the pooled
survival per position. For a drafter with confidences (DSpark), calibrated confidences then cut
each draft where it is unsure, so a call yields less than the gate expected of an uncut draft
(at c=4, before the pooled profile counted cut positions, the gate expected 2.84 drafted tokens
per step to commit where the steps committed 1.25, drafted on 193 of 195 steps and delivered
0.89x of no speculation). So every call reports the drafted tokens the gate expected and the
calibrated survival the confidences kept (the plan after the call: its drafts' expected
commits), two decayed sums with ``TOKENS_MEMORY`` (~50 calls) of memory, and their ratio sets a
``survival_scale`` (at most 1) that the gate multiplies its survival by. Kept survival, not
committed tokens: the commits are the outcomes that the pooled profile and the confidence
calibration learn from already, and a scale learning them too counted every failure twice (a
run of failed drafts put the gate at 0.15 where one-token drafts survived 0.34 and paid 1.16x:
code_edit, c=1). The expectation is the one before the scale: against the scaled one, a scale
that corrected a bias would read as no bias and drift back (half-way, in the log: the square
root of the bias). A drafter without confidences has no cut: the gate's survival is the plan's.

**Plain steps too.** The base a draft is compared with, a plain step's price (the measured plain
steps' average, at most a little above the step table's price: ``GateSchedule.plain_s``), is also
in every drafting step's promise, so a base priced low reads as the drafting steps' shortfall.
Where the gate skipped or rested, the plain step that runs is held to the base as priced that
step (moving averages as the drafting steps'), and only the drafting steps' shortfall beyond the
plain steps' raises the bar: ``factor`` is their ratio. A slow spell slows both alike. On dense chat, plain
steps took 1.03x their base at c=1 (DSpark) and 1.05-1.14x at c=4; at c=1 a bar of 0.07-0.10 kept
DSpark's gate off 244 of 799 steps, among them a stretch of ~150 where its plans promised 1.06
and fixed two-token drafts ran 1.11x of plain. With the plain steps' shortfall taken out (c=4,
lockstep, 3 repeats, median speedup over none): DSpark adaptive 1.096 where 1.061 (fixed k=2
1.127), DFlash 1.158 where 1.062 (k=2 1.183); c=1 unchanged within the repeats' spread. The plain
steps' figure fades towards their base over drafting steps (``PLAIN_FADE``), so a spell that it
caught does not hold the bar down once the gate drafts again.

**Beyond the noise.** On this 2-core machine a step takes 0.8-1.6x its price now and then (c=1:
plain steps priced 44-47 ms took 37-76). Moving averages over ~10 steps of such times read a
shortfall of 5-10% in a spell where none lasts: at c=1 (dense chat, DSpark) three drafting steps
of 73-94 ms priced at 58 set a bar of 0.11 over plans promising 1.08-1.13, and the gate sat out
the next ~40 steps. So the shortfall counts only beyond its noise: each side keeps the spread of
its steps' log taken / priced seconds (as averaged), and ``factor`` is raised by
``NOISE_MARGIN`` standard errors of the two averages' log ratio (``noise``). A lasting shortfall
(the c=4 unpriced work above: 30%) is still learnt. Lockstep, 3 repeats, dense chat, median
speedup over none (paired adaptive / fixed k=2): c=1 DSpark 1.160 where 1.115 (k=2 1.158; paired
0.998 where 0.963); c=4 DSpark 1.119 where 1.111 (k=2 1.108), DFlash 1.122 where 1.091 (k=2
1.171; paired 0.969 where 0.939); c=16 DSpark 0.995 where 0.985, DFlash 0.945 where 0.959, the
trailing none 0.998 [0.979-1.019] (DFlash below none with either rule in that run; a day earlier,
without the margin, 1.01).

The ratio is shrunk towards 1 as if ``PRIOR_STEPS`` more calls had kept what the gate expected
(the Gamma-Poisson estimate of a rate multiplier, as ``RequestSurvival``'s), and skipped steps
age its evidence as they age the pooled profile's. Set outright by the first drafting step, the
scale once fell to its floor when that one draft failed (code_edit, DFlash and DSpark: survival
0.5 x 0.1), the gate skipped every step after it, and with nothing measured nothing moved it
again: the drafter stayed off for the engine's life.
"""

from __future__ import annotations

import math


class RealizedGain:
    # of the newest drafting step in each moving average (~10 steps of memory; the n-th step
    # weighs 1 / n while that is more: a plain mean of the first steps)
    WEIGHT = 0.1
    # one step counts as at most this factor slower, against its promise, than the recent steps'
    # taken / promised seconds (a preempted step, a page fault): a lasting shortfall is learnt
    # 25% a step, one slow step moves the bar at most ~2.5%. Clamped at 2x the promise instead,
    # ~2% of DSpark's drafting steps at c=1 (dense chat) took 85-175 ms where 45-60 were
    # promised, as plain steps do now and then on this machine; each lifted the required gain by
    # 0.03-0.10 over promises of 1.04-1.10, and the gate skipped the next ~60 steps while it
    # relaxed: drafting on 378 of 887 steps, 1.076x of no speculation where fixed two-token
    # drafts ran 1.176x; clamped at 1.25x, 671 of 720 and 1.172x (lockstep, 3 repeats)
    MAX_JUMP = 1.25
    # pseudo-steps that kept their promises, ahead of the first measured one: the first drafting
    # step after a prefill runs cold (new requests' rings, the prompt's context backlog, the
    # step's first reads of the new KV) and alone took 35.5 ms where 28.9 were promised (chat,
    # c=4, DSpark): as the whole estimate it asked later drafts for 26% more than no draft, and
    # the gate stayed off for ~30 steps where fixed 2-token drafts paid 1.2x
    PRIOR_KEPT_STEPS = 3

    PLAIN_FADE = 0.02  # of the plain steps' shortfall undone per drafting step
    # standard errors of the two averages' log ratio by which a shortfall must exceed their noise
    # to raise the bar (``factor``)
    NOISE_MARGIN = 1.0

    TOKENS_MEMORY = 0.98  # per drafter call, of the token sums (~50 calls of memory)
    PRIOR_STEPS = 4.0  # pseudo-calls that kept what the gate expected
    MIN_EXPECTED = 0.05  # drafted tokens the gate expects below which a call says nothing of the scale
    MIN_SCALE = 0.1

    def __init__(self):
        # moving averages over drafting steps of seconds promised / taken (a ratio of averages:
        # one slow step among ten fast ones weighs by its seconds, not by its ratio)
        self.promised_s = self.seconds = 0.0
        self.num_steps = 0
        self.plain_priced_s = self.plain_seconds = 0.0  # the same over plain steps where the gate skipped
        self.num_plain_steps = 0
        # per side, over the same steps: (mean, variance) of each step's log taken / priced as
        # averaged (clamped), a plain mean and variance, then moving ones at WEIGHT
        self._drafting_spread = self._plain_spread = (0.0, 0.0)
        self.context_s = 0.0  # moving average of a drafting step's steady context work (``observe``)
        # decayed sums over drafter calls of the drafted tokens the gate expected to commit, of
        # those the kept drafts are expected to commit, and of the calls themselves
        self.expected_tokens = self.kept_tokens = self.token_calls = 0.0

    @property
    def survival_scale(self) -> float:
        """Kept over expected drafted tokens of recent drafter calls, shrunk towards 1 by
        ``PRIOR_STEPS`` calls of the mean expectation, in ``[MIN_SCALE, 1]``: what the gate's
        pooled survival is multiplied by."""
        if self.token_calls == 0:
            return 1.0
        prior = self.PRIOR_STEPS * self.expected_tokens / self.token_calls
        scale = (self.kept_tokens + prior) / (self.expected_tokens + prior)
        return min(max(scale, self.MIN_SCALE), 1.0)

    def observe_tokens(self, expected: float, kept: float) -> None:
        """A drafter call's gate expected ``expected`` drafted tokens to commit (beyond one per
        request) at its survival before the scale; the drafts the call's plan kept are expected
        to commit ``kept`` (likewise)."""
        if expected < self.MIN_EXPECTED or kept < 0:
            return
        self.expected_tokens = self.TOKENS_MEMORY * self.expected_tokens + expected
        self.kept_tokens = self.TOKENS_MEMORY * self.kept_tokens + kept
        self.token_calls = self.TOKENS_MEMORY * self.token_calls + 1

    @staticmethod
    def steady_backlog_s(seconds: float, positions: int, expected_committed: float) -> float:
        """The share of a step's deferred context work (``seconds`` for ``positions`` context
        positions, ``Drafter.prepare``) that drafting every step would owe: the positions
        committed since the drafter last ran, about the step's ``expected_committed`` when it
        drafts every step, but a whole prompt at a request's first draft and a skipped stretch's
        tokens at a probe after it. Charged whole, a probe read as a step far dearer than priced
        and kept the gate off (code_edit, c=1: DSpark adaptive 1.03x of none where fixed
        one-token drafts ran 1.16x). Unknown positions (0): all of it."""
        return seconds * min(1.0, expected_committed / positions) if positions else seconds

    @property
    def factor(self) -> float:
        """The plain steps' taken / priced seconds over the drafting steps' taken / promised (each 1
        while unmeasured), raised by ``NOISE_MARGIN`` standard errors of that ratio, at most 1."""
        drafting = self.seconds / self.promised_s if self.num_steps else 1.0
        plain = self.plain_seconds / self.plain_priced_s if self.num_plain_steps else 1.0
        return min(plain / drafting * math.exp(self.NOISE_MARGIN * self.noise), 1.0)

    @property
    def noise(self) -> float:
        """The standard error of the averages' log ratio (``factor``) that the steps' spread
        gives: each side's variance over its effective number of steps (``n`` while a plain
        mean, ``(2 - WEIGHT) / WEIGHT`` for the moving one)."""
        variance = 0.0
        for (_, spread), num in ((self._drafting_spread, self.num_steps), (self._plain_spread, self.num_plain_steps)):
            if num:
                variance += spread * max(1.0 / num, self.WEIGHT / (2.0 - self.WEIGHT))
        return math.sqrt(variance)

    def required_gain(self, min_gain: float) -> float:
        """The fraction more than no draft's throughput a draft must promise: ``min_gain``
        scaled up by the shortfall."""
        return (1.0 + min_gain) / self.factor - 1.0

    def observe_plain(self, priced_s: float, seconds: float) -> None:
        """A plain step where the gate skipped, its base priced at ``priced_s``, took ``seconds``
        (clamped and averaged as a drafting step's)."""
        if priced_s <= 0 or seconds <= 0:
            raise ValueError("a plain step's price and duration must be positive")
        self.plain_priced_s, self.plain_seconds, self.num_plain_steps, self._plain_spread = self._averaged(
            self.plain_priced_s, self.plain_seconds, self.num_plain_steps, self._plain_spread, priced_s, seconds)

    def _averaged(self, promised_avg: float, seconds_avg: float, num: int, spread: tuple[float, float],
                  promised_s: float, seconds: float) -> tuple[float, float, int, tuple[float, float]]:
        """The moving averages of promised and taken seconds, their count and the spread of the
        steps' log ratio (mean, variance) after a step (``observe``'s rule)."""
        recent = seconds_avg / promised_avg if num else 1.0  # taken / promised
        seconds = min(seconds, promised_s * recent * self.MAX_JUMP)
        # the plain mean of the steps so far (and the prior's) until the moving average's memory
        # is full: when only the first step set the averages, the first drafting step of a cold
        # engine decided for the next ~50 (c=16, DSpark: the gate expected 2030 tokens where its
        # steps committed 1581, and the first decode read 0.84x of no speculation where the second 1.01x)
        if num == 0:  # the prior: steps that took what they were promised
            promised_avg = seconds_avg = promised_s
        w = max(1.0 / (num + 1 + self.PRIOR_KEPT_STEPS), self.WEIGHT)
        mean, variance = spread
        deviation, w_spread = math.log(seconds / promised_s) - mean, max(1.0 / (num + 1), self.WEIGHT)
        spread = (mean + w_spread * deviation, (1.0 - w_spread) * (variance + w_spread * deviation * deviation))
        return (promised_avg + w * (promised_s - promised_avg), seconds_avg + w * (seconds - seconds_avg), num + 1,
                spread)

    def observe(self, promised_s: float, seconds: float, context_s: float = 0.0) -> None:
        """A drafting step was priced at ``promised_s`` seconds and took ``seconds``, of which
        ``context_s`` was its share of the drafter's deferred context work (``steady_backlog_s``):
        its moving average, ``context_s``, is what the gate prices a drafting step's context work
        at, so the promise holds what the seconds taken hold. Left out of the promise, that work
        (1.5 ms of a 60 ms step at c=1, DSpark) read as a lasting shortfall of 3-5%, on top of
        which a slow spell lifted the required gain to 10-25% and the gate skipped 30% of the
        steps where fixed 2-token drafts paid 1.2x."""
        if promised_s <= 0 or seconds <= 0 or context_s < 0:
            raise ValueError("a drafting step's price and duration must be positive, its context share not negative")
        # a plain mean of the measured steps (no prior: nothing is known of the work before) until WEIGHT
        self.context_s += max(1.0 / (self.num_steps + 1), self.WEIGHT) * (context_s - self.context_s)
        self.promised_s, self.seconds, self.num_steps, self._drafting_spread = self._averaged(
            self.promised_s, self.seconds, self.num_steps, self._drafting_spread, promised_s, seconds)
        self.plain_seconds += self.PLAIN_FADE * (self.plain_priced_s - self.plain_seconds)

    def relax(self, rate: float) -> None:
        """A step the gate skipped: the seconds taken move ``rate`` of the way to those promised
        (the shortfall fades), and the token sums age by ``rate`` (the prior weighs more), so a
        gate that a shortfall or a low scale keeps off probes the drafter again."""
        self.seconds += rate * (self.promised_s - self.seconds)
        self.expected_tokens *= 1 - rate
        self.kept_tokens *= 1 - rate
        self.token_calls *= 1 - rate
