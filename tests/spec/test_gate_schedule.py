"""When the adaptive budget's gate asks and what it measures: control steps (no drafts) that
measure the base it compares drafting against, and the rest it takes while no draft pays."""

import pytest

from services.decoder.spec.gate_schedule import GateSchedule
from services.decoder.spec.verify_budget import BudgetProfile, CostTable
from tests.spec.test_depth_survival import measured_at_prior
from tests.spec.test_realized_gain import _one_request_speculator
from tests.spec.test_verify_budget_costs import _decoding_request


def test_every_so_many_drafting_steps_a_control_step_measures_the_base_the_gate_compares_with():
    speculator, request, drafter = _one_request_speculator()
    speculator.schedule.CONTROL_EVERY = 4
    speculator.observe_step(1, 0.010)  # a plain step before: the 1-token price has a measurement
    for _ in range(4):
        speculator.propose([request])
        assert speculator.promise is not None
        speculator.observe_step(2, 0.010, decoded=(1, 2))  # the draft survives: the survival scale stays 1
    calls = drafter.calls
    speculator.propose([request])  # the control step: no drafter call, no draft, nothing promised
    assert drafter.calls == calls and speculator.promise is None
    assert speculator.schedule.num_control_steps == 1 and speculator.schedule.num_skipped_steps == 0
    costs = speculator.step_costs
    before, shape = costs.seconds_at(1), costs.shape_at(1)
    # plain steps really take 6 ms where the table says 10: a control step's measurement moves its
    # count's shape CONTROL_WEIGHT of the way at once (an ordinary one: WEIGHT; the speed as ever)
    speculator.observe_step(1, 0.006, decoded=(1, 1))
    assert costs.shape_at(1) == pytest.approx(shape + speculator.schedule.CONTROL_WEIGHT * (0.6 / costs.speed - shape))
    assert costs.seconds_at(1) < 0.5 * (before + 0.006) + 1e-4
    speculator.propose([request])  # the streak starts again
    assert drafter.calls == calls + 1 and speculator.schedule.drafting_streak == 1



def test_no_control_step_where_the_streak_measured_the_base_at_its_padded_size():
    """At c=1 a 1-token step runs as 2 rows (the table's pad): one-token drafts (2-token steps)
    measure the base's price, so the streak needs no control step; once a drafting step of the
    streak runs at another size only, the base is measured by a control step again."""
    speculator, request, drafter = _one_request_speculator()
    speculator.profile = BudgetProfile(CostTable((1, 2, 64), (0.010, 0.010, 0.010), ((1, 2),)),
                                       CostTable((1, 16), (0.0, 0.0)))
    speculator.schedule.CONTROL_EVERY = 4
    for _ in range(12):
        speculator.propose([request])
        assert speculator.promise is not None  # drafting on: no control step
        speculator.observe_step(2, 0.010, decoded=(1, 2))
    assert speculator.schedule.num_control_steps == 0 and speculator.schedule.drafting_streak == 12
    unpadded, _, _ = _one_request_speculator()  # the same steps, 1 token not padded to 2
    unpadded.schedule.CONTROL_EVERY = 4
    for _ in range(5):
        unpadded.propose([request])
        unpadded.observe_step(2, 0.010, decoded=(1, 2))
    assert unpadded.schedule.num_control_steps == 1


def test_after_a_run_of_skipped_steps_the_gate_asks_every_few_steps_and_at_once_when_the_batch_changes():
    """A drafter whose drafts never pay (400 failed ones): the gate skips every step. After
    REST_AFTER skipped steps it prices a plan every REST_EVERY steps only; the steps
    between are skipped steps all the same (the estimates relax, the requests' evidence ages).
    A second request arriving makes it ask at once. After REST_LONG_AFTER skipped steps it asks
    every REST_LONG_EVERY steps."""
    speculator, request, drafter = _one_request_speculator()
    for _ in range(400):
        speculator.depth.observe(1, 0)
    plans = []
    worth = speculator._worth_the_drafter
    speculator._worth_the_drafter = lambda *args: plans.append(speculator.schedule.skipped_streak) or worth(*args)
    steps = speculator.schedule.REST_AFTER + 3 * speculator.schedule.REST_EVERY + 1  # asks at the last
    for _ in range(steps):
        speculator.propose([request])
        assert speculator.promise is None and speculator.plan is None
    assert drafter.calls == 0 and speculator.schedule.num_skipped_steps == steps
    assert len(plans) == speculator.schedule.REST_AFTER + 4
    trials = speculator.depth.trials[0]
    speculator.propose([request])  # a resting step: skipped all the same
    assert len(plans) == speculator.schedule.REST_AFTER + 4 and speculator.schedule.num_skipped_steps == steps + 1
    assert speculator.depth.trials[0] == trials  # the estimates relax when the gate next asks
    other = _decoding_request()
    other.request_id = "r2"
    speculator.propose([request, other])  # two candidates where the gate last saw one: it asks
    assert len(plans) == speculator.schedule.REST_AFTER + 5
    # relaxed before it priced, once for each step skipped since the last ask (that ask's and the rest's)
    assert speculator.depth.trials[0] == pytest.approx(trials * (1 - speculator.COST_RELAX) ** 2)
    schedule = speculator.schedule
    asked = len(plans)
    for _ in range(schedule.REST_LONG_AFTER + 3 * schedule.REST_LONG_EVERY - schedule.skipped_streak):
        speculator.depth.observe(1, 0)  # fresh failures (the relaxed evidence would try a draft)
        speculator.propose([request, other])
    long_rest = [streak for streak in plans[asked:] if streak >= schedule.REST_LONG_AFTER]
    assert drafter.calls == 0 and long_rest == [64, 80, 96]
    assert all(streak % schedule.REST_EVERY == 0 for streak in plans[asked:])


