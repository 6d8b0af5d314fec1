"""A drafter's per-position confidences mapped to the survival rates verification measures
(DSpark's confidence head, calibrated while serving; the verify budget reads the mapped values)."""

from __future__ import annotations


class ConfidenceCalibration:
    """A drafter's per-position confidences mapped to the survival rates verification measures.

    A confidence head trained on one distribution can be far off on another (the shipped DSpark
    head says 0.57 at position 1 on hand-written chat where 0.27 survive), and the budget trusts
    the confidences it is given: an overconfident head makes it verify drafts that cost more than
    they commit. So every verified position whose prefix survived (a *trial*) is counted in the
    bin of its confidence (``BINS`` equal bins on [0, 1]), with whether it survived; a bin's rate
    is survived / trials, starting from ``PRIOR_TRIALS`` pseudo-trials at the bin's centre
    (identity: a head is trusted until measured), and counts beyond ``MAX_TRIALS`` are scaled
    down so the map follows a change of text. ``__call__`` interpolates between bin centres and
    keeps the map non-decreasing (a higher confidence never reads as a lower survival)."""

    BINS = 10
    PRIOR_TRIALS = 4.0
    MAX_TRIALS = 400.0

    def __init__(self):
        self.centres = [(b + 0.5) / self.BINS for b in range(self.BINS)]
        self.trials = [self.PRIOR_TRIALS] * self.BINS
        self.survived = [c * self.PRIOR_TRIALS for c in self.centres]

    def _bin(self, confidence: float) -> int:
        return min(max(int(confidence * self.BINS), 0), self.BINS - 1)

    def observe(self, confidences: list[float], num_accepted: int) -> None:
        """A verified draft: ``confidences`` of the positions verified, ``num_accepted`` of them
        accepted (a prefix); positions after the first rejection were never tried."""
        for i, confidence in enumerate(confidences[: num_accepted + 1]):
            b = self._bin(confidence)
            self.trials[b] += 1.0
            self.survived[b] += 1.0 if i < num_accepted else 0.0
            if self.trials[b] > self.MAX_TRIALS:
                scale = self.MAX_TRIALS / self.trials[b]
                self.trials[b] *= scale
                self.survived[b] *= scale

    def rates(self) -> list[float]:
        """Each bin's survival rate, made non-decreasing by pooling adjacent violators (the
        trial-weighted isotonic fit: a noisy bin does not lift or sink its neighbours alone)."""
        blocks: list[list[float]] = []  # [survived, trials, bins]
        for survived, trials in zip(self.survived, self.trials):
            blocks.append([survived, trials, 1])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                s, t, n = blocks.pop()
                blocks[-1][0] += s
                blocks[-1][1] += t
                blocks[-1][2] += n
        return [s / t for s, t, n in blocks for _ in range(int(n))]

    def __call__(self, confidences: list[float]) -> list[float]:
        rates, centres = self.rates(), self.centres
        out = []
        for c in confidences:
            x = min(max(c, centres[0]), centres[-1])
            lo = min(int((x - centres[0]) * self.BINS), self.BINS - 2)
            frac = (x - centres[lo]) * self.BINS
            out.append(rates[lo] + (rates[lo + 1] - rates[lo]) * frac)
        return out
