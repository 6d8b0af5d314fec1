"""The adaptive verify budget: exact choices of the draft length, and losslessness in the engine."""

import pytest

from dhisparse import LLM, SamplingParams
from services.decoder.spec.verify_budget import (
    CalibratedCosts,
    CostTable,
    choose_draft_length,
    choose_draft_lengths,
    expected_committed,
    survival_from_acceptance_length,
)
from tests.spec.test_verify_budget_costs import _decoding_request

FLAT = CostTable((1, 64), (0.010, 0.010))  # memory-bound: verifying more tokens is free
STEEP = CostTable((1, 2, 4, 8), (0.010, 0.020, 0.040, 0.080))  # compute-bound: cost per token


def test_expected_committed_is_one_plus_survival_products():
    assert expected_committed([]) == 1.0
    assert expected_committed([0.5, 0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_cost_table_interpolates_and_extrapolates():
    assert STEEP.seconds_at(3) == pytest.approx(0.030)
    assert STEEP.seconds_at(16) == pytest.approx(0.160)  # the last slope
    assert FLAT.seconds_at(1000) == pytest.approx(0.010)
    with pytest.raises(ValueError):
        CostTable((4, 2), (0.1, 0.2))


def test_free_verification_takes_every_draft_token_and_steep_cost_takes_none():
    assert choose_draft_length([0.9] * 8, 0, FLAT) == 8
    assert choose_draft_length([0.3] * 8, 0, FLAT) == 8  # still free: any acceptance helps
    # each extra token costs a full step: only a certain token (p = 1) would break even; 0.9 does not
    assert choose_draft_length([0.9] * 8, 0, STEEP) == 0


def test_middle_ground_batch_load_and_fetch_cost_shrink_the_budget():
    mild = CostTable((1, 9), (0.010, 0.018))  # 1 ms per extra token
    # rate(k) = E(k) / (10 + k) ms with p = 0.8: E = 1, 1.8, 2.44, 2.95, 3.36, 3.69, 3.95, 4.16: best k = 6
    assert choose_draft_length([0.8] * 8, 0, mild) == 6
    # a SPARSE request whose extra positions each fetch 2 ms of pages: (10 + 3k) ms, best k = 3
    assert choose_draft_length([0.8] * 8, 0, mild, fetch_s_per_position=0.002) == 3
    # free up to 8 batch tokens, then 2.5 ms per token: alone 7 drafts ride free; behind 12 other
    # tokens every draft token costs, and the budget drops to 5
    knee = CostTable((1, 8, 16), (0.010, 0.010, 0.030))
    assert choose_draft_length([0.8] * 8, 0, knee) == 7
    assert choose_draft_length([0.8] * 8, 12, knee) == 5


def test_lengths_are_chosen_for_the_whole_step():
    """4 decoding requests, verification free up to 8 batch tokens, then 2.5 ms a token. Each
    request alone (3 other tokens) would take 4 free drafts; jointly only 4 free slots exist, so
    every request gets its best position: (4 + 4 x 0.9) / 10 ms beats (4 + 3.6 + 0.81) / 12.5 ms."""
    knee = CostTable((1, 8, 16), (0.010, 0.010, 0.030))
    assert [choose_draft_length([0.9] * 4, 3, knee)] * 4 == [4, 4, 4, 4]
    assert choose_draft_lengths([[0.9] * 4] * 4, 4, 4, knee) == [1, 1, 1, 1]
    # the free slots go to the likeliest positions: 0.95, 0.95^2 = 0.90, 0.95^3 = 0.86, then one 0.85
    assert choose_draft_lengths([[0.95] * 4, [0.85] * 4, [0.85] * 4, [0.85] * 4], 4, 4, knee) == [3, 1, 0, 0]
    # when verification costs what it commits, nobody drafts: never worse than no speculation
    assert choose_draft_lengths([[0.5] * 8] * 3, 3, 3, STEEP) == [0, 0, 0]
    # a SPARSE request whose positions fetch pages loses its slots to a FULL one
    mild = CostTable((1, 9), (0.010, 0.018))
    assert choose_draft_lengths([[0.8] * 3, [0.8] * 3], 2, 2, mild, [0.0, 0.004]) == [3, 0]


def test_the_drafters_own_cost_is_charged_once_when_any_position_is_taken():
    mild = CostTable((1, 9), (0.010, 0.018))
    assert choose_draft_length([0.8] * 8, 0, mild) == 6
    # 5 ms of drafter forward, paid by any draft: E(k) / (15 + k) ms is best at k = 7 (4.16 / 22 ms
    # beats 4.33 / 23 ms): a fixed cost makes a taken draft longer, not shorter
    assert choose_draft_lengths([[0.8] * 8], 1, 1, mild, draft_s=0.005) == [7]
    # a drafter that costs more than anything its drafts can commit: nothing is drafted
    assert choose_draft_lengths([[0.3] * 8], 1, 1, mild, draft_s=0.020) == [0]
    assert choose_draft_lengths([[0.3] * 8], 1, 1, mild) != [0]


def test_a_dip_in_the_calibrated_step_costs_never_makes_a_draft_look_free():
    """Measured 10x slower at 1 token (a slow first decode step) and at the profile's cost at 16
    (a fast prefill): interpolated, 9 tokens would cost less than 1. The budget never prices a
    larger step below a smaller one, so a 5% draft still does not pay for a 20 ms drafter."""
    costs = CalibratedCosts(FLAT)
    costs.observe(1, 0.100)
    costs.observe(16, 0.010)
    assert costs.seconds_at(9) < costs.seconds_at(1)  # the dip
    assert choose_draft_lengths([[0.05] * 8], 1, 1, costs, draft_s=0.020) == [0]
    assert choose_draft_lengths([[0.9] * 8], 1, 1, costs, draft_s=0.020) == [8]


def test_survival_from_a_mean_acceptance_length():
    assert survival_from_acceptance_length(1.5, 1) == pytest.approx(0.5)
    assert survival_from_acceptance_length(1.75, 2) == pytest.approx(0.5)  # 1 + 0.5 + 0.25
    assert survival_from_acceptance_length(1.0, 7) == pytest.approx(0.0, abs=1e-12)
    assert survival_from_acceptance_length(8.0, 7) == pytest.approx(1.0)
    p = survival_from_acceptance_length(1.3159, 7)
    assert expected_committed([p] * 7) == pytest.approx(1.3159)
    for bad in (0.9, 8.5):
        with pytest.raises(ValueError, match="impossible"):
            survival_from_acceptance_length(bad, 7)


def test_adaptive_budget_is_lossless_and_profiles_the_engine(loaded_model):
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
               "List the planets: Mercury, Venus, Earth, Mars. List them again: Mercury,"]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    plain = LLM(loaded=loaded_model).generate(prompts, params)
    adaptive = LLM(loaded=loaded_model, spec="ngram", spec_tokens=8, verify_budget="adaptive")
    profile = adaptive.engine.speculator.profile
    costs = profile.step_costs
    assert costs.counts[0] == 1 and len(costs.counts) >= 5 and min(costs.seconds) > 0
    assert profile.draft_costs.counts == (1, 4, 16) and min(profile.draft_costs.seconds) > 0
    # what one more asked position costs, per request count: never negative; the n-gram drafter's
    # lookups cost next to nothing per position
    assert profile.draft_position_costs.counts == (1, 4, 16) and min(profile.draft_position_costs.seconds) >= 0.0
    assert profile.draft_s_per_position(4) == profile.draft_position_costs.seconds[1] < 1e-3
    # the step table prices a count at the rows its GEMMs really run (an MKL pack's bucket, where
    # this machine's GEMM plan picks packs)
    lm_head = adaptive.engine.model.lm_head
    for count in range(1, costs.counts[-1] + 1):
        padded = lm_head.padded_rows(count)
        assert costs.padded(count) == (padded if padded in costs.counts else count)
    assert adaptive.engine.allocator.num_free_slots == adaptive.engine.allocator.num_slots  # profile cleaned up
    outs = adaptive.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    assert sum(o.stats["num_verify_steps"] for o in outs) > 0


def test_the_drafter_does_not_run_when_no_draft_can_pay_for_it(loaded_model):
    """The engine's gate: with the drafter's profiled cost far above what any draft can commit,
    the drafter is never called and nothing is verified; with a free drafter over a memory-bound
    step it drafts. Outputs equal plain decoding either way."""
    from services.decoder.spec.verify_budget import BudgetProfile

    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = LLM(loaded=loaded_model).generate(prompts, params)
    llm = LLM(loaded=loaded_model, spec="ngram", spec_tokens=8, verify_budget="adaptive")
    speculator = llm.engine.speculator
    for draft_s, drafts in ((10.0, False), (0.0, True)):
        speculator.profile = BudgetProfile(FLAT, CostTable((1, 16), (draft_s, draft_s)))
        speculator.num_drafter_calls = 0
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
        assert (speculator.num_drafter_calls > 0) == drafts
        assert (outs[0].stats["num_verify_steps"] > 0) == drafts
        if not drafts:
            # every step of the costly run that could draft: 24 tokens, the first from the
            # prefill, the last with no room for a draft (and its bonus token) left
            assert speculator.schedule.num_skipped_steps == 22


def test_requests_start_from_the_drafters_pooled_profile(loaded_model):
    """A drafter known to accept little (pooled profile 0.05, e.g. from its held-out figure) is
    not probed by new requests at a guessed 0.7: with a drafter cost that 0.7 would pay for and
    0.05 would not, it never runs; with the profile at 0.7 it does, and every verified draft
    counts in the profile. Outputs equal plain decoding either way."""
    from services.decoder.spec.depth_survival import DepthSurvival
    from services.decoder.spec.verify_budget import BudgetProfile

    # the engine calibrates the step table by measured step times (a real step here is 20-100 ms,
    # FLAT says 10): 0.7 pays for a 20 ms drafter at any step time above ~9 ms, 0.05 (5% more
    # tokens per step) at none below 0.38 s, beyond the calibration's 10x limit
    draft_s = 0.020
    assert choose_draft_lengths([[0.7] * 8], 1, 1, FLAT, draft_s=draft_s) != [0]
    assert choose_draft_lengths([[0.05] * 8], 1, 1, FLAT, draft_s=draft_s) == [0]
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    plain = LLM(loaded=loaded_model).generate(prompts, params)
    llm = LLM(loaded=loaded_model, spec="ngram", spec_tokens=8, verify_budget="adaptive")
    speculator = llm.engine.speculator
    assert speculator.depth.prior == pytest.approx(speculator.drafter.prior_acceptance)
    for pooled, drafts in ((0.05, False), (0.7, True)):
        speculator.profile = BudgetProfile(FLAT, CostTable((1, 16), (draft_s, draft_s)))
        speculator.depth = DepthSurvival(pooled, speculator.spec_tokens)  # the pooled profile per position
        speculator.num_drafter_calls = 0
        outs = llm.generate(prompts, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
        assert (speculator.num_drafter_calls > 0) == drafts
        verified = outs[0].stats["num_verify_steps"]
        assert (verified > 0) == drafts
        # the pooled profile counted trials only if drafts were verified
        assert (speculator.depth.trials[0] > 0) == drafts


@pytest.mark.parametrize("confidences", [True, False])
def test_the_drafter_is_asked_for_the_predicted_length_plus_headroom_after_its_context_is_ready(confidences):
    """The gate's predicted length (survival 0.5, a step table where one verified token is
    almost free and a second costs a full step) is 1, so the drafter is asked for 1 token, not
    spec_tokens: one without confidences gets no headroom (nothing after its call could lengthen
    the draft), and one with none here (a second token costing a full step could not pay at any
    confidence; ``test_gate_headroom.py``); ``prepare`` (the deferred context work) runs before
    the timed call; a skipped step relaxes the drafter's cost correction."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.drafter import Draft, Drafter
    from services.decoder.spec.verify_budget import BudgetProfile

    calls = []

    class Recording(Drafter):
        name = "recording"
        prior_acceptance = 0.5
        has_confidences = confidences

        def prepare(self, request_ids):
            calls.append(("prepare", list(request_ids)))

        def propose_batch(self, requests):
            calls.append(("propose", [r.max_tokens for r in requests]))
            return [Draft([7] * r.max_tokens, [0.5] * r.max_tokens if confidences else None) for r in requests]

    request = _decoding_request()  # one pending token: it decodes next
    speculator = Speculator(Recording(), spec_tokens=7)
    steps = CostTable((1, 2, 3, 64), (0.010, 0.0101, 0.020, 1.0))
    assert choose_draft_lengths([[0.5] * 7], 1, 1, steps) == [1]
    speculator.profile = BudgetProfile(steps, CostTable((1, 16), (0.0, 0.0)))
    speculator.propose([request])
    assert calls == [("prepare", ["r"]), ("propose", [1])]
    assert request.draft_ids == [7]  # the rate-based cut after drafting: the predicted length
    # a drafter measured at 1 s per call (capped at 2x its profiled cost per measurement) is skipped,
    # and each skipped step relaxes its correction towards the profile (when the gate next asks)
    speculator.profile = BudgetProfile(steps, CostTable((1, 16), (0.5, 0.5)))
    speculator.draft_costs.observe(1, 1.0)
    calls.clear()
    speculator.propose([request])
    assert calls == [] and speculator.schedule.num_skipped_steps == 1
    speculator.propose([request])
    assert calls == [] and speculator.schedule.num_skipped_steps == 2
    speed = 2.0**CalibratedCosts.SPEED_WEIGHT  # 2x: the speed's share and the shape's (2 / speed)
    relax = speculator.COST_RELAX
    # the shape relaxes; the speed is the machine's, shared with the step table that keeps measuring it
    assert speculator.draft_costs.speed == speculator.step_costs.speed == pytest.approx(speed)
    assert speculator.draft_costs.ratio_at(1) == pytest.approx(speed * (2 / speed + relax * (1 - 2 / speed)))


def test_a_draft_must_clear_the_minimum_gain():
    """Memory-bound step (10 ms at any size), a 0.3 ms drafter, one position at p = 0.0609:
    (1 + p) tokens in 10.3 ms is 1.03x the throughput of no draft. Taken with no margin, not
    with a 5% one; a strong draft (0.9 over 7 positions, ~5x) is taken with it."""
    flat = CostTable((1, 64), (0.010, 0.010))
    p = 0.0609
    assert (1 + p) / 0.0103 * 0.010 == pytest.approx(1.03, abs=1e-4)
    assert choose_draft_lengths([[p]], 1, 1, flat, draft_s=0.0003) == [1]
    assert choose_draft_lengths([[p]], 1, 1, flat, draft_s=0.0003, min_gain=0.05) == [0]
    assert choose_draft_lengths([[0.9] * 7], 1, 1, flat, draft_s=0.0003, min_gain=0.05) == [7]


def test_the_minimum_gain_is_one_margin_per_step():
    """Four requests, a memory-bound step (verified tokens free), a free drafter: one position at
    p per request adds p / 4 to the step's throughput each. With a 2% margin, p = 0.07 drafts all
    four (7% >= 2%); p = 0.01 (1% in all) drafts nothing, where no margin drafts all."""
    flat = CostTable((1, 64), (0.010, 0.010))
    assert choose_draft_lengths([[0.07]] * 4, 4, 4, flat, min_gain=0.02) == [1] * 4
    assert choose_draft_lengths([[0.01]] * 4, 4, 4, flat, min_gain=0.02) == [0] * 4
    assert choose_draft_lengths([[0.01]] * 4, 4, 4, flat) == [1] * 4


def test_the_plan_stops_early_only_where_no_longer_prefix_could_win():
    """``choose_draft_plan`` stops once every position left, at the seconds of now, could not
    beat the best: its plans equal those of an exhaustive walk over every prefix of the same
    order (positions by acceptance probability per marginal second), for random steps of 1-16
    requests on a padded, calibrated table, with fetches, attention, the drafter's costs and a
    minimum gain."""
    import random

    from services.decoder.spec.verify_budget import choose_draft_plan

    def exhaustive(confidences, base, costs, fetch, attend, draft_s, min_gain, per_position, base_extra_s):
        slope = max((costs.seconds_at(base + 16) - costs.seconds_at(base)) / 16, 1e-9)
        keyed = []
        for r, conf in enumerate(confidences):
            alive = 1.0
            for k, p in enumerate(conf):
                alive *= p
                keyed.append((-alive / (slope + fetch[r] + attend[r] + per_position), r, k, alive))
        keyed.sort(key=lambda item: item[:3])
        step_s = costs.seconds_at(base)
        base_rate = best_rate = base / (step_s + base_extra_s)
        best, expected, extra, lengths = [0] * len(confidences), float(base), base_extra_s, [0] * len(confidences)
        for taken, (_, r, k, alive) in enumerate(keyed, start=1):
            expected += alive
            extra += fetch[r] + attend[r] + per_position
            lengths[r] = k + 1
            step_s = max(step_s, costs.seconds_at(base + taken))
            rate = expected / (step_s + extra + draft_s)
            if rate > best_rate * (1 + 1e-9) and rate >= base_rate * (1 + min_gain):
                best_rate, best = rate, list(lengths)
        return best

    rng = random.Random(7)
    table = CostTable((1, 4, 8, 16, 32, 64, 128), (0.030, 0.033, 0.036, 0.045, 0.060, 0.090, 0.160),
                      pads=((9, 16), (12, 16)))
    drafted = 0
    for trial in range(300):
        costs = CalibratedCosts(table)
        for _ in range(rng.randrange(4)):
            costs.observe(rng.choice((1, 4, 16, 40)), 0.03 * rng.uniform(0.7, 1.6))
        n = rng.randint(1, 16)
        confidences = [[rng.uniform(0.05, 0.98) ** rng.choice((1, 3)) for _ in range(rng.randint(1, 7))]
                       for _ in range(n)]
        fetch = [rng.choice((0.0, 0.0, 1e-4, 1e-3)) for _ in range(n)]
        attend = [rng.uniform(0, 2e-4) for _ in range(n)]
        args = (rng.choice((0.0, 0.002, 0.012)), rng.choice((0.0, 0.02, 0.08)), rng.choice((0.0, 3e-4)),
                rng.uniform(0, 2e-3))
        got = choose_draft_plan(confidences, n, n, costs, fetch, args[0], args[1], args[2], attend, args[3])
        assert got.lengths == exhaustive(confidences, n, costs, fetch, attend, *args), trial
        drafted += any(got.lengths)
    assert 30 < drafted < 270  # both outcomes occur: the walk is checked where it drafts and where it stops
