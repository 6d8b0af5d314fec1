"""The adaptive budget's check of its own prices: drafting steps that take longer than the gate
priced them at raise the gain a draft must promise; skipped steps relax it."""

import pytest

from services.decoder.spec.realized_gain import RealizedGain
from services.decoder.spec.verify_budget import BudgetProfile, CostTable
from tests.spec.test_depth_survival import measured_at_prior
from tests.spec.test_verify_budget_costs import _decoding_request


def test_the_factor_is_promised_over_taken_seconds_from_moving_averages():
    gain = RealizedGain()
    gain.NOISE_MARGIN = 0.0  # the averages alone (their noise margin: its own tests)
    prior = RealizedGain.PRIOR_KEPT_STEPS
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    gain.observe(0.050, 0.060)  # priced at 50 ms, took 60 (within MAX_JUMP): one step against the prior's kept ones
    assert gain.factor == pytest.approx(0.050 / ((prior * 0.050 + 0.060) / (prior + 1)))
    assert gain.required_gain(0.02) == pytest.approx(1.02 / gain.factor - 1)
    # the first steps make a plain mean with the prior's: (3 x 50 + 60 + 50) / 5 ms
    gain.observe(0.050, 0.050)
    assert gain.factor == pytest.approx(0.050 / ((prior * 0.050 + 0.060 + 0.050) / (prior + 2)))
    assert gain.num_steps == 2
    seconds = 0.050 + 0.010 / (prior + 2)  # the plain mean's excess over the price
    for n in range(2, 10):  # 10 steps: the weight 1 / (steps + prior) has come down to WEIGHT
        gain.observe(0.050, 0.050)
        seconds += max(1 / (n + 1 + prior), RealizedGain.WEIGHT) * (0.050 - seconds)
    assert gain.seconds == pytest.approx(seconds)
    seconds = gain.seconds
    gain.observe(0.050, 0.060)  # from now on each step averages in at WEIGHT
    assert gain.seconds == pytest.approx(0.9 * seconds + 0.1 * 0.060)


def test_one_slow_first_step_does_not_set_the_bar_alone():
    """The first drafting step after a prefill runs cold: alone, 35.5 ms taken of 28.9 promised
    asked later drafts for 26% more than no draft; against the prior's kept steps it asks ~7%."""
    gain = RealizedGain()
    gain.observe(0.0289, 0.0355)
    assert 0.05 < gain.required_gain(0.02) < 0.08


def test_a_step_faster_than_its_price_offsets_a_shortfall_but_never_lowers_the_bar():
    gain = RealizedGain()
    gain.observe(0.010, 0.005)  # twice as fast as priced
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    gain.observe(0.010, 0.015)  # the averages show (5 + 15) / 2 = 10 ms of 10
    assert gain.factor == 1.0
    for _ in range(30):
        gain.observe(0.010, 0.020)  # twice the price, for a while: the shortfall shows
    assert gain.factor < 0.6


def test_one_step_counts_as_at_most_max_jump_over_the_recent_shortfall_and_skipping_relaxes_it():
    gain = RealizedGain()
    gain.observe(0.050, 0.500)  # a preempted step: 10x its promised seconds
    prior = RealizedGain.PRIOR_KEPT_STEPS  # counted as 1.25 x 50 ms, against the prior's kept 50 ms steps
    assert gain.seconds == pytest.approx(0.050 + 0.050 * (RealizedGain.MAX_JUMP - 1) / (prior + 1))
    assert gain.factor == pytest.approx(0.050 / gain.seconds)
    seconds = gain.seconds
    gain.relax(0.02)
    assert gain.seconds == pytest.approx(seconds + 0.02 * (0.050 - seconds))
    assert gain.factor == pytest.approx(0.050 / gain.seconds)


def test_one_slow_step_among_kept_promises_lifts_the_bar_little():
    """~2% of drafting steps on a 2-core CPU take 2-3x their price, as plain steps do now and
    then; clamped at 2x the promise, one lifted the required gain from 0.02 to ~0.12 and the gate
    sat out ~60 steps where drafting paid. Counted as 1.25x the recent shortfall, it moves the
    bar by at most WEIGHT x 25%."""
    gain = RealizedGain()
    gain.NOISE_MARGIN = 0.0  # the clamp alone (the step's spread lowers the bar further)
    for _ in range(20):
        gain.observe(0.050, 0.050)
    gain.observe(0.050, 0.150)
    assert gain.required_gain(0.02) == pytest.approx(1.02 * (1 + RealizedGain.WEIGHT * (RealizedGain.MAX_JUMP - 1)) - 1)
    assert gain.required_gain(0.02) < 0.05


