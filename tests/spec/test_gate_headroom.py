"""The positions a drafter with confidences is asked for beyond the gate's predicted length (the
headroom): priced by the gate, asked only where a longer draft could pay, and a step whose draft
the confidences lengthened is held to what it runs, not to the gate's shorter promise. And the
gain the gate asks a draft to promise, which rises with the requests decoding, against a depth-0
survival it reads optimistically by its standard error at one request."""

import pytest

from services.decoder.spec.verify_budget import BudgetProfile, CostTable, choose_draft_plan
from tests.spec.test_depth_survival import measured_at_prior
from tests.spec.test_verify_budget_costs import _decoding_request

# 10 ms for one or two tokens (one token runs as two rows), the third row 3 ms more, flat after
STEP = CostTable((1, 2, 3, 64), (0.010, 0.010, 0.013, 0.013))


def test_the_headroom_is_charged_once_per_drafting_request():
    """Two requests at survival 0.5, a flat 10 ms step: each request's draft costs its asked
    headroom once (2 ms), whatever its length: two 2-token drafts commit 3.5 tokens in 14 ms
    (250/s against 200/s without), not in 18 (a charge per position, 194/s: no draft at all)."""
    flat = CostTable((1, 64), (0.010, 0.010))
    plan = choose_draft_plan([[0.5, 0.5], [0.5, 0.5]], 2, 2, flat, draft_s_per_request=0.002)
    assert plan.lengths == [2, 2]
    assert plan.seconds == pytest.approx(0.014) and plan.expected_committed == pytest.approx(3.5)
    assert choose_draft_plan([[0.5, 0.5], [0.5, 0.5]], 2, 2, flat, draft_s_per_request=0.004).lengths == [0, 0]


def _speculator(monkeypatch):
    """One request, a drafter that proposes at confidence 0.99 (the calibration's top bin: 0.95)
    priced at nothing, the pooled survival at its prior 0.5, and a clock that stands still (the
    proposal takes no time): the gate predicts one token (1.5 in 10 ms beats 1.75 in 13)."""
    import services.decoder.engine.speculation as speculation
    from services.decoder.spec.drafter import Draft, Drafter

    monkeypatch.setattr(speculation.time, "perf_counter", lambda: 0.0)

    class Confident(Drafter):
        name = "confident"
        prior_acceptance = 0.5
        has_confidences = True
        asked: list[int] = []

        def propose_batch(self, requests):
            Confident.asked += [r.max_tokens for r in requests]
            return [Draft([7] * r.max_tokens, [0.99] * r.max_tokens) for r in requests]

    Confident.asked = []
    speculator = speculation.Speculator(Confident(), spec_tokens=3)
    speculator.GATE_OPTIMISM = 0.0  # the gate at its point estimate (optimism: the tests below)
    speculator.profile = BudgetProfile(STEP, CostTable((1, 16), (0.0, 0.0)))
    measured_at_prior(speculator.depth)
    return speculator, _decoding_request(), Confident


def test_a_draft_the_confidences_lengthen_is_held_to_its_own_price(monkeypatch):
    speculator, request, drafter = _speculator(monkeypatch)
    speculator.propose([request])
    assert speculator.promise.lengths == [1] and speculator.promise.seconds == pytest.approx(0.010)
    # the headroom: a second position at the best calibrated survival (0.95 x 0.95 = 0.90 tokens)
    # against 3 ms more step at the plan's 150 tokens/s (0.45 tokens)
    assert drafter.asked == [2]
    # the confidences (0.95 each) make two tokens pay: 2.85 tokens in 13 ms against 1.95 in 10
    assert request.draft_ids == [7, 7] and speculator.plan.seconds == pytest.approx(0.013)
    speculator.observe_step(3, 0.013, decoded=(1, 3))  # the step took what its plan priced
    # held to the gate's 10 ms, the 13 ms step read as a 23% shortfall and raised the bar
    assert speculator.realized.factor == pytest.approx(1.0)
    assert speculator.realized.required_gain(0.02) == pytest.approx(0.02)


def test_no_headroom_where_the_second_position_never_survives(monkeypatch):
    """The calibration has learnt that second positions fail at every confidence it saw (code at
    c=1): a longer draft could not pay even at the best survival it maps to, so the drafter is
    asked for the predicted length only."""
    speculator, request, drafter = _speculator(monkeypatch)
    for _ in range(100):
        speculator.calibration.observe([0.99, 0.99], 1)  # firsts survive, seconds fail
    # its top bin pooled by the isotonic fit with the unmeasured bins below it: 0.15
    assert speculator.calibration.best(1) < 0.2
    speculator.propose([request])
    assert drafter.asked == [1] and request.draft_ids == [7]