def test_the_first_draft_after_a_run_of_skipped_steps_verifies_one_token_per_request():
    """A probe: the gate asks again after REST_AFTER skipped steps, its estimates relaxed rather
    than measured; it verifies depth 0 alone, and the step after it drafts the full length."""
    from services.decoder.spec.depth_survival import DepthSurvival

    speculator, request, drafter = _one_request_speculator(spec_tokens=4)
    for _ in range(400):
        speculator.depth.observe(1, 0)  # the drafter fails: the gate skips
    for _ in range(speculator.schedule.REST_AFTER):
        speculator.propose([request])
    assert drafter.calls == 0 and speculator.schedule.skipped_streak == speculator.schedule.REST_AFTER
    speculator.depth = DepthSurvival(0.9, 4)  # the text changed: drafts of 4 would pay now
    # measured, not the prior alone (``unmeasured``), and still so after the skipped steps relax it at the ask
    measured_at_prior(speculator.depth)
    measured_at_prior(speculator.depth)
    speculator.propose([request])
    assert drafter.calls == 1 and request.draft_ids == [7]
    speculator.observe_step(2, 0.010, decoded=(1, 2))
    speculator.propose([request])
    assert drafter.calls == 2 and request.draft_ids == [7] * 4


@pytest.mark.parametrize("call_s, draft", [(0.004, [7]), (0.006, [7, 7])])
def test_a_probe_drafts_longer_where_one_token_cannot_pay_for_the_drafters_call(call_s, draft):
    """A probe (the first draft after a run of skipped steps) whose one-token drafts cannot pay
    for the drafter's call plans the full lengths instead: 10 ms steps, survival 0.5 at every
    depth, a call of 4 ms lets one token pay (1.5 / 1.4 of no draft), one of 6 ms does not (1.5 /
    1.6) where two tokens do (1.75 / 1.6). Capped at one token, such a gate never drafted again
    (DSpark, c=4: 99 of 202 skipped asks at 4 requests were probes; fixed two-token drafts ran
    1.07x of the plain steps there)."""
    speculator, request, drafter = _one_request_speculator(spec_tokens=2)
    speculator.profile = BudgetProfile(CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (call_s, call_s)))
    measured_at_prior(speculator.depth)
    speculator.schedule.skipped_streak = GateSchedule.REST_AFTER  # a run of skipped steps: the gate probes
    speculator.propose([request])
    assert drafter.calls == 1 and request.draft_ids == draft


def test_an_engines_first_drafts_verify_one_token_until_depth_0_is_measured():
    """A prior that says drafts of 4 pay: the first PRIOR_TRIALS drafts, whose depth 0 rests on
    the prior alone, verify one token each; once measured (all survived) the gate drafts 4."""
    from services.decoder.spec.depth_survival import DepthSurvival

    speculator, request, drafter = _one_request_speculator(spec_tokens=4)
    speculator.depth = DepthSurvival(0.9, 4)
    lengths = []
    for _ in range(int(DepthSurvival.PRIOR_TRIALS) + 2):
        speculator.propose([request])
        lengths.append(len(request.draft_ids))
        speculator.observe_step(1 + lengths[-1], 0.010, decoded=(1, 1 + lengths[-1]))
        speculator.record(request, lengths[-1], lengths[-1])
    assert lengths == [1] * int(DepthSurvival.PRIOR_TRIALS) + [4, 4]


