"""The pooled survival per draft position, and the adaptive budget's use of it for drafters
without confidences."""

import pytest

from services.decoder.spec.depth_survival import DepthSurvival, RequestSurvival
from services.decoder.spec.verify_budget import BudgetProfile, CostTable, choose_draft_lengths
from tests.spec.test_verify_budget_costs import _decoding_request


def measured_at_prior(depth: DepthSurvival) -> None:
    """Gives depth 0 as many trials as its prior's pseudo-trials, surviving at the prior: every
    rate stays the prior's, and the gate no longer caps drafts at one token (``unmeasured``)."""
    depth.trials[0] += depth.PRIOR_TRIALS
    depth.survived[0] += depth.PRIOR_TRIALS * depth.prior
    assert not depth.unmeasured()


def test_each_depth_counts_the_positions_whose_prefix_survived():
    depth = DepthSurvival(prior=0.5, max_depth=3)
    assert depth.rates(3) == [0.5] * 3
    depth.observe(3, 1)  # position 0 survived, 1 failed, 2 never tried
    depth.observe(2, 2)  # both survived; the draft ended before a failure
    depth.observe(3, 0)
    assert depth.trials == [3.0, 2.0, 0.0]
    assert depth.survived == [2.0, 1.0, 0.0]
    # 4 pseudo-trials at the prior for depth 0, at depth d - 1's rate for depth d
    r0 = (2 + 4 * 0.5) / (3 + 4)
    r1 = (1 + 4 * r0) / (2 + 4)
    assert depth.rates(3) == pytest.approx([r0, r1, r1])


def test_rates_beyond_the_deepest_depth_repeat_it_and_a_scale_is_capped():
    depth = DepthSurvival(prior=0.6, max_depth=2)
    depth.observe(2, 0)
    r0 = 0.6 * 4 / 5
    assert depth.rates(4) == pytest.approx([r0] * 4)
    assert depth.rates(2, scale=0.5) == pytest.approx([r0 / 2] * 2)
    assert depth.rates(2, scale=3.0) == [DepthSurvival.MAX_RATE] * 2


def test_depth_0_read_optimistically_adds_its_standard_error_which_widens_while_the_drafter_rests():
    """``rates(n, scale, optimism)`` raises depth 0 alone by ``optimism`` standard errors of its
    estimate (its trials and prior pseudo-trials); the counts ``relax`` moves to the long-run pool
    no longer vouch for it."""
    import math

    depth = DepthSurvival(prior=0.5, max_depth=2)
    depth.observe(1, 1)
    for _ in range(12):
        depth.observe(2, 0)
    r0, r1 = depth.rates(2)
    error = math.sqrt(r0 * (1 - r0) / (13 + DepthSurvival.PRIOR_TRIALS))
    assert depth.first_error() == pytest.approx(error)
    assert depth.rates(2, 0.5, optimism=2.0) == pytest.approx([r0 / 2 + 2 * error, r1 / 2])
    assert depth.rates(2, optimism=0.0) == [r0, r1]
    depth.relax(0.02, 50)
    assert depth.trials[0] == pytest.approx(13 * 0.98**50)
    assert depth.first_error() > 1.4 * error


def test_old_counts_are_scaled_down_so_the_profile_follows_a_change_of_text():
    depth = DepthSurvival(prior=0.5, max_depth=1)
    for _ in range(1000):
        depth.observe(1, 1)
    assert depth.trials[0] == pytest.approx(DepthSurvival.MAX_TRIALS)
    for _ in range(400):
        depth.observe(1, 0)
    # each of 400 failures after a full window of successes scales the survivals by 400 / 401
    survived = 400 * (400 / 401) ** 400  # ~ 400 / e
    assert depth.rates(1)[0] == pytest.approx((survived + 4 * 0.5) / (400 + 4))


def test_a_trial_counts_as_the_scale_its_request_was_predicted_at():
    """Survival = profile x scale: two requests predicted at 2x and 0.5x the profile, each
    surviving position 0 once in two tries, read the profile as 2 / (2 * 2 + 2 * 0.5) = 0.4."""
    depth = DepthSurvival(prior=0.4, max_depth=1)
    for scale in (2.0, 0.5):
        depth.observe(1, 1, scale)
        depth.observe(1, 0, scale)
    assert depth.trials == [5.0] and depth.survived == [2.0]
    assert depth.rates(1) == pytest.approx([(2 + 4 * 0.4) / (5 + 4)])
    assert depth.rates(1, scale=2.0) == pytest.approx([2 * (2 + 4 * 0.4) / (5 + 4)])
    with pytest.raises(ValueError, match="scale"):
        depth.observe(1, 1, 0.0)


