"""DSpark confidences calibrated by what verification accepts (``ConfidenceCalibration``): the
map alone, its effect on the verify budget, and the engine feeding it."""

import pytest

from dhisparse import LLM, SamplingParams
from services.decoder.spec.confidence_calibration import ConfidenceCalibration
from services.decoder.spec.verify_budget import CostTable, choose_draft_lengths


def test_confidence_calibration_starts_as_identity_and_learns_an_overconfident_head():
    cal = ConfidenceCalibration()
    assert cal([0.05, 0.3, 0.55, 0.95]) == pytest.approx([0.05, 0.3, 0.55, 0.95])
    # a head that says 0.57 where one position in four survives (single-position drafts)
    for i in range(100):
        cal.observe([0.57], 1 if i % 4 == 0 else 0)
    # bin 0.5-0.6: (25 + 4 * 0.55) / 104 = 0.26, below the identity priors of bins 0.3-0.5, which
    # the isotonic fit pools with it: (4 * 0.35 + 4 * 0.45 + 27.2) / 112
    pooled = (1.4 + 1.8 + 27.2) / 112
    assert cal.rates()[3:6] == pytest.approx([pooled] * 3)
    assert cal([0.55])[0] == pytest.approx(pooled)
    assert cal([0.25])[0] == pytest.approx(0.25)  # bins it never measured keep their priors
    assert cal([0.95])[0] == pytest.approx(0.95)
    rates = cal.rates()
    assert all(a <= b for a, b in zip(rates, rates[1:]))


def test_confidence_calibration_counts_only_positions_whose_prefix_survived_each_at_its_depth():
    cal = ConfidenceCalibration()
    cal.observe([0.95, 0.95, 0.95, 0.15], 0)  # one trial (failed) at depth 0; the rest were never tried
    assert cal.trials[0][9] == 1.0 and cal.survived[0][9] == 0.0
    assert sum(map(sum, cal.trials)) == 1.0
    cal.observe([0.95, 0.15, 0.95, 0.95], 3)  # three survived, the fourth failed: four trials
    assert cal.trials[0][9] == 2.0 and cal.survived[0][9] == 1.0
    assert cal.trials[1][1] == 1.0 and cal.survived[1][1] == 1.0
    # depths from DEPTHS - 1 on share the last map
    assert cal.trials[2][9] == 2.0 and cal.survived[2][9] == 1.0
    assert sum(map(sum, cal.trials)) == 5.0


def test_each_depth_learns_its_own_map_starting_from_the_depth_before():
    """A head that is right about first positions and says the same of second positions that
    never survive (code_edit's DSpark, briefly): the second depth's map falls, the first's keeps
    its rate, and the third, never tried, reads as the second."""
    cal = ConfidenceCalibration()
    for i in range(100):
        cal.observe([0.85, 0.85], 2 if i % 10 < 8 else 0)  # 80 of 100 firsts survive; every second that is tried: yes
    for _ in range(80):
        cal.observe([0.85, 0.85], 1)  # from now on every second fails
    first, second, third = cal([0.85, 0.85, 0.85])
    # depth 0, bin 0.8-0.9: (160 + 4 * 0.85) / (180 + 4)
    assert first == pytest.approx((160 + 4 * 0.85) / 184)
    # depth 1, the same bin: 80 survived of 160, + 4 pseudo-trials at depth 0's rate there; below
    # its neighbours' priors (depth 0's rates: 0.55, 0.65, 0.75), so the isotonic fit pools them
    assert second == pytest.approx((80 + 4 * first + 4 * (0.55 + 0.65 + 0.75)) / (164 + 12))
    assert third == pytest.approx(second)  # depth 2: no trials, its prior is depth 1's map
    # the best survival a depth maps any confidence to: its top bin, never measured here (0.95)
    assert cal.best(0) == cal.rates(0)[-1] == pytest.approx(0.95) and cal.best(1) == pytest.approx(0.95)
    for _ in range(20):
        cal.observe([0.95, 0.95], 1)
    assert cal.best(0) == pytest.approx((20 + 4 * 0.95) / 24)
    # depth 1's top bin: 20 failures against 4 pseudo-trials at depth 0's top rate (0.17), below
    # the pooled bins 0.5-0.9 (0.52), so the isotonic fit pools it with them
    pooled = (4 * cal.best(0) + 80 + 4 * first + 4 * (0.55 + 0.65 + 0.75)) / (24 + 176)
    assert cal.best(1) == cal.rates(1)[-1] == pytest.approx(pooled) and pooled < 0.5


def test_confidence_calibration_forgets_old_counts_beyond_its_cap():
    cal = ConfidenceCalibration()
    for _ in range(1000):
        cal.observe([0.75], 1)
    assert cal.trials[0][7] == pytest.approx(cal.MAX_TRIALS, rel=0.01)
    for _ in range(400):
        cal.observe([0.75], 0)
    # after the text changed, the rate follows: about half the capped counts are new failures
    assert 0.25 < cal([0.75])[0] < 0.5


def test_calibrated_confidences_shrink_the_budget_of_an_overconfident_head():
    cal = ConfidenceCalibration()
    for i in range(200):
        cal.observe([0.9], 1 if i % 5 == 0 else 0)  # 0.9 claimed, 0.2 measured
    linear = CostTable((1, 64), (0.010, 0.010 + 63 * 0.004))
    # at the claimed 0.9, four positions: E(4) = 4.10 tokens / 26 ms beats E(5) = 4.69 / 30 ms
    assert choose_draft_lengths([[0.9] * 7], 1, 1, linear) == [4]
    assert choose_draft_lengths([cal([0.9] * 7)], 1, 1, linear) == [0]


def test_the_engine_calibrates_a_drafters_confidences_by_what_it_verifies(loaded_model):
    """A drafter that proposes a token the target never picks, at confidence 0.95: every verify
    step is one failed trial in the 0.9-1.0 bin (the later positions are never tried), so the
    calibration's counts grow by exactly the verify steps, and 0.95 reads as a low survival."""
    from services.decoder.spec.drafter import Draft, Drafter

    class ConfidentlyWrong(Drafter):
        name = "wrong"

        def propose_batch(self, requests):
            return [Draft([49151] * r.max_tokens, [0.95] * r.max_tokens) for r in requests]

    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return"]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = LLM(loaded=loaded_model).generate(prompts, params)
    llm = LLM(loaded=loaded_model, spec="ngram", spec_tokens=4)
    speculator = llm.engine.speculator
    speculator.drafter = ConfidentlyWrong()
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain]
    steps = outs[0].stats["num_verify_steps"]
    assert steps > 10 and outs[0].stats["accepted_tokens"] == 0
    assert speculator.calibration.trials[0][9] == steps and sum(map(sum, speculator.calibration.trials)) == steps
    assert speculator.calibration.survived[0][9] == 0.0
    assert speculator.calibration([0.95])[0] < 0.5
    assert not speculator._confidences  # nothing pending once the requests finished