def test_plain_steps_are_kept_per_request_count_and_the_gate_prices_its_base_at_them():
    """The table says 10 ms for any step; plain one-request steps take 4 ms. Once measured, the
    gate's base is what they took and a drafted position costs what the table adds to it; a
    drafting step, a step with a prefill chunk and a step of another request count leave the
    one-request figure alone."""
    speculator, request, _ = _one_request_speculator()
    schedule = speculator.schedule
    assert schedule.plain_s(1, 0.010) is None
    speculator.propose([request])
    assert speculator.promise.base_rate == pytest.approx(100.0) and speculator.promise.seconds == pytest.approx(0.010)
    speculator.observe_step(2, 0.012, decoded=(1, 2))  # a drafting step
    speculator.observe_step(40, 0.2, decoded=None)  # a prefill chunk ran in the pass
    speculator.observe_step(2, 0.009, decoded=(2, 2))  # two requests decoding
    assert schedule.plain_s(1, 0.010) is None and schedule.plain_s(2, 0.010) == pytest.approx(0.009)
    speculator.observe_step(1, 0.004, decoded=(1, 1))
    speculator.observe_step(1, 0.005, decoded=(1, 1))
    assert schedule.plain_s(1, 0.010) == pytest.approx(0.004 + GateSchedule.PLAIN_WEIGHT * 0.001)
    # (the table learns from the same steps: its marginal second is its own, the base is measured)
    costs = speculator.step_costs
    base_s = schedule.plain_s(1, costs.seconds_at(1))
    assert base_s == pytest.approx(0.0042)  # below what the (corrected) table prices the step at
    for survival in (0.99, 0.1):
        plan = speculator._plan([request], [request], [[survival]])  # (decoding, drafting, survivals)
        assert plan.base_rate == pytest.approx(1 / base_s)
        n = plan.lengths[0]
        assert plan.seconds == pytest.approx(base_s + costs.seconds_at(1 + n) - costs.seconds_at(1))
    assert plan.lengths == [0]


def test_a_measured_base_far_above_the_tables_price_is_priced_near_the_table():
    """Plain steps measured in a slow spell (30 ms where the table says 10, and after learning from
    them, 20: one measurement moves it at most 2x) do not stay the base
    the gate drafts against: the table follows the machine, the kept figure only its plain
    steps, and at c=16 sparse chat a spell's 107 ms base for 70 ms steps had the gate draft at
    0.8x of the base (0.935 of no speculation). The base is trusted up to ``PLAIN_ABOVE_PRICE``
    over the price (a one-token decode measured 3-4% over its two-row price at c=1). One outlier
    moves the figure at most ``PLAIN_MAX_JUMP``."""
    speculator, request, _ = _one_request_speculator()
    speculator.observe_step(1, 0.030, decoded=(1, 1))
    priced = speculator.step_costs.seconds_at(1)
    capped = priced * GateSchedule.PLAIN_ABOVE_PRICE
    assert capped < 0.030 and speculator.schedule.plain_s(1, priced) == pytest.approx(capped)
    assert speculator._plan([request], [request], [[0.5]]).base_rate == pytest.approx(1 / capped)
    schedule = GateSchedule()
    schedule.measured_plain_step(4, 0.040)
    assert schedule.plain_s(4, 1.0) == pytest.approx(0.040)
    assert schedule.plain_s(4, 0.039) == pytest.approx(0.040)  # 2.6% over the price: the measurement holds
    assert schedule.plain_s(4, 0.035) == pytest.approx(0.035 * GateSchedule.PLAIN_ABOVE_PRICE)
    schedule.measured_plain_step(4, 0.400)  # one preempted step
    jump = 0.040 * GateSchedule.PLAIN_MAX_JUMP
    assert schedule.plain_s(4, 1.0) == pytest.approx(0.040 + GateSchedule.PLAIN_WEIGHT * (jump - 0.040))
    with pytest.raises(ValueError, match="positive"):
        schedule.measured_plain_step(4, 0.0)


def test_beside_prefill_chunks_a_draft_costs_a_token_at_the_steps_size_against_plain_decoding():
    """Drafts in a step with prefill chunks: a drafted position costs what one more token costs at
    the whole step's size (here 10 ms a token beyond 8, where a decode's few tokens cost nothing
    more), and its gain is measured against plain decoding's rate (the decodes' plain step), not
    the mixed step's nor a table price that counts a prefilling request as a decode."""
    speculator, request, drafter = _one_request_speculator()
    speculator.profile = BudgetProfile(CostTable((1, 8, 512), (0.010, 0.010, 5.0)), CostTable((1, 16), (0.0, 0.0)))
    speculator.propose([request])
    assert request.draft_ids == [7] and speculator.promise.base_rate == pytest.approx(100.0)
    calls = drafter.calls
    speculator.propose([request], prefill_tokens=500)  # 1.5 tokens in 20 ms: below plain decoding's 100/s
    assert drafter.calls == calls and speculator.promise is None and speculator.schedule.num_skipped_steps == 1
    plan = speculator._plan([request], [request], [[0.99]])
    assert plan.lengths == [0] and plan.base_rate == pytest.approx(100.0) and plan.seconds == pytest.approx(0.010)
    # a request still prefilling commits nothing of the decodes': the base is one decode's plain step
    prefilling = _decoding_request()
    prefilling.num_computed_tokens = 0
    speculator._prefill_tokens = 0
    speculator.propose([request, prefilling])
    assert speculator._decoding == [request]
    plan = speculator._plan([request], [request], [[0.5]])
    assert plan.base_rate == pytest.approx(100.0) and plan.lengths == [1]
    assert plan.expected_committed == pytest.approx(1.5)
