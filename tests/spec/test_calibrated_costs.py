"""``CalibratedCosts``: a profiled cost table corrected by what serving measures, and the
``MachineSpeed`` the engine's step and drafter tables share."""

import pytest

from services.decoder.spec.verify_budget import CalibratedCosts, CostTable

FLAT = CostTable((1, 64), (0.010, 0.010))  # 10 ms at every count


def test_tables_sharing_the_machine_speed_keep_their_ratio_through_a_slow_spell():
    """A step table and a drafter table on one ``MachineSpeed``, both measured as profiled at
    first. Then a spell in which the target's steps run 1.5x their price: the speed takes it (the
    shape only its small share), so the drafter's price rises with the step's and the gate's
    drafter-to-step ratio barely moves, where a drafter table with a speed of its own keeps its
    price and looks ~1.5x cheaper against the step."""
    from services.decoder.spec.verify_budget import MachineSpeed

    speed = MachineSpeed()
    steps, drafter = CalibratedCosts(FLAT, speed), CalibratedCosts(FLAT, speed)
    alone = CalibratedCosts(FLAT)
    for table in (steps, drafter, alone):
        table.observe(4 if table is steps else 1, 0.010)
    for _ in range(60):
        steps.observe(4, 0.015)
    assert steps.seconds_at(4) == pytest.approx(0.015, rel=0.01)
    assert drafter.speed == steps.speed == speed.value and speed.value > 1.4
    assert drafter.seconds_at(1) / steps.seconds_at(4) == pytest.approx(1.0, abs=0.05)  # was 1.0
    assert alone.seconds_at(1) / steps.seconds_at(4) == pytest.approx(1 / 1.5, rel=0.01)
    drafter.relax(0.5)  # a skipped step: the drafter's shape relaxes, the shared speed stays
    assert steps.seconds_at(4) == pytest.approx(0.015, rel=0.01)


def test_one_measurement_moves_a_cost_at_most_twofold_and_skipping_relaxes_it():
    """A first drafter call that paid for a GEMM pack build (4x its usual cost) must not set the
    estimate outright: a budget that then never drafts would never measure it again. A
    measurement counts as at most 2x off the current estimate, and while the drafter is skipped
    the correction relaxes back towards the profile."""
    costs = CalibratedCosts(CostTable((1, 16), (0.010, 0.010)))
    w, ws = CalibratedCosts.WEIGHT, CalibratedCosts.SPEED_WEIGHT
    costs.observe(1, 0.040)
    assert costs.seconds_at(1) == pytest.approx(0.020)  # 2x, not 4x (speed 2^ws, the shape the rest)
    assert costs.speed == pytest.approx(2.0**ws)
    costs.observe(1, 0.040)  # 4x is in range now: the speed takes its share, the shape averages in
    speed = 2.0**ws * 2.0**ws
    shape = 2.0 / 2.0**ws + w * (4.0 / speed - 2.0 / 2.0**ws)
    assert costs.speed == pytest.approx(speed)
    assert costs.seconds_at(1) == pytest.approx(0.010 * speed * shape)
    costs.relax(0.5)
    assert costs.ratio_at(1) == pytest.approx((1 + 0.5 * (speed - 1)) * (1 + 0.5 * (shape - 1)))
    for _ in range(300):
        costs.relax(0.1)
    assert costs.seconds_at(1) == pytest.approx(0.010)
    costs.observe(1, 0.001)  # downwards: at most half
    speed = 0.5**ws
    assert costs.seconds_at(1) == pytest.approx(0.010 * speed * (1 + w * (0.5 / speed - 1)))
