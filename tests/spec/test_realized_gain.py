"""The adaptive budget's check of its own prices: drafting steps that take longer than the gate
priced them at raise the gain a draft must promise; skipped steps relax it."""

import pytest

from services.decoder.spec.realized_gain import RealizedGain
from services.decoder.spec.verify_budget import BudgetProfile, CostTable
from tests.spec.test_verify_budget_costs import _decoding_request


def test_the_factor_is_promised_over_taken_seconds_from_moving_averages():
    gain = RealizedGain()
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    gain.observe(0.050, 0.080)  # priced at 50 ms, took 80
    assert gain.factor == pytest.approx(0.625)
    assert gain.required_gain(0.02) == pytest.approx(1.02 / 0.625 - 1)
    # the first steps make a plain mean: 50 / ((80 + 50) / 2) ms
    gain.observe(0.050, 0.050)
    assert gain.factor == pytest.approx(0.050 / 0.065)
    assert gain.num_steps == 2
    for _ in range(8):  # 10 steps: the mean's weight has come down to WEIGHT
        gain.observe(0.050, 0.050)
    assert gain.seconds == pytest.approx(0.053)
    gain.observe(0.050, 0.080)  # from now on each step averages in at WEIGHT
    assert gain.seconds == pytest.approx(0.9 * 0.053 + 0.1 * 0.080)


def test_a_step_faster_than_its_price_offsets_a_shortfall_but_never_lowers_the_bar():
    gain = RealizedGain()
    gain.observe(0.010, 0.005)  # twice as fast as priced
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    gain.observe(0.010, 0.015)  # the averages show (5 + 15) / 2 = 10 ms of 10
    assert gain.factor == 1.0
    for _ in range(30):
        gain.observe(0.010, 0.020)  # twice the price, for a while: the shortfall shows
    assert gain.factor < 0.6


def test_one_step_counts_as_at_most_a_twofold_slowdown_and_skipping_relaxes_the_shortfall():
    gain = RealizedGain()
    gain.observe(0.050, 0.500)  # a preempted step: 10x its promised seconds
    assert gain.seconds == pytest.approx(0.100) and gain.factor == pytest.approx(0.5)
    gain.relax(0.02)
    assert gain.seconds == pytest.approx(0.100 + 0.02 * (0.050 - 0.100))
    assert gain.factor == pytest.approx(0.050 / gain.seconds)


@pytest.mark.parametrize("args", [(0.0, 0.05), (0.05, 0.0), (-0.01, 0.05)])
def test_a_promise_or_duration_that_is_not_positive_is_refused(args):
    with pytest.raises(ValueError, match="positive"):
        RealizedGain().observe(*args)


