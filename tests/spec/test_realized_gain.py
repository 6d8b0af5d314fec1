"""The adaptive budget's check of its own promises: drafting steps that deliver less throughput
than the gate promised raise the gain a draft must promise; skipped steps relax it."""

import math

import pytest

from dhisparse import SamplingParams
from services.decoder.spec.realized_gain import RealizedGain
from services.decoder.spec.verify_budget import BudgetProfile, CostTable


def test_the_factor_is_the_moving_average_of_delivered_over_promised_on_the_log_axis():
    gain = RealizedGain()
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    # promised 8 tokens in 50 ms, delivered 6 in 60 ms: 0.75 * 50 / 60 = 0.625 of the promise
    gain.observe(8.0, 0.050, 6, 0.060)
    assert gain.factor == pytest.approx(math.exp(0.1 * math.log(0.625)))
    for _ in range(200):
        gain.observe(8.0, 0.050, 6, 0.060)
    assert gain.factor == pytest.approx(0.625, rel=1e-6)
    assert gain.required_gain(0.02) == pytest.approx(1.02 / 0.625 - 1)
    assert gain.num_steps == 201


def test_overdelivery_offsets_a_shortfall_but_never_lowers_the_bar():
    gain = RealizedGain()
    gain.observe(4.0, 0.010, 8, 0.010)  # twice the promise
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    gain.observe(4.0, 0.010, 2, 0.010)  # half of it: the average, 0.1 * (log 0.5 - 0.1 log 2), is below 0
    assert gain.log_mean == pytest.approx(0.1 * math.log(2) + 0.1 * (math.log(0.5) - 0.1 * math.log(2)))
    assert gain.factor == pytest.approx(math.exp(gain.log_mean)) and gain.factor < 1.0


def test_one_step_counts_as_at_most_a_twofold_shortfall_and_skipping_relaxes_it():
    gain = RealizedGain()
    gain.observe(8.0, 0.050, 1, 0.500)  # a preempted step: 1/80 of its promise
    assert gain.log_mean == pytest.approx(0.1 * math.log(0.5))
    before = gain.log_mean
    gain.relax(0.02)
    assert gain.log_mean == pytest.approx(0.98 * before)


@pytest.mark.parametrize("args", [(0.0, 0.05, 1, 0.05), (4.0, 0.0, 1, 0.05), (4.0, 0.05, 1, 0.0)])
def test_a_promise_or_duration_that_is_not_positive_is_refused(args):
    with pytest.raises(ValueError, match="positive"):
        RealizedGain().observe(*args)


def _one_request_speculator():
    """A speculator over a memory-bound step (10 ms at any size) and a drafter priced at nothing,
    one request decoding at running survival 0.5, one draft position: the gate promises 1.5
    tokens in 10 ms, 1.5x the throughput of no draft."""
    from services.decoder.engine.request import Request
    from services.decoder.engine.speculation import Speculator
    from services.decoder.engine.stop_checker import StopChecker
    from services.decoder.spec.drafter import Draft, Drafter

    class Fixed(Drafter):
        name = "fixed"
        prior_acceptance = 0.5
        calls = 0

        def propose_batch(self, requests):
            Fixed.calls += 1
            return [Draft([7] * r.max_tokens) for r in requests]

    class Tok:
        def decode(self, ids, **kw):
            return ""

    params = SamplingParams(max_tokens=64)
    request = Request("r", [1, 2, 3], params, StopChecker(Tok(), params, ()), max_model_len=1024)
    request.num_computed_tokens = 2  # one pending token: it decodes next
    speculator = Speculator(Fixed(), spec_tokens=1)
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (0.0, 0.0)))
    return speculator, request, Fixed


def test_a_gate_whose_promises_fall_short_stops_drafting_and_probes_again_later(monkeypatch):
    import services.decoder.engine.speculation as speculation

    monkeypatch.setattr(speculation.time, "perf_counter", lambda: 0.0)  # proposals take no time
    speculator, request, drafter = _one_request_speculator()
    promised_gain = 1.5
    step_s = 0.010  # what the table says: its calibration stays put
    # steps that deliver what was promised: the drafter runs every step and the bar stays put
    for _ in range(5):
        speculator.propose([request])
        assert speculator.promise.expected_committed == pytest.approx(1.5)
        assert speculator.promise.seconds == pytest.approx(step_s)
        assert speculator.promise.gain == pytest.approx(promised_gain)
        speculator.observe_step(2, step_s, decoded=(1, 1.5))
    assert drafter.calls == 5 and speculator.realized.factor == pytest.approx(1.0)
    # steps that commit 1 of the 1.5 tokens promised (2/3): once the factor falls below
    # 1.02 / 1.5, the promise no longer clears the raised bar and the drafter stops
    threshold = promised_gain / (1 + speculator.MIN_GAIN)
    steps = 0
    while speculator.realized.factor * threshold >= 1.0:
        speculator.propose([request])
        assert speculator.promise is not None
        speculator.observe_step(2, step_s, decoded=(1, 1))
        steps += 1
    # log factor -> log(2/3) by 10% per step: below log(1 / threshold) after n steps
    assert steps == math.ceil(math.log(1 - math.log(1 / threshold) / math.log(2 / 3)) / math.log(0.9))
    calls = drafter.calls
    speculator.propose([request])
    assert drafter.calls == calls and speculator.promise is None and speculator.num_skipped_steps == 1
    speculator.observe_step(1, 0.010, decoded=(1, 1))  # a plain step reports nothing to the check
    # each skipped step relaxes the shortfall by COST_RELAX until the promise clears the bar again
    skipped = 1
    while drafter.calls == calls:
        speculator.propose([request])
        speculator.observe_step(1, 0.010, decoded=(1, 1))
        skipped += 1
    assert speculator.realized.factor * threshold >= 1.0
    assert skipped == speculator.num_skipped_steps + 1  # the probe itself drafted


def test_a_step_with_other_requests_or_a_prefill_chunk_is_not_held_to_the_promise():
    speculator, request, _ = _one_request_speculator()
    speculator.propose([request])
    speculator.observe_step(40, 0.5, decoded=None)  # a prefill chunk ran in the same pass
    speculator.propose([request])
    speculator.observe_step(3, 0.5, decoded=(2, 1))  # a request the gate did not see
    assert speculator.realized.num_steps == 0 and speculator.realized.factor == 1.0
