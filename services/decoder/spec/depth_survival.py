"""A drafter's survival rate per draft position (depth), pooled over its verified drafts.

The adaptive verify budget needs, for every position it may verify, the probability that the
position survives given that its prefix did. A drafter with confidences (the block drafters)
says so per position; for one without (n-gram) the budget had a single running rate per request,
the same at every depth. A block drafter's later positions are much weaker than its first:
at concurrency 4 on chat prompts DFlash commits 1.43 tokens per verify step with one draft
token and 1.53 with two, so position 1 survives 43% of the time and position 2, given
position 1 did, 23%. One rate (~0.35 over that mix) made the second and third positions look
twice as good as they are, and the budget verified 2-3 tokens per request where one paid.

``DepthSurvival`` counts, at every depth, the verified positions whose prefix survived (the
*trials*) and those of them that survived, pooled over all requests, with counts beyond
``MAX_TRIALS`` scaled down so the profile follows a change of text. A depth's rate adds
``PRIOR_TRIALS`` pseudo-trials at the rate of the depth before it (depth 0: at the drafter's
prior), so a depth that drafts rarely reach reads like its shallower neighbour, not like a
guess. How a request's own drafts survive against it (its text may be copy-heavy, or not)
scales the pooled profile: ``rates(n, scale)``, the scale a ``RequestSurvival``. So each trial
counts as the scale its request was predicted at (survival = profile x scale: the profile's
estimate is survivals / summed scales): the budget
lets only its best requests reach the deeper positions, and counting their trials as 1 each read
DFlash's second position at c=4 as 0.38 where fixed 2-token drafts measure 0.21, a bias the
request's scale then applied a second time.

What ``relax`` takes from the counts is not dropped: it moves to a long-run pool per depth, whose
rate (shrunk towards the depth's prior as above, with ``LONG_PRIOR_TRIALS`` pseudo-trials) is what
the relaxed counts shrink towards; the pool itself fades ``LONG_RELAX_SHARE`` times as fast.
Relaxed towards the drafter's prior instead, the estimates that kept the gate off reached
break-even again within 12-16 skipped steps, whatever the drafts before had found: DFlash on code_edit at c=1 (sparse), where a one-token
draft costs ~24% of a step and survives ~19%, was probed that often at depth-0 estimates
relaxed to 0.27-0.42, 3 of 36 probes survived, and a lucky one started a streak of 8 drafting
steps (51-91 drafting steps: 0.969-0.973x of no speculation, fixed one-token drafts 0.978x).
With the pool it drafted on 14-18 of 386 steps. With 4 pseudo-trials the pool also kept a bad
start: DSpark's first chat drafts (c=1) left it at 0.30-0.35 at depth 0 and the gate off for
~250 steps where fixed two-token drafts paid 1.19x (adaptive 1.054x); with 16, 1.120x against
fixed 1.153x, as without the pool (1.121x).
"""

from __future__ import annotations

import math


