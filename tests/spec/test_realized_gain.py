"""The adaptive budget's check of its own promises: drafting steps that deliver less throughput
than the gate promised raise the gain a draft must promise; skipped steps relax it."""

import math

import pytest

from services.decoder.spec.realized_gain import RealizedGain
from services.decoder.spec.verify_budget import BudgetProfile, CostTable
from tests.spec.test_verify_budget_costs import _decoding_request


def test_the_factor_is_delivered_over_promised_tokens_per_second_from_moving_averages():
    gain = RealizedGain()
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    # promised 8 tokens in 50 ms, delivered 6 in 60 ms: 0.75 * 50 / 60 = 0.625 of the promise
    gain.observe(8.0, 0.050, 6, 0.060)
    assert gain.factor == pytest.approx(0.625)
    assert gain.required_gain(0.02) == pytest.approx(1.02 / 0.625 - 1)
    # a step that keeps its promise averages in at WEIGHT: (0.9 * 6 + 0.1 * 8) / 8 tokens, and
    # 50 / (0.9 * 60 + 0.1 * 50) ms
    gain.observe(8.0, 0.050, 8, 0.050)
    assert gain.factor == pytest.approx((0.9 * 6 + 0.8) / 8 * 0.050 / (0.9 * 0.060 + 0.1 * 0.050))
    assert gain.num_steps == 2


def test_noisy_steps_that_keep_the_promise_on_average_show_no_shortfall():
    """One request commits 1 token or 5 around a promise of 3: the average of per-step ratios on
    the log axis would read exp(mean(log 1/3, log 5/3)) = 0.75; the ratio of averages reads 1."""
    gain = RealizedGain()
    for i in range(400):
        gain.observe(3.0, 0.050, 1 if i % 2 else 5, 0.050)
    assert gain.factor == pytest.approx(1.0, abs=0.11)  # the last step's weight: 0.1 * (5 - 1) / 2 / 3
    assert math.exp((math.log(1 / 3) + math.log(5 / 3)) / 2) == pytest.approx(0.745, abs=1e-3)


def test_overdelivery_offsets_a_shortfall_but_never_lowers_the_bar():
    gain = RealizedGain()
    gain.observe(4.0, 0.010, 8, 0.010)  # twice the promise
    assert gain.factor == 1.0 and gain.required_gain(0.02) == pytest.approx(0.02)
    gain.observe(4.0, 0.010, 0, 0.010)  # nothing: the averages still show 0.9 * 8 tokens of 4 promised
    assert gain.factor == 1.0
    for _ in range(30):
        gain.observe(4.0, 0.010, 2, 0.010)  # half, for a while: the shortfall shows
    assert gain.factor < 0.6


def test_one_step_counts_as_at_most_a_twofold_slowdown_and_skipping_relaxes_the_shortfall():
    gain = RealizedGain()
    gain.observe(4.0, 0.050, 4, 0.500)  # a preempted step: 10x its promised seconds
    assert gain.seconds == pytest.approx(0.100) and gain.factor == pytest.approx(0.5)
    gain.relax(0.02)
    assert gain.seconds == pytest.approx(0.100 + 0.02 * (0.050 - 0.100))
    assert gain.factor == pytest.approx(0.050 / gain.seconds)


@pytest.mark.parametrize("args", [(0.0, 0.05, 1, 0.05), (4.0, 0.0, 1, 0.05), (4.0, 0.05, 1, 0.0)])
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
    # the committed average falls from 1.5 towards 1 by 10% of the gap per step: 1 + 0.5 * 0.9^n,
    # below 1.5 / threshold after n steps
    assert steps == math.ceil(math.log((1.5 / threshold - 1) / 0.5) / math.log(0.9))
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