def _one_request_speculator():
    """A speculator over a memory-bound step (10 ms at any size) and a drafter priced at nothing,
    one request decoding at running survival 0.5, one draft position: the gate promises 1.5
    tokens in 10 ms, 1.5x the throughput of no draft."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.drafter import Draft, Drafter

    class Fixed(Drafter):
        name = "fixed"
        prior_acceptance = 0.5
        calls = 0

        def propose_batch(self, requests):
            Fixed.calls += 1
            return [Draft([7] * r.max_tokens) for r in requests]

    request = _decoding_request()  # one pending token: it decodes next
    speculator = Speculator(Fixed(), spec_tokens=1)
    speculator.schedule.CONTROL_EVERY = 10**6  # no control steps: these tests count drafting steps in a row
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (0.0, 0.0)))
    return speculator, request, Fixed


def test_a_gate_whose_steps_overrun_their_price_stops_drafting_and_probes_again_later(monkeypatch):
    import services.decoder.engine.speculation as speculation

    clock = [0.0]
    monkeypatch.setattr(speculation.time, "perf_counter", lambda: clock[0])
    speculator, request, drafter = _one_request_speculator()
    unpriced_s = [0.0]  # what the drafter's deferred context work takes (no table prices it)
    monkeypatch.setattr(drafter, "prepare", lambda self, ids: clock.__setitem__(0, clock[0] + unpriced_s[0]))
    promised_gain = 1.5
    step_s = 0.010  # what the table says and what the target pass takes: its calibration stays put
    # steps that take what they were priced at: the drafter runs every step and the bar stays put
    for _ in range(5):
        speculator.propose([request])
        assert speculator.promise.expected_committed == pytest.approx(1.5)
        assert speculator.promise.seconds == pytest.approx(step_s)
        assert speculator.promise.gain == pytest.approx(promised_gain)
        # the draft survives: what was committed keeps the survival scale at 1 (its own test below)
        speculator.observe_step(2, step_s, decoded=(1, 2))
    assert drafter.calls == 5 and speculator.realized.factor == pytest.approx(1.0)
    # proposals that take 5 ms more than priced: once the factor falls below 1.02 / 1.5, the
    # promise no longer clears the raised bar and the drafter stops
    unpriced_s[0] = 0.005
    threshold = promised_gain / (1 + speculator.MIN_GAIN)
    steps = 0
    while speculator.realized.factor * threshold >= 1.0:
        speculator.propose([request])
        assert speculator.promise is not None
        speculator.observe_step(2, step_s, decoded=(1, 2))
        steps += 1
    # the seconds average rises from 10 ms towards 15, the n-th drafting step weighing
    # max(1 / n, WEIGHT) of the gap, until it passes 10 * threshold ms
    taken_ms, n, want = 10.0, 5, 0
    while 10.0 / taken_ms * threshold >= 1.0:
        n += 1
        taken_ms += max(1 / n, RealizedGain.WEIGHT) * (15.0 - taken_ms)
        want += 1
    assert steps == want and want > 2
    calls = drafter.calls
    speculator.propose([request])
    assert drafter.calls == calls and speculator.promise is None and speculator.schedule.num_skipped_steps == 1
    speculator.observe_step(1, 0.010, decoded=(1, 1))  # a plain step reports nothing to the check
    # each skipped step relaxes the shortfall by COST_RELAX until the promise clears the bar again
    skipped = 1
    while drafter.calls == calls:
        speculator.propose([request])
        speculator.observe_step(1, 0.010, decoded=(1, 1))
        skipped += 1
    assert speculator.realized.factor * threshold >= 1.0
    assert skipped == speculator.schedule.num_skipped_steps + 1  # the probe itself drafted


def test_a_step_with_other_requests_or_a_prefill_chunk_is_not_held_to_the_promise():
    speculator, request, _ = _one_request_speculator()
    speculator.propose([request])
    speculator.observe_step(40, 0.5, decoded=None)  # a prefill chunk ran in the same pass
    speculator.propose([request])
    speculator.observe_step(3, 0.5, decoded=(2, 1))  # a request the gate did not see
    assert speculator.realized.num_steps == 0 and speculator.realized.factor == 1.0


def _shrunk(committed: float, expected: float, steps: float) -> float:
    """The survival scale of token sums: committed over expected, shrunk towards 1 by
    PRIOR_STEPS steps of the mean expectation (written out here as the oracle)."""
    prior = RealizedGain.PRIOR_STEPS * expected / steps
    return (committed + prior) / (expected + prior)


def test_the_survival_scale_is_committed_over_expected_drafted_tokens_shrunk_towards_one():
    gain = RealizedGain()
    m = RealizedGain.TOKENS_MEMORY
    assert gain.survival_scale == 1.0
    gain.observe_tokens(2.0, 0)  # the gate expected 2 drafted tokens to commit, the step committed none
    # one failed step is one step of evidence against PRIOR_STEPS steps that committed what was expected
    assert gain.survival_scale == pytest.approx(RealizedGain.PRIOR_STEPS / (1 + RealizedGain.PRIOR_STEPS))
    gain.observe_tokens(4.0, 1)
    assert gain.survival_scale == pytest.approx(_shrunk(1, m * 2 + 4, m + 1))
    gain.observe_tokens(0.01, 0)  # the gate expected next to nothing: no evidence either way
    assert gain.token_steps == pytest.approx(m + 1)
    for _ in range(400):  # 1 of 3 each: the sums fill to ~50 steps and the prior weighs 4 of 54
        gain.observe_tokens(3.0, 1)
    steps = (1 - m ** 402) / (1 - m)
    assert gain.survival_scale == pytest.approx((steps + 4 * 3) / (3 * steps + 4 * 3), rel=1e-3)
    assert 1 / 3 < gain.survival_scale < 0.4
    for _ in range(500):
        gain.observe_tokens(1.0, 3)  # committing more than expected never raises it past 1
    assert gain.survival_scale == 1.0
    for _ in range(1000):
        gain.observe_tokens(1.0, 0)
    assert gain.survival_scale == RealizedGain.MIN_SCALE


def test_skipped_steps_age_the_survival_scales_evidence_so_it_returns_towards_one():
    gain = RealizedGain()
    for _ in range(100):
        gain.observe_tokens(2.0, 0)  # a drafter that commits nothing: the scale at its floor
    assert gain.survival_scale == RealizedGain.MIN_SCALE
    sums = (gain.committed_tokens, gain.expected_tokens, gain.token_steps)
    gain.relax(0.02)
    assert (gain.committed_tokens, gain.expected_tokens, gain.token_steps) == pytest.approx(
        tuple(0.98 * x for x in sums))
    scales = [gain.survival_scale]
    for _ in range(300):
        gain.relax(0.02)
        scales.append(gain.survival_scale)
    assert scales == sorted(scales) and scales[-1] > 0.95
    assert scales[-1] == pytest.approx(_shrunk(0.0, 2.0 * sums[2] * 0.98 ** 301, sums[2] * 0.98 ** 301))


def test_a_gate_for_a_drafter_with_confidences_scales_its_pooled_survival_by_what_its_steps_committed():
    """DSpark-like: the gate predicts from the pooled survival; steps that commit less than it
    expected scale the next gate's survival down (a drafter without confidences: its own test below)."""
    request = _decoding_request()
    speculator = _confident_speculator(spec_tokens=3)
    assert speculator._gate_survival(request, 3) == pytest.approx(speculator.depth.rates(3))
    speculator.propose([request])
    expected = speculator.promise.expected_committed - 1
    assert expected > 0.5
    speculator.observe_step(4, 0.010, decoded=(1, 1))  # nothing drafted survived
    one_failure = RealizedGain.PRIOR_STEPS / (1 + RealizedGain.PRIOR_STEPS)
    assert speculator.realized.survival_scale == pytest.approx(one_failure)
    scaled = speculator.depth.rates(3, one_failure)
    assert speculator._gate_survival(request, 3) == pytest.approx(scaled)


