"""What the adaptive budget charges a draft: the step's padded GEMM rows and the drafter's asked
positions. Exact choices against hand-computed or brute-force optima."""

import pytest

import torch

from services.decoder.engine.step_profile import PROFILE_TOKENS, step_pads
from services.decoder.model.gemm_plan import GemmPlan
from services.decoder.model.linear import PACK_BUCKETS_ROWS, Linear, pack_bucket
from services.decoder.spec.verify_budget import CostTable, choose_draft_lengths, choose_draft_plan, expected_committed

FP32_MS = (10.0, 10.0, 10.0, 10.0, 10.0, 13.0, 30.0, 60.0)  # at PROFILE_TOKENS: the 8-row pack is 4 rows' cost
# the Intel AMX machine's plan: plain sgemm at 1-3 rows, MKL packs at 4-64
PACKS_PLAN = GemmPlan((3, 64, 128), ("f_linear", "mkl_pack", "f_linear"))
PADDED = CostTable(PROFILE_TOKENS, tuple(ms / 1e3 for ms in FP32_MS),
                   step_pads(Linear(torch.zeros(4, 4), plan=PACKS_PLAN), PROFILE_TOKENS))
LINEAR = CostTable(PROFILE_TOKENS, PADDED.seconds)  # the same points read as a smooth curve


def test_the_padded_table_prices_a_count_at_the_bucket_the_gemm_runs():
    for count in range(1, 90):
        assert PADDED.padded(count) == (pack_bucket(count) or count)
    assert PADDED.seconds_at(9) == PADDED.seconds_at(16) == pytest.approx(0.013)
    assert PADDED.seconds_at(17) == pytest.approx(0.030)
    assert LINEAR.seconds_at(12) == pytest.approx(0.0115)  # what interpolation would have charged
    assert PADDED.seconds_at(3) == pytest.approx(0.010)
    assert PADDED.seconds_at(96) == pytest.approx(0.090)  # beyond the packs: the last slope
    with pytest.raises(ValueError):
        CostTable((1, 8), (0.01, 0.02), ((5, 8), (12, 16)))  # a bucket that was not profiled


def _true_rate(lengths, p, base):
    tokens = base + sum(lengths)
    return sum(expected_committed([p] * k) for k in lengths) / PADDED.seconds_at(tokens)


def test_drafts_fill_the_gemm_bucket_instead_of_spilling_into_the_next():
    """Four decoding requests, each position surviving at 0.6. Padded, the budget's choice is the
    brute-force best over every split of draft tokens (1 - 7 each): it fills the 16-row bucket.
    Interpolated, it stops part-way into that bucket, where the GEMM already runs 16 rows: a
    worse true rate."""
    p, base = 0.6, 4
    chosen = choose_draft_lengths([[p] * 7] * 4, base, base, PADDED)
    best = max(((a, b, c, d) for a in range(8) for b in range(8) for c in range(8) for d in range(8)),
               key=lambda lengths: _true_rate(lengths, p, base))
    assert _true_rate(chosen, p, base) == pytest.approx(_true_rate(best, p, base))
    assert base + sum(chosen) == 16
    interpolated = choose_draft_lengths([[p] * 7] * 4, base, base, LINEAR)
    assert base + sum(interpolated) not in PACK_BUCKETS_ROWS
    assert _true_rate(interpolated, p, base) < _true_rate(chosen, p, base) * 0.99


def test_each_asked_position_costs_the_drafter_time():
    """A memory-bound step (10 ms at any size), positions surviving at 0.5: free positions are
    all worth verifying; at 2 ms of drafter time each, E(k) / (10 + 2k) ms is 1.5 / 12 = 1.75 / 14
    for k = 1, 2 and lower after: the tie goes to the shorter draft."""
    flat = CostTable((1, 64), (0.010, 0.010))
    assert choose_draft_lengths([[0.5] * 7], 1, 1, flat) == [7]
    assert choose_draft_lengths([[0.5] * 7], 1, 1, flat, draft_s_per_position=0.002) == [1]


def test_the_plan_states_what_it_expects_and_what_it_is_priced_at():
    """Four requests at 0.6 per position, padded fp32 table: the plan's expected tokens are the
    bonus tokens plus each draft's expected accepted prefix, its seconds the padded step plus
    0.5 ms per position, and its gain their rate over four tokens in the 4-token step."""
    p, base = 0.6, 4
    plan = choose_draft_plan([[p] * 7] * 4, base, base, PADDED, draft_s_per_position=0.0005)
    tokens = base + sum(plan.lengths)
    assert plan.lengths == choose_draft_lengths([[p] * 7] * 4, base, base, PADDED, draft_s_per_position=0.0005)
    assert plan.expected_committed == pytest.approx(sum(expected_committed([p] * k) for k in plan.lengths))
    assert plan.seconds == pytest.approx(PADDED.seconds_at(tokens) + 0.0005 * sum(plan.lengths))
    assert plan.base_rate == pytest.approx(4 / PADDED.seconds_at(4))
    assert plan.gain == pytest.approx(plan.expected_committed / plan.seconds / plan.base_rate)
    assert plan.gain > 1.0
    # eight requests fill the 8-row bucket: a 5% position would cost the 16-row GEMM, the empty plan wins
    none = choose_draft_plan([[0.05] * 7] * 8, 8, 8, PADDED)
    assert none.lengths == [0] * 8 and none.gain == pytest.approx(1.0)
    assert none.seconds == pytest.approx(PADDED.seconds_at(8)) and none.expected_committed == 8