@pytest.mark.parametrize("num_requests, drafts", [(1, True), (4, True), (5, False), (16, False)])
def test_the_gain_a_draft_must_promise_rises_with_the_requests_decoding(monkeypatch, num_requests, drafts):
    """A flat 10 ms step and a drafter call of 30/7 ms: one-token drafts at survival 0.5 promise
    1.5 tokens per request in 10 + 30/7 ms, 1.05x no draft at any request count. That clears
    MIN_GAIN + GateSchedule.MIN_GAIN_PER_REQUEST x (n - 1) up to 4 requests (1.044), not at 5
    (1.052) or 16."""
    import services.decoder.engine.speculation as speculation
    from tests.spec.test_realized_gain import _one_request_speculator

    monkeypatch.setattr(speculation.time, "perf_counter", lambda: 0.0)
    speculator, _, _ = _one_request_speculator()
    call_s = 0.030 / 7
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (call_s, call_s)))
    measured_at_prior(speculator.depth)
    assert speculator.schedule.extra_gain(1) == 0.0
    assert speculator.schedule.extra_gain(num_requests) == pytest.approx(
        speculator.schedule.MIN_GAIN_PER_REQUEST * (num_requests - 1))
    requests = [_decoding_request(f"r{i}") for i in range(num_requests)]
    speculator.propose(requests)
    assert (speculator.promise is not None) is drafts
    assert all(r.draft_ids == ([7] if drafts else []) for r in requests)


def _unsure_speculator(monkeypatch, call_s: float):
    """A drafter with confidences at a pooled depth-0 survival of 0.2 from 8 (pseudo-)trials
    (standard error sqrt(0.2 x 0.8 / 8) = 0.141), a flat 10 ms step, a call of ``call_s``."""
    import services.decoder.engine.speculation as speculation
    from services.decoder.spec.drafter import Draft, Drafter

    monkeypatch.setattr(speculation.time, "perf_counter", lambda: 0.0)

    class Unsure(Drafter):
        name = "unsure"
        prior_acceptance = 0.2
        has_confidences = True

        def propose_batch(self, requests):
            return [Draft([7] * r.max_tokens, [0.9] * r.max_tokens) for r in requests]

    speculator = speculation.Speculator(Unsure(), spec_tokens=1)
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (call_s, call_s)))
    measured_at_prior(speculator.depth)
    assert speculator.depth.rates(1) == pytest.approx([0.2])
    assert speculator.depth.first_error() == pytest.approx((0.2 * 0.8 / 8) ** 0.5)
    return speculator


@pytest.mark.parametrize("optimism, drafts", [(1.0, True), (0.0, False)])
def test_one_request_drafts_where_the_upper_bound_of_its_survival_pays(monkeypatch, optimism, drafts):
    """A 2.5 ms call on a 10 ms step: at the point estimate a one-token draft promises 1.2 tokens
    in 12.5 ms (0.96x), at one standard error above it 1.341 (1.073x, over the 2% bar). The
    optimistic gate drafts, and its promise counts the raised survival; the point estimate's does not."""
    speculator = _unsure_speculator(monkeypatch, call_s=0.0025)
    speculator.GATE_OPTIMISM = optimism
    request = _decoding_request()
    speculator.propose([request])
    assert (speculator.promise is not None) is drafts
    assert request.draft_ids == ([7] if drafts else [])
    if drafts:
        assert speculator.promise.expected_committed == pytest.approx(1.2 + (0.2 * 0.8 / 8) ** 0.5)


def test_the_optimism_is_shared_out_over_the_requests_decoding(monkeypatch):
    """A free call: two requests draft, each read at 0.2 + half a standard error (with many
    requests a step's trials come many at once, and the bar holds the noise of large promises)."""
    speculator = _unsure_speculator(monkeypatch, call_s=0.0)
    requests = [_decoding_request("a"), _decoding_request("b")]
    speculator.propose(requests)
    assert speculator.promise.lengths == [1, 1]
    assert speculator.promise.expected_committed == pytest.approx(2 + 2 * (0.2 + (0.2 * 0.8 / 8) ** 0.5 / 2))
