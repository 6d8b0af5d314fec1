"""A drafter's per-position confidences mapped to the survival rates verification measures
(DSpark's confidence head, DFlash's and DFlash2's softmax probability of each pick; calibrated
while serving; the verify budget reads the mapped values)."""

from __future__ import annotations


class ConfidenceCalibration:
    """A drafter's per-position confidences mapped to the survival rates verification measures,
    per draft depth.

    A confidence head trained on one distribution can be far off on another (the shipped DSpark
    head says 0.57 at position 1 on hand-written chat where 0.27 survive), and the budget trusts
    the confidences it is given: an overconfident head makes it verify drafts that cost more than
    they commit. So every verified position whose prefix survived (a *trial*) is counted in the
    bin of its confidence (``BINS`` equal bins on [0, 1]) of its depth's map, with whether it
    survived, and counts beyond ``MAX_TRIALS`` are scaled down so the map follows a change of
    text. ``__call__`` interpolates between bin centres and keeps each map non-decreasing (a
    higher confidence never reads as a lower survival).

    Why per depth: how far off the head is depends on the depth. On the code_edit prompts
    (DSpark, fixed 7-token drafts, 4 prompts) the first position survived 77% of the time at
    confidences 0.8-1.0, and the second, given the first did, 0 of 6 times at the same
    confidences; on chat both read ~0.8. One map for all depths priced the deep positions of
    code at the first's rate, and the budget verified 3-4 tokens where one paid (c=1: 0.99 of
    no speculation, 0.94 of fixed one-token drafts). A depth's bin starts from ``PRIOR_TRIALS``
    pseudo-trials at the rate of the depth before it (depth 0: the bin's centre, identity: a head
    is trusted until measured), so a depth that drafts rarely reach reads like its shallower
    neighbour; depths from ``DEPTHS - 1`` on share the last map."""

    BINS = 10
    DEPTHS = 3
    PRIOR_TRIALS = 4.0
    MAX_TRIALS = 400.0

    def __init__(self):
        self.centres = [(b + 0.5) / self.BINS for b in range(self.BINS)]
        # measured counts per depth map and bin (the priors are added when read)
        self.trials = [[0.0] * self.BINS for _ in range(self.DEPTHS)]
        self.survived = [[0.0] * self.BINS for _ in range(self.DEPTHS)]
        self._rates: list[list[float]] | None = None  # per depth, until the next observation

    def _bin(self, confidence: float) -> int:
        return min(max(int(confidence * self.BINS), 0), self.BINS - 1)

    def observe(self, confidences: list[float], num_accepted: int) -> None:
        """A verified draft: ``confidences`` of the positions verified, ``num_accepted`` of them
        accepted (a prefix); positions after the first rejection were never tried."""
        for depth, confidence in enumerate(confidences[: num_accepted + 1]):
            at = min(depth, self.DEPTHS - 1)
            trials, survived = self.trials[at], self.survived[at]
            b = self._bin(confidence)
            trials[b] += 1.0
            survived[b] += 1.0 if depth < num_accepted else 0.0
            if trials[b] > self.MAX_TRIALS:
                scale = self.MAX_TRIALS / trials[b]
                trials[b] *= scale
                survived[b] *= scale
        self._rates = None

    def rates(self, depth: int = 0) -> list[float]:
        """Each bin's survival rate at ``depth``, made non-decreasing by pooling adjacent
        violators (the trial-weighted isotonic fit: a noisy bin does not lift or sink its
        neighbours alone)."""
        if self._rates is None:
            self._rates, prior = [], self.centres
            for trials, survived in zip(self.trials, self.survived):
                prior = _isotonic([s + self.PRIOR_TRIALS * p for s, p in zip(survived, prior)],
                                  [t + self.PRIOR_TRIALS for t in trials])
                self._rates.append(prior)
        return self._rates[min(depth, self.DEPTHS - 1)]

    def best(self, depth: int) -> float:
        """The highest survival any confidence maps to at ``depth`` (the top bin's)."""
        return self.rates(depth)[-1]

    def __call__(self, confidences: list[float]) -> list[float]:
        """The survival of each position of a draft (position i at depth i)."""
        centres = self.centres
        out = []
        for depth, c in enumerate(confidences):
            rates = self.rates(depth)
            x = min(max(c, centres[0]), centres[-1])
            lo = min(int((x - centres[0]) * self.BINS), self.BINS - 2)
            frac = (x - centres[lo]) * self.BINS
            out.append(rates[lo] + (rates[lo + 1] - rates[lo]) * frac)
        return out


def _isotonic(survived: list[float], trials: list[float]) -> list[float]:
    """The non-decreasing rates closest to ``survived / trials`` bin by bin, trial-weighted
    (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [survived, trials, bins]
    for s, t in zip(survived, trials):
        blocks.append([s, t, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s2, t2, n = blocks.pop()
            blocks[-1][0] += s2
            blocks[-1][1] += t2
            blocks[-1][2] += n
    return [s / t for s, t, n in blocks for _ in range(int(n))]
