"""The verify budget's plan after the drafter ran: the call's price is spent, but the step's time
holds it, so every length (none included) is priced with it and the plan keeps the length the
gate chose with the call charged, where nothing new is known of the draft."""

import pytest

from services.decoder.spec.verify_budget import BudgetProfile, CostTable
from tests.spec.test_depth_survival import measured_at_prior
from tests.spec.test_verify_budget_costs import _decoding_request

# 10 ms for one or two tokens (one token runs as two rows), 15 ms for three, flat after
STEP = CostTable((1, 2, 3, 64), (0.010, 0.010, 0.015, 0.015))
CALL_S = 0.006  # the drafter's call, one request


def test_the_plan_after_the_call_keeps_the_gates_length_where_nothing_new_is_known(monkeypatch):
    """Survival 0.8 at every depth: with the 6 ms call, one token commits 1.8 in 16 ms (0.1125 per
    ms) and two commit 2.44 in 21 (0.1162), so the gate asks for two. Priced without the call, the
    plan after it read 1.8 in 10 against 2.44 in 15 and cut the draft to one token."""
    import services.decoder.engine.speculation as speculation
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.drafter import Draft, Drafter

    monkeypatch.setattr(speculation.time, "perf_counter", lambda: 0.0)  # the calls take no time

    class Fixed(Drafter):
        name = "fixed"
        prior_acceptance = 0.8

        def propose_batch(self, requests):
            return [Draft([7] * r.max_tokens) for r in requests]

    request = _decoding_request()
    speculator = Speculator(Fixed(), spec_tokens=2)
    speculator.profile = BudgetProfile(STEP, CostTable((1, 16), (CALL_S, CALL_S)))
    measured_at_prior(speculator.depth)
    speculator.propose([request])
    assert speculator.promise.lengths == [2]
    assert speculator.promise.seconds == pytest.approx(0.015 + CALL_S)
    assert request.draft_ids == [7, 7] and speculator.plan.lengths == [2]
    # the step is held to the call and the 3-row pass, counted once
    assert speculator.plan.seconds == pytest.approx(0.015 + CALL_S)
    assert speculator.plan.expected_committed == pytest.approx(1 + 0.8 + 0.64)