@pytest.mark.parametrize("args", [(0.0, 0.05), (0.05, 0.0), (-0.01, 0.05)])
def test_a_promise_or_duration_that_is_not_positive_is_refused(args):
    with pytest.raises(ValueError, match="positive"):
        RealizedGain().observe(*args)


def _one_request_speculator(spec_tokens: int = 1):
    """A speculator over a memory-bound step (10 ms at any size) and a drafter priced at nothing,
    one request decoding at running survival 0.5, ``spec_tokens`` draft positions (one: the gate
    promises 1.5 tokens in 10 ms, 1.5x the throughput of no draft)."""
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
    speculator = Speculator(Fixed(), spec_tokens=spec_tokens)
    speculator.schedule.CONTROL_EVERY = 10**6  # no control steps: these tests count drafting steps in a row
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (0.0, 0.0)))
    return speculator, request, Fixed


def test_a_gate_whose_steps_overrun_their_price_stops_drafting_and_probes_again_later(monkeypatch):
    import services.decoder.engine.speculation as speculation

    clock = [0.0]
    monkeypatch.setattr(speculation.time, "perf_counter", lambda: clock[0])
    speculator, request, drafter = _one_request_speculator()
    speculator.realized.NOISE_MARGIN = 0.0  # the averages alone: the count below follows them
    unpriced_s = [0.0]  # what the drafter's call takes beyond its price (its table, profiled at 0 s, learns nothing)
    propose_batch = drafter.propose_batch

    def slow_propose_batch(self, requests):
        clock[0] += unpriced_s[0]
        return propose_batch(self, requests)

    monkeypatch.setattr(drafter, "propose_batch", slow_propose_batch)
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
    # drafter calls that take 5 ms more than priced: once the factor falls below 1.02 / 1.5, the
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
        # a step counts as at most MAX_JUMP x the recent taken / promised seconds (10 ms promised)
        counted_ms = min(15.0, RealizedGain.MAX_JUMP * taken_ms)
        taken_ms += max(1 / (n + RealizedGain.PRIOR_KEPT_STEPS), RealizedGain.WEIGHT) * (counted_ms - taken_ms)
        want += 1
    assert steps == want and want > 2
    calls = drafter.calls
    speculator.propose([request])
    assert drafter.calls == calls and speculator.promise is None and speculator.schedule.num_skipped_steps == 1
    speculator.observe_step(1, 0.010, decoded=(1, 1))  # a plain step at its base: the plain ratio stays 1
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


def _shrunk(kept: float, expected: float, calls: float) -> float:
    """The survival scale of token sums: kept over expected, shrunk towards 1 by PRIOR_STEPS
    calls of the mean expectation (written out here as the oracle)."""
    prior = RealizedGain.PRIOR_STEPS * expected / calls
    return (kept + prior) / (expected + prior)