class DepthSurvival:
    PRIOR_TRIALS = 4.0
    MAX_TRIALS = 400.0
    MAX_RATE = 0.99  # a scaled rate never reads as certain survival
    # the long-run pool's prior weighs this many trials: what relaxing moved there bends the
    # estimates the gate probes at only once it adds up to more evidence than one bad stretch
    LONG_PRIOR_TRIALS = 16.0
    LONG_RELAX_SHARE = 0.125  # of ``relax``'s rate at which the long-run pool fades (~280 skipped steps to half at 2%)

    def __init__(self, prior: float, max_depth: int):
        if not 0.0 <= prior <= 1.0 or max_depth < 1:
            raise ValueError(f"prior must be in [0, 1] and max_depth >= 1 (got {prior}, {max_depth})")
        self.prior = prior
        self.trials = [0.0] * max_depth  # observed, per depth
        self.survived = [0.0] * max_depth
        self.long_trials = [0.0] * max_depth  # what ``relax`` took from the counts, fading slower
        self.long_survived = [0.0] * max_depth

    def observe(self, num_drafted: int, num_accepted: int, scale: float = 1.0) -> None:
        """A verified draft of ``num_drafted`` positions whose first ``num_accepted`` survived:
        positions ``0 .. num_accepted`` were tried (the one after the accepted prefix failed,
        unless the draft ended first), later ones were not. ``scale``: what the request's
        survival was predicted at relative to the profile (each trial counts as that much)."""
        if not 0 <= num_accepted <= num_drafted:
            raise ValueError(f"accepted {num_accepted} of {num_drafted} drafted positions")
        if scale <= 0:
            raise ValueError(f"scale must be positive, not {scale}")
        for depth in range(min(num_accepted + 1, num_drafted, len(self.trials))):
            self._count(depth, scale, 1.0 if depth < num_accepted else 0.0)

    def impute(self, start_depth: int, rates: list[float]) -> None:
        """Positions ``start_depth ..`` of a draft that the budget cut before verification, at
        their predicted survival ``rates`` (a drafter's calibrated confidences): each counts as a
        trial weighted by the chance that its prefix would have survived, surviving at its rate.
        A drafter with confidences lets only its sure stretches reach verification, and counting
        those alone read DSpark's second and third depths at 0.63-0.65 given the depth before
        (c=1, chat): the gate, which predicts a draft before the confidences cut it, then
        expected more than the steps committed, scaled every depth down for it (0.6-0.7, the
        first one too, which fixed one-token drafts measure at 0.46) and skipped 20-40% of the
        steps where one-token drafts paid 1.25x."""
        alive = 1.0
        for depth, rate in zip(range(start_depth, len(self.trials)), rates):
            self._count(depth, alive, alive * rate)
            alive *= rate

    def _count(self, depth: int, trials: float, survived: float) -> None:
        self.trials[depth] += trials
        self.survived[depth] += survived
        self._cap(self.trials, self.survived, depth)

    def _cap(self, trials: list[float], survived: list[float], depth: int) -> None:
        """Scales ``depth``'s counts (the profile's or the long-run pool's) down to ``MAX_TRIALS``."""
        if trials[depth] > self.MAX_TRIALS:
            keep = self.MAX_TRIALS / trials[depth]
            trials[depth] *= keep
            survived[depth] *= keep

    def expected(self, num_drafted: int, num_accepted: int) -> float:
        """The survivals the profile (unscaled) expects of a verified draft's tried positions
        (``observe``): the sum of their rates."""
        tried = min(num_accepted + 1, num_drafted)
        return sum(self.rates(tried)) if tried else 0.0

    def unmeasured(self) -> bool:
        """Fewer trials at depth 0 (the long-run pool's too) than its prior's pseudo-trials: the
        profile is mostly a guess."""
        return self.trials[0] + self.long_trials[0] < self.PRIOR_TRIALS

    def relax(self, rate: float, times: int = 1) -> None:
        """Moves ``rate`` of every depth's counts to its long-run pool, and fades the pool by
        ``rate * LONG_RELAX_SHARE`` (a step where no draft could pay for the drafter): the
        estimates move towards the long-run rates, and those towards the prior, so a profile
        made low by text no longer current lets the drafter be tried again after a while.
        ``times``: that many such steps at once (the pool capped after the last)."""
        if times < 1:
            raise ValueError(f"times must be >= 1, not {times}")
        drop, keep = 1 - rate, 1 - rate * self.LONG_RELAX_SHARE
        # pool_n = keep^n pool + rate counts sum_{i<n} drop^i keep^(n-i) (the counts fade by drop a step)
        counts_share = rate * keep * (keep**times - drop**times) / (keep - drop) if keep != drop else (
            rate * times * keep**times)
        for depth in range(len(self.trials)):
            self.long_trials[depth] = keep**times * self.long_trials[depth] + counts_share * self.trials[depth]
            self.long_survived[depth] = keep**times * self.long_survived[depth] + counts_share * self.survived[depth]
            self.trials[depth] *= drop**times
            self.survived[depth] *= drop**times
            self._cap(self.long_trials, self.long_survived, depth)

    def rates(self, num_positions: int, scale: float = 1.0, optimism: float = 0.0) -> list[float]:
        """Survival of positions ``0 .. num_positions - 1`` (the deepest counted depth's rate
        beyond it), each times ``scale`` and at most ``MAX_RATE``. ``optimism``: depth 0 raised by
        that many standard errors of its estimate (``first_error``), after the scale."""
        profile, previous = [], self.prior
        for trials, survived, long_trials, long_survived in zip(self.trials, self.survived, self.long_trials,
                                                                self.long_survived):
            long_run = (long_survived + self.LONG_PRIOR_TRIALS * previous) / (long_trials + self.LONG_PRIOR_TRIALS)
            previous = (survived + self.PRIOR_TRIALS * long_run) / (trials + self.PRIOR_TRIALS)
            profile.append(previous)
        rates = [profile[min(i, len(profile) - 1)] * scale for i in range(num_positions)]
        if rates and optimism:
            rates[0] += optimism * self.first_error(profile[0])
        return [min(rate, self.MAX_RATE) for rate in rates]

    def first_error(self, rate: float | None = None) -> float:
        """The standard error of depth 0's rate (``rate``: that estimate, if computed already),
        ``sqrt(p (1 - p) / n)`` over its trials and prior pseudo-trials: what ``relax`` moves to
        the long-run pool no longer vouches for the rate, so it widens while the drafter rests."""
        rate = self.rates(1)[0] if rate is None else rate
        return math.sqrt(rate * (1.0 - rate) / (self.trials[0] + self.PRIOR_TRIALS))