def _decoding_request(request_id: str = "r"):
    """A request with one pending token (it decodes next) and room for a draft."""
    from services.decoder.engine.request import Request
    from services.decoder.engine.sampling_params import SamplingParams
    from services.decoder.engine.stop_checker import StopChecker

    class Tok:
        def decode(self, ids, **kw):
            return ""

    params = SamplingParams(max_tokens=64)
    request = Request(request_id, [1, 2, 3], params, StopChecker(Tok(), params, ()), max_model_len=1024)
    request.num_computed_tokens = 2
    return request


def _drafter(prepare_s: float = 0.0, prior: float = 0.9, confidences: bool = False):
    import time

    from services.decoder.spec.drafter import Draft, Drafter

    class Fixed(Drafter):
        name = "fixed"
        prior_acceptance = prior
        has_confidences = confidences

        def prepare(self, request_ids):
            time.sleep(prepare_s)

        def propose_batch(self, requests):
            return [Draft([7] * r.max_tokens, [0.9] * r.max_tokens if confidences else None) for r in requests]

    return Fixed()


# 10 ms per step at any size, a 1 ms drafter call
FLAT_PROFILE = (CostTable((1, 64), (0.010, 0.010)), CostTable((1, 16), (0.001, 0.001)))


def test_the_drafters_deferred_context_work_is_not_priced_as_its_call():
    """A drafter whose ``prepare`` (a backlog of observed positions) takes 50 ms and whose call
    takes none: the call's cost correction moves down (halved: the most one measurement moves it),
    not up to 2x, which priced every idle stretch's backlog into the next call and kept the
    drafter off ever longer."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.verify_budget import BudgetProfile

    request = _decoding_request()
    speculator = Speculator(_drafter(prepare_s=0.05), spec_tokens=4)
    speculator.profile = BudgetProfile(*FLAT_PROFILE)
    speculator.propose([request])
    assert speculator.num_drafter_calls == 1 and request.draft_ids
    assert speculator.draft_costs.ratio_at(1) == pytest.approx(0.5)


@pytest.mark.parametrize("confidences", [True, False])
def test_the_gate_reads_the_pooled_estimate_when_drafts_carry_confidences(confidences):
    """Pooled survival 0.6, the request's own 0.01 (10% of a 10 ms step: the 1 ms call needs 0.1
    or so). With confidences the gate reads the pooled estimate and the drafter runs (its
    confidences then judge this request's draft); without, the request's own estimate keeps it off."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.depth_survival import RequestSurvival
    from services.decoder.spec.verify_budget import BudgetProfile

    request = _decoding_request()
    speculator = Speculator(_drafter(prior=0.6, confidences=confidences), spec_tokens=4)
    speculator.profile = BudgetProfile(*FLAT_PROFILE)
    # no survivals where the profile expected 59 priors' worth: scale 1/60, so 0.6 reads as 0.01
    request.survival = RequestSurvival(observed=0.0, expected=59 * RequestSurvival.PRIOR)
    speculator.propose([request])
    assert speculator.num_drafter_calls == (1 if confidences else 0)
    assert bool(request.draft_ids) is confidences


def test_a_measured_base_shifts_every_price_by_what_it_differs_from_the_table():
    """A step table at 10 ms + 1 ms per token beyond the first, a drafter call of 2 ms, one
    position at survival 0.5. Priced on the table the draft promises 1.5 tokens in 13 ms against
    1 in 10 (x1.15) and is taken; with the base measured at 4 ms it is 1.5 in 7 ms against 1 in
    4 (x0.86) and it is not. A dearer measured base (20 ms) shifts the draft's price as much."""
    costs = CostTable((1, 64), (0.010, 0.073))
    table = choose_draft_plan([[0.5]], 1, 1, costs, draft_s=0.002)
    assert table.lengths == [1] and table.seconds == pytest.approx(0.013) and table.base_rate == pytest.approx(100.0)
    cheap = choose_draft_plan([[0.5]], 1, 1, costs, draft_s=0.002, base_s=0.004)
    assert cheap.lengths == [0] and cheap.seconds == pytest.approx(0.004) and cheap.base_rate == pytest.approx(250.0)
    dear = choose_draft_plan([[0.5]], 1, 1, costs, draft_s=0.002, base_s=0.020)
    assert dear.lengths == [1] and dear.seconds == pytest.approx(0.023) and dear.base_rate == pytest.approx(50.0)
    assert dear.expected_committed == pytest.approx(1.5)