def test_the_survival_scale_is_kept_over_expected_drafted_tokens_shrunk_towards_one():
    gain = RealizedGain()
    m = RealizedGain.TOKENS_MEMORY
    assert gain.survival_scale == 1.0
    gain.observe_tokens(2.0, 0)  # the gate expected 2 drafted tokens to commit, the call's plan kept none
    # one call is one call of evidence against PRIOR_STEPS calls that kept what was expected
    assert gain.survival_scale == pytest.approx(RealizedGain.PRIOR_STEPS / (1 + RealizedGain.PRIOR_STEPS))
    gain.observe_tokens(4.0, 1)
    assert gain.survival_scale == pytest.approx(_shrunk(1, m * 2 + 4, m + 1))
    gain.observe_tokens(0.01, 0)  # the gate expected next to nothing: no evidence either way
    assert gain.token_calls == pytest.approx(m + 1)
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
    sums = (gain.kept_tokens, gain.expected_tokens, gain.token_calls)
    gain.relax(0.02)
    assert (gain.kept_tokens, gain.expected_tokens, gain.token_calls) == pytest.approx(
        tuple(0.98 * x for x in sums))
    scales = [gain.survival_scale]
    for _ in range(300):
        gain.relax(0.02)
        scales.append(gain.survival_scale)
    assert scales == sorted(scales) and scales[-1] > 0.95
    assert scales[-1] == pytest.approx(_shrunk(0.0, 2.0 * sums[2] * 0.98 ** 301, sums[2] * 0.98 ** 301))


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
    # one step's share (1.5 of 150 positions), against the prior's steps that kept their price
    assert speculator.realized.seconds == pytest.approx(0.010 + 0.030 * 1.5 / 150 / (RealizedGain.PRIOR_KEPT_STEPS + 1))
    positions[0] = 1  # fewer positions than the step expects to commit: charged whole
    speculator.propose([request])
    speculator.observe_step(2, 0.010, decoded=(1, 2))
    share_s = 0.030 * 1.5 / 150
    # the second step's promise holds the first one's context share (``test_the_context_work...``)
    recent = (0.010 + share_s / (RealizedGain.PRIOR_KEPT_STEPS + 1)) / 0.010  # the first step's taken / promised
    taken = min(0.010 + 0.030, RealizedGain.MAX_JUMP * recent * (0.010 + share_s))
    prior = RealizedGain.PRIOR_KEPT_STEPS  # the plain mean of the prior's steps and both
    assert speculator.realized.seconds == pytest.approx((prior * 0.010 + 0.010 + share_s + taken) / (prior + 2))


def test_the_context_work_a_drafting_step_owes_is_priced_and_not_read_as_a_shortfall(monkeypatch):
    """The drafter's deferred context work (2 ms a step, one step's share of it each time) is in
    the seconds a drafting step takes; its moving average is in the gate's price of the next
    drafting step too, so the promise holds it: the promised gain is that of a 12 ms step (1.5
    tokens in 12 ms over 1 in 10), not the 1.5x of a 10 ms one, and only the first step, priced
    before any context work was measured, shows as a shortfall (fading)."""
    import services.decoder.engine.speculation as speculation

    clock = [0.0]
    monkeypatch.setattr(speculation.time, "perf_counter", lambda: clock[0])
    speculator, request, drafter = _one_request_speculator()

    def prepare(self, request_ids):
        clock[0] += 0.002
        return 1  # one position: fewer than a step commits, so charged whole

    monkeypatch.setattr(drafter, "prepare", prepare)
    speculator.propose([request])
    assert speculator.promise.seconds == pytest.approx(0.010)  # nothing measured yet
    speculator.observe_step(2, 0.010, decoded=(1, 2))
    assert speculator.realized.context_s == pytest.approx(0.002)
    for _ in range(5):
        speculator.propose([request])
        assert speculator.promise.seconds == pytest.approx(0.012)
        assert speculator.promise.gain == pytest.approx(1.5 * 0.010 / 0.012)
        speculator.observe_step(2, 0.010, decoded=(1, 2))
    # taken 12 ms where promised 12: what is left of the shortfall is the first step's, fading
    prior = RealizedGain.PRIOR_KEPT_STEPS
    gap_s = speculator.realized.seconds - speculator.realized.promised_s
    assert gap_s == pytest.approx(0.002 / (prior + 1) * _decay(prior, 5), rel=1e-6)


def _decay(prior: int, steps: int) -> float:
    """What is left of a gap in the moving averages after ``steps`` more steps that kept their
    price (the n-th step weighs max(1 / (n + prior), WEIGHT))."""
    left = 1.0
    for n in range(2, steps + 2):
        left *= 1 - max(1 / (n + prior), RealizedGain.WEIGHT)
    return left


