"""The calibrated step costs the adaptive verify budget prices steps by: what serving measures
corrects the start-up profile (``CalibratedCosts``: the machine's speed times a shape per count)."""

import pytest

from services.decoder.spec.verify_budget import CalibratedCosts, CostTable, choose_draft_lengths
from tests.spec.test_verify_budget import FLAT, STEEP

def test_calibrated_costs_follow_what_serving_measures():
    costs = CalibratedCosts(FLAT)  # profiled: 10 ms at every count
    assert costs.seconds_at(64) == pytest.approx(0.010)  # nothing measured yet: the profile
    for _ in range(2000):  # (one measurement moves an anchor at most 2x, and the shape learns at WEIGHT)
        costs.observe(8, 0.010)  # serving: 8-token steps take 10 ms ...
        costs.observe(64, 0.080)  # ... and 64-token steps (drafts verified) 80 ms
    assert costs.seconds_at(8) == pytest.approx(0.010) and costs.seconds_at(64) == pytest.approx(0.080)
    assert costs.seconds_at(16) == pytest.approx(0.010 * (1 + 7 / 3))  # log2 16 is a third of the way
    assert costs.seconds_at(1) == pytest.approx(0.010) and costs.seconds_at(512) == pytest.approx(0.080)
    # 8 requests drafting 7 each: free by the profile; by what serving measured, even one draft
    # token each (8.8 tokens in 14 ms) commits less per second than none (8 in 10 ms)
    assert choose_draft_lengths([[0.8] * 7] * 8, 8, 8, FLAT) == [7] * 8
    assert choose_draft_lengths([[0.8] * 7] * 8, 8, 8, costs) == [0] * 8
    for _ in range(200):
        costs.observe(2, 100.0)  # absurd measurements are clipped to 10x the profile
    assert costs.seconds_at(2) == pytest.approx(0.100)


def test_an_anchor_not_measured_for_a_while_follows_the_machines_speed():
    """The gate compares a step with drafts (4 batch tokens at c=1) against the same step without
    (1). While every step drafts, only the 4-token anchor is measured; when the machine slows down
    by 30%, the 1-token price must slow down with it, or every draft looks 30% better than it is."""
    table = CostTable((1, 4), (0.010, 0.012))
    costs = CalibratedCosts(table)
    for _ in range(int(1 / costs.WEIGHT)):  # both anchors past the plain mean of their first measurements
        costs.observe(1, 0.010)
        costs.observe(4, 0.012)
    for _ in range(100):  # slower, measured at 4 tokens only
        costs.observe(4, 0.012 * 1.3)
    assert costs.seconds_at(4) == pytest.approx(0.012 * 1.3, rel=1e-3)
    # measured at one count, a slowdown cannot be told from a change of shape there: the speed
    # takes about WEIGHT / (WEIGHT + SPEED_WEIGHT) less than all of it (1.3^0.91: 2.3% short)
    assert costs.seconds_at(1) == pytest.approx(0.010 * 1.3, rel=0.03)
    assert costs.seconds_at(4) / costs.seconds_at(1) == pytest.approx(1.2, rel=0.03)


def test_a_count_measured_rarely_is_priced_at_the_mean_of_its_measurements_not_its_first():
    """A drafter's occasional probes are the only steps of their size (4 tokens at c=1 while the
    gate mostly skips): its price must follow what they take on average, while the speed follows
    the 1-token steps around them. Keeping the first measurement (a fast one here, moved 1% per
    step after it) priced them 7% low after 40 probes, and the speed took the rest (1-token
    steps 1.5% high)."""
    table = CostTable((1, 4), (0.010, 0.010))
    costs = CalibratedCosts(table)
    costs.observe(1, 0.010)
    costs.observe(4, 0.010)  # the first probe ran fast
    for _ in range(40):
        for _ in range(8):
            costs.observe(1, 0.010)
        costs.observe(4, 0.012)  # the probes take 12 ms
    assert costs.seconds_at(1) == pytest.approx(0.010, rel=0.01)
    # the mean of 41 probes, one of them 10 ms: 11.95 ms
    assert costs.seconds_at(4) == pytest.approx((0.010 + 40 * 0.012) / 41, rel=0.01)