def _confident_speculator(spec_tokens: int = 1):
    """A speculator over a memory-bound step (10 ms at any size) whose drafter says 0.9 at every
    position (pooled prior 0.8), without control steps."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.drafter import Draft, Drafter

    class Confident(Drafter):
        name = "confident"
        prior_acceptance = 0.8
        has_confidences = True

        def propose_batch(self, requests):
            return [Draft([7] * r.max_tokens, [0.9] * r.max_tokens) for r in requests]

    speculator = Speculator(Confident(), spec_tokens=spec_tokens)
    speculator.schedule.CONTROL_EVERY = 10**6
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (0.0, 0.0)))
    return speculator


def test_the_survival_scale_is_measured_against_the_unscaled_expectation_so_it_holds_once_it_corrects():
    """One-token drafts the pooled profile expects to survive at 0.8 commit every other time: the
    scale settles at 0.5 / 0.8, shrunk towards 1 by the prior's 4 steps of ~50. Measured against
    the already-scaled expectation it would read the corrected estimate as no bias and settle at
    the square root of that (0.79)."""
    speculator = _confident_speculator()
    request = _decoding_request()
    unscaled = speculator.depth.rates(1)[0]
    for step in range(400):
        speculator.propose([request])
        assert speculator.promise is not None  # 0.5 survival still pays in a memory-bound step
        speculator.observe_step(2, 0.010, decoded=(1, 1 + step % 2))
    steps = speculator.realized.token_steps
    assert steps == pytest.approx(50, abs=0.1)
    settled = _shrunk(0.5 * steps, unscaled * steps, steps)
    assert speculator.realized.survival_scale == pytest.approx(settled, abs=0.02)
    speculator.propose([request])  # the gate now expects what the steps commit, shrunk alike
    assert speculator.promise.expected_committed - 1 == pytest.approx(unscaled * settled, abs=0.02)
    assert speculator.promise.expected_committed - 1 == pytest.approx(0.5, abs=0.03)


def test_a_gate_without_confidences_scales_the_requests_survival_by_what_its_steps_committed():
    speculator, request, _ = _one_request_speculator()
    own = speculator._scale(request)
    assert speculator._gate_survival(request, 1) == pytest.approx(speculator.depth.rates(1, own))
    speculator.propose([request])
    assert speculator.promise.expected_committed == pytest.approx(1.5)
    speculator.observe_step(2, 0.010, decoded=(1, 1))  # the drafted token did not survive
    one_failure = RealizedGain.PRIOR_STEPS / (1 + RealizedGain.PRIOR_STEPS)
    assert speculator.realized.survival_scale == pytest.approx(one_failure)
    scaled = speculator.depth.rates(1, own * one_failure)
    assert speculator._gate_survival(request, 1) == pytest.approx(scaled)
    assert speculator._gate_survival(request, 1, scaled=False) == pytest.approx(speculator.depth.rates(1, own))


def test_a_first_draft_that_fails_keeps_the_drafter_off_for_a_while_not_for_the_engines_life(monkeypatch):
    """A 2-token step costs 1.65x a 1-token one: a one-token draft pays from survival 0.683, a
    scale of 0.854 on the drafter's prior (0.8). The prior drafts the first step, its draft fails,
    the scale reads 0.8 (one step against the prior's 4), and the gate skips.
    The clock stands still: the step's priced seconds are what it takes. The scale once fell to its floor on that one step and nothing moved it
    again (code_edit, DFlash and DSpark never drafted after their first step); now the skipped
    steps age the evidence and the drafter is probed again."""
    import services.decoder.engine.speculation as speculation

    monkeypatch.setattr(speculation.time, "perf_counter", lambda: 0.0)
    speculator = _confident_speculator()
    speculator.profile = BudgetProfile(CostTable((1, 2, 64), (0.010, 0.0165, 0.2)), CostTable((1, 16), (0.0, 0.0)))
    request = _decoding_request()
    speculator.propose([request])
    assert speculator.promise is not None
    speculator.observe_step(2, 0.0165, decoded=(1, 1))  # the draft failed
    calls = speculator.num_drafter_calls
    for _ in range(200):
        speculator.propose([request])
        if speculator.num_drafter_calls > calls:
            break
        speculator.observe_step(1, 0.010, decoded=(1, 1))
    assert speculator.num_drafter_calls == calls + 1
    # 4 / (0.98^n + 4) >= 0.854 after n = 19 skipped steps; resting after 8, the gate asks every 4th
    assert speculator.realized.factor == 1.0
    assert 19 <= speculator.schedule.num_skipped_steps < 19 + speculator.schedule.REST_EVERY


def test_a_backlog_of_more_positions_than_a_step_commits_is_charged_at_one_steps_share(monkeypatch):
    """The drafter's deferred context work covers the positions committed since it last ran: a
    whole prompt at a request's first draft, a skipped stretch after a probe. Drafting every step
    owes about one step's committed tokens of it, and that share is what the realized check
    charges; charged whole, a probe after a skip read as a step 4x its price."""
    import services.decoder.engine.speculation as speculation

    clock = [0.0]
    monkeypatch.setattr(speculation.time, "perf_counter", lambda: clock[0])
    speculator, request, drafter = _one_request_speculator()
    positions = [150]

    def prepare(self, request_ids):
        clock[0] += 0.030  # 30 ms of context projection
        return positions[0]

    monkeypatch.setattr(drafter, "prepare", prepare)
    speculator.propose([request])
    assert speculator.promise.expected_committed == pytest.approx(1.5)
    speculator.observe_step(2, 0.010, decoded=(1, 2))
    assert speculator.realized.seconds == pytest.approx(0.010 + 0.030 * 1.5 / 150)
    positions[0] = 1  # fewer positions than the step expects to commit: charged whole
    speculator.propose([request])
    speculator.observe_step(2, 0.010, decoded=(1, 2))
    taken = min(0.010 + 0.030, RealizedGain.MAX_SLOWDOWN * 0.010)
    assert speculator.realized.seconds == pytest.approx((0.010 + 0.030 * 1.5 / 150 + taken) / 2)