def _confident_speculator(confidences: list[float], spec_tokens: int):
    """A speculator whose step costs 10 ms plus 1 ms per token beyond the first and whose drafter
    is free and says ``confidences`` (pooled prior 0.8), without control steps."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.drafter import Draft, Drafter

    class Confident(Drafter):
        name = "confident"
        prior_acceptance = 0.8
        has_confidences = True

        def propose_batch(self, requests):
            return [Draft([7] * r.max_tokens, confidences[: r.max_tokens]) for r in requests]

    speculator = Speculator(Confident(), spec_tokens=spec_tokens)
    speculator.GATE_OPTIMISM = 0.0  # these tests hold the gate to its point estimate
    speculator.schedule.CONTROL_EVERY = 10**6
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.073)), CostTable((1, 16), (0.0, 0.0)))
    measured_at_prior(speculator.depth)
    return speculator


def test_the_survival_scale_is_what_the_confidences_kept_of_the_gates_unscaled_expectation():
    """The gate expects three positions at the pooled prior (0.8 each); the drafter is sure of the
    first only (0.9, 0.1, 0.1), and the plan after the call keeps one. The scale reads what was
    kept against what the gate expected before any scale, and the verified outcome, which the
    pooled profile and the calibration learn from, leaves it alone."""
    from services.decoder.spec.verify_budget import expected_committed

    speculator = _confident_speculator([0.9, 0.1, 0.1], spec_tokens=3)
    request = _decoding_request()
    speculator.propose([request])
    gate = speculator.promise
    assert gate.lengths == [3] and len(request.draft_ids) == 1
    expected = gate.expected_committed - 1
    kept = expected_committed(speculator.calibration([0.9])) - 1
    assert (speculator.realized.expected_tokens, speculator.realized.kept_tokens) == pytest.approx((expected, kept))
    scale = _shrunk(kept, expected, 1)
    assert 0.5 < scale < 0.9 and speculator.realized.survival_scale == pytest.approx(scale)
    assert speculator._gate_survival(request, 3) == pytest.approx(speculator.depth.rates(3, scale))
    speculator.observe_step(2, 0.011, decoded=(1, 1))  # the kept position failed
    speculator.record(request, 1, 0)
    assert speculator.realized.survival_scale == pytest.approx(scale)
    speculator.propose([request])  # the next gate expects less (scaled); the scale is fed unscaled
    n = speculator.promise.lengths[0]
    assert speculator.promise.expected_committed == pytest.approx(expected_committed(speculator.depth.rates(n, scale)))
    unscaled = expected_committed(speculator.depth.rates(n)) - 1
    assert speculator.realized.expected_tokens == pytest.approx(RealizedGain.TOKENS_MEMORY * expected + unscaled)


def test_a_drafter_without_confidences_is_gated_at_its_own_survival_unscaled():
    """Without confidences the plan after the call drafts what the gate predicted: nothing to
    scale. A failed draft lowers the pooled profile and the request's survival, once."""
    speculator, request, _ = _one_request_speculator()
    speculator.propose([request])
    assert speculator.promise.expected_committed == pytest.approx(1.5)
    speculator.observe_step(2, 0.010, decoded=(1, 1))  # the drafted token did not survive
    speculator.record(request, 1, 0)
    assert speculator.realized.token_calls == 0 and speculator.realized.survival_scale == 1.0
    own = speculator.survival(request).scale
    assert own < 1.0 and speculator.depth.rates(1)[0] < 0.5
    assert speculator._gate_survival(request, 1) == pytest.approx(speculator.depth.rates(1, own))


def test_reset_estimates_returns_the_gate_to_what_a_freshly_built_speculator_plans():
    """After drafts, verified outcomes and measured steps have moved every estimate, a reset
    speculator plans the coming step exactly as a fresh one with the same profile does."""
    confidences = [0.9, 0.6, 0.3]
    used = _confident_speculator(confidences, spec_tokens=3)
    request = _decoding_request()
    for _ in range(3):
        used.propose([request])
        used.observe_step(1 + len(request.draft_ids), 0.030, decoded=(1, 1))  # slow steps, failed drafts
        used.record(request, len(request.draft_ids), 0)
    fresh = _confident_speculator(confidences, spec_tokens=3)
    assert used.depth.rates(3) != fresh.depth.rates(3)
    assert used.calibration(confidences) != fresh.calibration(confidences)
    assert used.step_costs.seconds_at(2) != fresh.step_costs.seconds_at(2)
    assert used.realized.token_calls > 0
    used.reset_estimates()
    measured_at_prior(used.depth)  # as ``_confident_speculator`` leaves a fresh one
    assert used.depth.rates(3) == fresh.depth.rates(3)
    assert used.calibration(confidences) == fresh.calibration(confidences)
    assert used.step_costs.seconds_at(2) == fresh.step_costs.seconds_at(2)
    assert used.realized.token_calls == 0 and used.realized.factor == 1.0
    used.schedule.CONTROL_EVERY = fresh.schedule.CONTROL_EVERY
    used.propose([_decoding_request()])
    fresh.propose([_decoding_request()])
    assert used.promise == fresh.promise and used.plan == fresh.plan