@pytest.mark.parametrize("args", [(2, 3), (1, -1)])
def test_an_impossible_outcome_is_refused(args):
    with pytest.raises(ValueError, match="accepted"):
        DepthSurvival(0.5, 4).observe(*args)


def test_a_drafter_whose_second_position_rarely_survives_is_asked_for_one():
    """A drafter without confidences whose first position survives half the time and whose
    second almost never does: one rate over that mix (1/3 per position) would verify 2 positions
    on a step where each verified token costs 5% of the step; the profile verifies 1, and the
    gate asks for just that one."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.drafter import Draft, Drafter

    asks = []

    class Blind(Drafter):  # no confidences
        name = "blind"
        prior_acceptance = 0.5

        def propose_batch(self, requests):
            asks.append([r.max_tokens for r in requests])
            return [Draft([7] * r.max_tokens) for r in requests]

    request = _decoding_request()  # one pending token: it decodes next
    speculator = Speculator(Blind(), spec_tokens=4)
    steps = CostTable((1, 65), (0.010, 0.042))  # 0.5 ms per verified token on a 10 ms step
    speculator.profile = BudgetProfile(steps, CostTable((1, 16), (0.0, 0.0)))
    for i in range(100):
        speculator.record(request, 2, 1 if i % 2 else 0)
    assert choose_draft_lengths([[1 / 3] * 4], 1, 1, steps) == [2]  # one rate over the mix
    # each trial counted at the request's scale when recorded (its survival against the profile,
    # within a few % of 1 here): position 0 survives ~50%, position 1 ~4%
    r0, r1 = speculator.depth.rates(2)
    # (the weighting itself is checked exactly in the test above; the scale sits a few % below 1
    # here, since the profile's second position is still falling when the first records come)
    assert 0.47 < r0 < 0.55 and 0.03 < r1 < 0.05
    scale = speculator.survival(request).scale
    assert 0.9 < scale < 1.1
    survival = speculator._gate_survival(request, 4)  # no step reported yet: survival scale 1
    assert survival == pytest.approx([r0 * scale] + [r1 * scale] * 3)
    assert choose_draft_lengths([survival], 1, 1, steps) == [1]
    speculator.propose([request])
    assert asks == [[1]] and request.draft_ids == [7]


def test_expected_survivals_sum_the_profile_over_the_positions_tried():
    profile = DepthSurvival(0.5, 4)
    assert profile.expected(3, 1) == pytest.approx(0.5 + 0.5)  # positions 0 and 1 tried
    assert profile.expected(3, 3) == pytest.approx(1.5)  # all three tried, none failed
    assert profile.expected(0, 0) == 0.0


def test_relaxing_moves_the_profile_to_its_long_run_rate_and_that_back_to_the_prior():
    """100 relaxing steps at 5% leave 0.6% of the counts: relaxed towards the prior they read
    0.43; moved to the long-run pool (fading 8x slower) they keep the profile near what they found."""
    profile = DepthSurvival(0.5, 2)
    for _ in range(100):
        profile.observe(1, 0)
    low = profile.rates(1)[0]
    assert low < 0.05
    for _ in range(100):
        profile.relax(0.05)
    assert sum(profile.trials) < 1 and low < profile.rates(1)[0] < 0.1
    for _ in range(3000):
        profile.relax(0.05)
    assert profile.rates(1)[0] == pytest.approx(0.5, abs=1e-3)


def test_relaxing_n_steps_at_once_equals_n_relaxing_steps():
    """The gate relaxes the skipped steps since its last ask at once (``Speculator._catch_up``):
    the closed form must be what that many steps would have left, counts and long-run pool alike."""
    stepped, at_once = DepthSurvival(0.5, 3), DepthSurvival(0.5, 3)
    for profile in (stepped, at_once):
        for accepted in (0, 1, 3, 2, 0, 1):
            profile.observe(3, accepted)
        profile.relax(0.02)  # a pool to fade as well
    for _ in range(13):
        stepped.relax(0.02)
    at_once.relax(0.02, 13)
    for got, want in ((at_once.trials, stepped.trials), (at_once.survived, stepped.survived),
                      (at_once.long_trials, stepped.long_trials), (at_once.long_survived, stepped.long_survived)):
        assert got == pytest.approx(want, rel=1e-12)
    assert at_once.rates(3) == pytest.approx(stepped.rates(3), rel=1e-12)
    with pytest.raises(ValueError, match="times"):
        at_once.relax(0.02, 0)


def test_a_request_scale_is_observed_over_expected_survivals_shrunk_towards_one():
    """The Gamma-Poisson estimate: ``(observed + PRIOR) / (expected + PRIOR)``, evidence decayed by
    ``MEMORY`` per verify step; a run of rejections on a drafter whose steps are independent moves
    it little, a request that keeps beating the profile ends well above 1."""
    prior, memory = RequestSurvival.PRIOR, RequestSurvival.MEMORY
    survival = RequestSurvival()
    assert survival.scale == 1.0
    survival.update(0, 0.5)
    survival.update(2, 0.8)
    observed, expected = memory * 0 + 2, memory * 0.5 + 0.8
    assert survival.scale == pytest.approx((observed + prior) / (expected + prior))
    unlucky = RequestSurvival()
    for _ in range(5):  # five rejected 2-token drafts where the profile expected 0.45 each
        unlucky.update(0, 0.45)
    assert 0.8 < unlucky.scale < 1.0
    copying = RequestSurvival()
    for _ in range(100):
        copying.update(3, 0.45 + 0.2 + 0.1)
    assert copying.scale > 2.5
    before = unlucky.scale
    for _ in range(10):
        unlucky.idle()
    assert before < unlucky.scale < 1.0  # ages back towards the profile
    with pytest.raises(ValueError, match=">= 0"):
        RequestSurvival(-1.0, 0.0)


def test_positions_cut_before_verification_count_at_their_predicted_survival():
    """Drafts of 3 positions whose calibrated confidences are the truth (each drawn uniformly,
    independent: every depth survives half the time given the one before), cut where a
    confidence drops below 0.5, as a budget does. Counting the verified positions alone reads
    every depth near 0.75 (only sure positions reach verification); with the cut positions
    imputed at their confidences the profile reads the truth."""
    import random

    rng = random.Random(3)
    plain, imputed = DepthSurvival(0.5, 3), DepthSurvival(0.5, 3)
    plain.MAX_TRIALS = imputed.MAX_TRIALS = 1e9  # a plain mean over the whole run
    for _ in range(20000):
        confidences = [rng.random() for _ in range(3)]
        kept = next((i for i, c in enumerate(confidences) if c < 0.5), 3)
        accepted = next((i for i in range(kept) if rng.random() >= confidences[i]), kept)
        for depth in (plain, imputed):
            if kept:
                depth.observe(kept, accepted)
        if kept == 0:
            imputed.impute(0, confidences)
        elif accepted == kept:
            imputed.impute(kept, confidences[kept:])
    assert plain.rates(3) == pytest.approx([0.75] * 3, abs=0.02)
    assert imputed.rates(3) == pytest.approx([0.5] * 3, abs=0.02)
    assert imputed.trials[0] == pytest.approx(20000)


def test_the_speculator_imputes_what_the_confidences_cut_once_the_kept_draft_survived():
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.drafter import Draft, Drafter

    class Sure(Drafter):  # sure of its first position, not of the second
        name = "sure"
        prior_acceptance = 0.5
        has_confidences = True

        def propose_batch(self, requests):
            return [Draft([7] * r.max_tokens, [0.95, 0.05, 0.05][: r.max_tokens]) for r in requests]

    request = _decoding_request()
    speculator = Speculator(Sure(), spec_tokens=3)
    speculator.schedule.CONTROL_EVERY = 10**6
    # 2 ms per verified token on a 10 ms step: the first position pays, the second (0.05) does not
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010 + 63 * 0.002)), CostTable((1, 16), (0.0, 0.0)))
    measured_at_prior(speculator.depth)
    for accepted, imputed in ((1, 1.0), (0, 0.0)):
        trials = speculator.depth.trials[1]
        speculator.propose([request])
        assert request.draft_ids == [7]  # asked for 2 (predicted 1 + headroom), cut to 1
        speculator.record(request, 1, accepted)
        # survived: the cut second position counts as one trial at its survival (~0.05); rejected:
        # it would never have been tried
        assert speculator.depth.trials[1] == pytest.approx(trials + imputed)
    assert speculator.depth.survived[1] == pytest.approx(speculator.calibration([0.05])[0])