class RequestSurvival:
    """How a request's drafts survive relative to the pooled profile (``scale``), the ratio of its
    observed survivals to the survivals the profile expected of the same trials, shrunk towards
    1 (the Gamma-Poisson estimate of a rate multiplier):

        scale = (observed + PRIOR) / (expected + PRIOR)

    Measured on the shipped DFlash drafter's fixed 2-token drafts of 4 chat prompts at c=1 (316
    verify steps): whether a step accepts anything does not depend on the steps before it
    (P(accepted > 0) 0.48 after a step that accepted, 0.46 after one that did not; 0.41 after 5
    in a row that did not), but the prompts differ (0.44 to 0.90 accepted tokens per step, a
    spread of about 30% around the mean). So a request's evidence is kept long
    (``MEMORY`` per verify step) and a short run of rejections moves it little: the earlier
    running rate (10 verify steps of memory, no shrinkage) dropped below break-even by chance
    and kept the drafter off for the rest of an answer where always drafting paid 1.22x.
    ``PRIOR`` is in expected survivals: a spread of 30% is a Gamma shape of about 1 / 0.3^2.
    A step that verifies none of the request's draft ages its evidence (``AGE``), so an estimate
    that keeps it off moves back towards the profile and it is tried again."""

    MEMORY = 0.95
    PRIOR = 10.0
    AGE = 0.02

    def __init__(self, observed: float = 0.0, expected: float = 0.0):
        if observed < 0 or expected < 0:
            raise ValueError(f"survival counts must be >= 0 (got {observed}, {expected})")
        self.observed, self.expected = observed, expected

    @property
    def scale(self) -> float:
        return (self.observed + self.PRIOR) / (self.expected + self.PRIOR)

    def update(self, num_accepted: int, expected: float) -> None:
        """A verified draft: ``num_accepted`` positions survived where the profile (unscaled)
        expected ``expected`` of the positions tried (``DepthSurvival.expected``)."""
        self.observed = self.MEMORY * self.observed + num_accepted
        self.expected = self.MEMORY * self.expected + expected

    def idle(self) -> None:
        self.observed *= 1 - self.AGE
        self.expected *= 1 - self.AGE
