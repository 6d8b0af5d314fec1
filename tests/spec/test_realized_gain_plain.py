"""The realized-gain bar against the plain steps too: a base priced low is in every drafting
step's promise, so only the drafting steps' shortfall beyond the plain steps' raises the bar."""

import pytest

from services.decoder.spec.realized_gain import RealizedGain
from tests.spec.test_realized_gain import _one_request_speculator


def _steady(gain: RealizedGain, drafting_ratio: float, plain_ratio: float, steps: int = 60) -> None:
    for _ in range(steps):
        gain.observe_plain(0.040, 0.040 * plain_ratio)
        gain.observe(0.050, 0.050 * drafting_ratio)


def test_a_shortfall_common_to_plain_and_drafting_steps_leaves_the_bar_at_the_minimum():
    gain = RealizedGain()
    _steady(gain, 1.10, 1.10)  # a slow spell, or a base priced 10% low: both alike
    # (the fade after every drafting step holds the plain figure ~1.5% under its steps' 1.10)
    assert gain.factor == pytest.approx(1.0, abs=0.02)
    assert gain.required_gain(0.02) < 0.04
    unmeasured = RealizedGain()
    for _ in range(60):
        unmeasured.observe(0.050, 0.055)
    assert unmeasured.required_gain(0.02) > 0.1  # no plain step measured: the same drafting steps ask 12%
    drafting_only = RealizedGain()
    _steady(drafting_only, 1.10, 1.00)  # the drafting steps' own shortfall: 10% over the plain steps'
    assert drafting_only.factor == pytest.approx(1 / 1.10, rel=0.01)
    assert drafting_only.required_gain(0.02) == pytest.approx(1.02 * 1.10 - 1, abs=0.01)
    beyond = RealizedGain()
    _steady(beyond, 1.15, 1.05)
    assert beyond.factor == pytest.approx(1.05 / 1.15, rel=0.02)


def test_plain_steps_slower_than_drafting_ones_never_lower_the_bar_below_the_minimum():
    gain = RealizedGain()
    _steady(gain, 1.00, 1.20)
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)


def test_the_plain_shortfall_fades_over_drafting_steps():
    """A spell the plain steps caught while the gate was off fades over the drafting steps after
    it (``PLAIN_FADE`` of the gap each), so the drafting steps' own shortfall shows again."""
    gain = RealizedGain()
    for _ in range(60):
        gain.observe_plain(0.040, 0.048)  # 1.2x their base
    plain = gain.plain_seconds
    gain.observe(0.050, 0.050)
    assert gain.plain_seconds == pytest.approx(plain + RealizedGain.PLAIN_FADE * (0.040 - plain))
    for _ in range(200):
        gain.observe(0.050, 0.055)  # 10% over their promise, for a while
    assert gain.factor < 1 / 1.05


@pytest.mark.parametrize("args", [(0.0, 0.05), (0.05, 0.0), (-0.01, 0.05)])
def test_a_plain_price_or_duration_that_is_not_positive_is_refused(args):
    with pytest.raises(ValueError, match="positive"):
        RealizedGain().observe_plain(*args)


def test_a_step_the_gate_skipped_is_held_to_the_base_it_priced():
    """The gate prices its base at the empty plan's seconds; the plain step that runs after it
    skipped reports against that price; a step with a prefill chunk does not."""
    speculator, request, drafter = _one_request_speculator()
    for _ in range(400):
        speculator.depth.observe(1, 0)  # drafts that never survive: the gate skips
    speculator.propose([request])
    assert speculator.promise is None and speculator.schedule.num_skipped_steps == 1
    speculator.observe_step(1, 0.012, decoded=(1, 1))  # 12 ms where 10 were priced (the table)
    assert speculator.realized.num_plain_steps == 1
    assert speculator.realized.plain_seconds / speculator.realized.plain_priced_s == pytest.approx(
        (RealizedGain.PRIOR_KEPT_STEPS * 0.010 + 0.012) / (RealizedGain.PRIOR_KEPT_STEPS + 1) / 0.010)
    speculator.propose([request])
    speculator.observe_step(40, 0.5, decoded=None)  # a prefill chunk ran in the same pass
    assert speculator.realized.num_plain_steps == 1


def test_a_step_the_gate_rests_on_is_held_to_the_base_as_priced_at_its_last_ask():
    """While the gate rests (``GateSchedule.rests``: it asks only every few skipped steps) the
    plain steps between its asks report too, each against the base as the gate last priced it,
    and they are measured when it next asks (pricing the base afresh and measuring every rested
    step as it ran were most of what a never-drafting gate cost). Observed
    only where the gate asked, the plain figure held a stale base's for ~40 steps of rest after a
    drafting streak had priced the base high (c=4, DSpark: plain steps took 0.87 of it), and the
    bar it raised kept the gate off ~100 steps where drafting paid 1.12x of the plain steps."""
    from services.decoder.spec.gate_schedule import GateSchedule

    speculator, request, drafter = _one_request_speculator()
    for _ in range(400):
        speculator.depth.observe(1, 0)  # drafts that never survive: the gate skips
    asks, reported = [0], []
    worth, observe_plain = speculator._worth_the_drafter, speculator.realized.observe_plain
    speculator._worth_the_drafter = lambda *a: (asks.__setitem__(0, asks[0] + 1), worth(*a))[1]
    speculator.realized.observe_plain = lambda p, s: (reported.append(p), observe_plain(p, s))[1]
    steps = GateSchedule.REST_AFTER + 4 * GateSchedule.REST_EVERY
    held_to = []  # the base each step is held to
    for _ in range(steps):
        asked = asks[0]
        speculator.propose([request])
        if asks[0] > asked:
            base_s = speculator._base_s([request])  # the base as priced at the ask
            assert len(reported) == len(held_to)  # the steps before are measured now
        held_to.append(base_s)
        speculator.observe_step(1, 0.012, decoded=(1, 1))  # 12 ms where the table priced 10
    rested = GateSchedule.REST_EVERY - 1  # the last ask's steps, measured at the next one
    assert len(reported) == speculator.realized.num_plain_steps == steps - rested
    speculator.propose([request])
    assert asks[0] == GateSchedule.REST_AFTER + 5 and speculator.schedule.num_skipped_steps == steps + 1
    assert reported == pytest.approx(held_to)
    assert reported[-1] > reported[0] == pytest.approx(0.010)  # the base followed the measured steps