def test_a_count_priced_high_by_a_slow_spell_and_not_measured_again_returns_to_the_profile():
    """The gate verifies a step size only where its price pays, so a size priced high is never
    measured again to correct it: probes of 4 tokens measured during a spell (3x slower steps)
    must not keep their price once the steps around them run at the profile's speed again; and
    when 4-token steps are measured again, their price follows them at once (a fresh mean)."""
    costs = CalibratedCosts(CostTable((1, 4), (0.010, 0.012)))
    for _ in range(100):
        costs.observe(1, 0.010)
    for _ in range(3):
        costs.observe(4, 0.036)  # the spell's probes
    assert costs.seconds_at(4) > 1.5 * 0.012
    for _ in range(300):
        costs.observe(1, 0.010)
    assert costs.seconds_at(1) == pytest.approx(0.010, rel=0.01)
    assert costs.seconds_at(4) == pytest.approx(0.012, rel=0.05)  # stale: relaxed to the profile
    for _ in range(3):
        costs.observe(1, 0.010)
        costs.observe(4, 0.013)
    assert costs.seconds_at(4) == pytest.approx(0.013, rel=0.03)


def test_calibrated_interpolation_matches_a_brute_force_reading_of_the_anchors():
    """ratio_at: the speed times the measured anchors (``ANCHOR_COUNTS``) around log2 of the
    count's pad, linearly on the log2 axis; the nearest one beyond them; 1 with none (read from
    ``ratios``/``weights`` directly here)."""
    import math
    import random

    rng = random.Random(5)
    padded = CostTable(STEEP.counts, STEEP.seconds, ((3, 4), (5, 8)))  # 3 runs as 4 rows, 5 as 8
    costs = CalibratedCosts(padded)
    xs = [math.log2(c) for c in costs.ANCHOR_COUNTS]
    for _ in range(60):
        costs.observe(rng.choice([1, 3, 5, 6, 7, 12, 40, 300, 5000]), rng.uniform(0.001, 0.5))
        seen = [i for i, w in enumerate(costs.weights) if w > 0]
        assert not {2, 4} & set(seen)  # counts 3 and 5 measure the anchors of 4 and 8
        for count in (1, 2, 3, 4, 5, 6, 7, 8, 13, 40, 100, 300, 1000, 5000, 10**6):
            x = min(math.log2(padded.padded(count)), xs[-1])
            below, above = [i for i in seen if xs[i] <= x], [i for i in seen if xs[i] >= x]
            if not below or not above:
                want = costs.ratios[(below or above)[-1 if below else 0]]
            elif below[-1] == above[0]:
                want = costs.ratios[below[-1]]
            else:
                lo, hi = below[-1], above[0]
                want = costs.ratios[lo] + (costs.ratios[hi] - costs.ratios[lo]) * (x - xs[lo]) / (xs[hi] - xs[lo])
            assert costs.ratio_at(count) == pytest.approx(costs.speed * want)


def test_a_count_between_powers_of_two_is_priced_by_its_own_measurements():
    """Measured on this CPU: a 3-token step 37.1 ms, 2 tokens 30.2, 4 tokens 35.7 (the GEMM plan's
    3-row kernel is slower than its 4-row one). The profile's table cannot say so (a smaller step
    is never profiled dearer than a larger one); the calibration must learn it, or the budget
    prices 3 between 2 and 4 and verifies 2-token drafts where 1-token ones pay more."""
    table = CostTable((1, 2, 3, 4), (0.030, 0.030, 0.035, 0.035), ((1, 2),))
    costs = CalibratedCosts(table)
    for _ in range(30):
        for count, seconds in ((2, 0.0302), (3, 0.0371), (4, 0.0357)):
            costs.observe(count, seconds)
    assert costs.seconds_at(3) == pytest.approx(0.0371, rel=0.02)
    assert costs.seconds_at(3) > costs.seconds_at(4) > costs.seconds_at(2)
    assert costs.seconds_at(1) == costs.seconds_at(2)  # 1 token runs as 2 rows: measured by 2-token steps
    # DFlash at c=1: the first position survives 0.5, the second 0.23 given the first; an
    # attention of 1 ms per query token. One draft token pays; a second does not at 3's price
    assert choose_draft_lengths([[0.5, 0.23, 0.2]], 1, 1, costs, attend_s_per_position=[0.001]) == [1]
