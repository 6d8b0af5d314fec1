"""The verify budget's attention pricing: what a step's decode / verify attention is counted as,
what the budget learns from it, and how it changes the draft lengths. Exact figures."""

import pytest

from services.decoder.model.attention import AttentionWork
from services.decoder.spec.attention_costs import AttentionCosts
from services.decoder.spec.verify_budget import CalibratedCosts, CostTable, choose_draft_plan, expected_committed
from tests.spec.test_verify_budget_costs import _decoding_request, _drafter

FLAT = CostTable((1, 64), (0.010, 0.010))  # 10 ms per step at any size


def test_each_path_is_measured_per_key_row_and_fetches_are_taken_out():
    costs = AttentionCosts(dense_s_per_row=1e-8)
    assert costs.seconds("dense", 1000) == pytest.approx(1e-5)
    assert costs.seconds("page_list", 10**6) == 0.0  # unmeasured: not charged
    # 30 ms of page-list attention, 10 of them host fetches, over 10,000 rows: 2 us per row
    costs.observe(AttentionWork(page_list_s=0.030, page_list_rows=10_000, fetch_s=0.010))
    assert costs.s_per_row["page_list"] == pytest.approx(2e-6)
    assert costs.s_per_row["dense"] == pytest.approx(1e-8)  # no dense rows this step
    # later steps move the figure WEIGHT of the way
    costs.observe(AttentionWork(page_list_s=0.040, page_list_rows=10_000))
    assert costs.s_per_row["page_list"] == pytest.approx(2e-6 + AttentionCosts.WEIGHT * 2e-6)
    costs.observe(AttentionWork(dense_s=0.001, dense_rows=20_000))
    assert costs.s_per_row["dense"] == pytest.approx(1e-8 + AttentionCosts.WEIGHT * (5e-8 - 1e-8))
    # too few rows to say anything: ignored
    costs.observe(AttentionWork(dense_s=1.0, dense_rows=10, page_list_s=1.0, page_list_rows=10))
    assert costs.s_per_row["dense"] == pytest.approx(1.4e-8)
    assert costs.s_per_row["page_list"] == pytest.approx(2.2e-6)


def _best_k(p: float, base_s: float, per_position_s: float, max_k: int = 7) -> int:
    rates = [expected_committed([p] * k) / (base_s + per_position_s * k) for k in range(max_k + 1)]
    return max(range(max_k + 1), key=lambda k: (rates[k], -k))


@pytest.mark.parametrize(("attend_base_ms", "attend_ms"), [(0, 0), (0, 2), (30, 2), (30, 10), (80, 20)])
def test_attention_per_position_and_in_the_base_step_set_the_length(attend_base_ms, attend_ms):
    """One request, positions surviving at 0.5, a 10 ms table: the choice is the brute-force best
    of E(k) / (10 ms + base attention + k x per-position attention). A position that reads many
    keys costs more (2 ms: one position), and a step that is mostly attention makes a draft
    relatively cheaper (30 ms base: three positions pay)."""
    plan = choose_draft_plan([[0.5] * 7], 1, 1, FLAT, attend_s_per_position=[attend_ms / 1e3],
                             attend_s_base=attend_base_ms / 1e3)
    expected = _best_k(0.5, 0.010 + attend_base_ms / 1e3, attend_ms / 1e3)
    assert plan.lengths == [expected]
    assert plan.seconds == pytest.approx(0.010 + (attend_base_ms + expected * attend_ms) / 1e3)
    assert plan.base_rate == pytest.approx(1 / (0.010 + attend_base_ms / 1e3))
    assert [_best_k(0.5, b / 1e3 + 0.01, a / 1e3) for b, a in ((0, 0), (0, 2), (30, 2))] == [7, 1, 3]


def test_the_step_table_learns_the_step_without_its_attention():
    """A 10 ms table and a step that took 40 ms, 30 of them page-list attention over 15,000 rows:
    the table is right (ratio 1), the attention costs 2 us per row, and a request whose next
    token reads 1,500 rows is priced 3 ms per verified position."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.verify_budget import BudgetProfile

    request = _decoding_request()
    speculator = Speculator(_drafter(), spec_tokens=4, query_key_rows=lambda r: ("page_list", 1500))
    speculator.profile = BudgetProfile(FLAT, CostTable((1, 16), (0.001, 0.001)), dense_attend_s_per_row=1e-8)
    assert speculator.attend_s_per_position(request) == 0.0  # page-list not measured yet
    speculator.observe_step(4, 0.040, AttentionWork(page_list_s=0.030, page_list_rows=15_000))
    assert speculator.step_costs.ratio_at(4) == pytest.approx(1.0)
    assert speculator.attend_s_per_position(request) == pytest.approx(0.003)
    without = Speculator(_drafter(), spec_tokens=4)  # no key-row counts: the table holds attention
    without.profile = BudgetProfile(FLAT, CostTable((1, 16), (0.001, 0.001)), dense_attend_s_per_row=1e-8)
    without.observe_step(4, 0.040, AttentionWork(page_list_s=0.030, page_list_rows=15_000))
    # 4x the table, moved as far as one measurement may (MAX_JUMP)
    assert without.step_costs.ratio_at(4) == pytest.approx(CalibratedCosts.MAX_JUMP)
    assert without.attend_s_per_position(request) == 0.0


@pytest.mark.parametrize("attention", ["dense", "sparse"])
def test_the_runner_counts_the_rows_the_budget_prices(loaded_model, attention):
    """On real weights: a decode step's measured ``AttentionWork`` holds exactly the key rows that
    ``query_key_rows`` predicted for its requests (two long prompts beyond a 7-page selection
    and a short one within it under sparse attention), and prefill steps count none."""
    from dhisparse import LLM, SamplingParams
    from tests.decoder.prompts import SHORT_PROMPTS, long_document

    settings = dict(attention="sparse", top_k_tokens=64, sink_pages=1, recent_pages=2) if attention == "sparse" else {}
    llm = LLM(loaded=loaded_model, max_num_batched_tokens=4096, **settings)
    engine, tok = llm.engine, loaded_model.tokenizer
    prompts = [tok.encode(long_document(n)) for n in (20, 45)] + [tok.encode(SHORT_PROMPTS[1])]
    works = []
    execute = engine.runner.execute

    def recording_execute(batch):
        output = execute(batch)
        works.append((batch, output.attention))
        return output

    engine.runner.execute = recording_execute
    for i, ids in enumerate(prompts):
        engine.add_request(ids, SamplingParams(max_tokens=4, ignore_eos=True), request_id=f"r{i}")
    while not any(all(s.num_new_tokens == 1 for s in batch) for batch, _ in works):
        predicted = {rid: engine.runner.query_key_rows(r) for rid, r in engine.requests.items()}
        engine.step()
    batch, work = works[-1]
    prefill_only = [w for b, w in works if all(s.num_new_tokens > 1 for s in b)]
    assert prefill_only and all(w.seconds == 0 and w.dense_rows == w.page_list_rows == 0 for w in prefill_only)
    paths = {rid: path for rid, (path, _) in predicted.items()}
    rows = {path: sum(n for p, n in predicted.values() if p == path) for path in ("dense", "page_list")}
    assert work.dense_rows == rows["dense"] and work.page_list_rows == rows["page_list"]
    if attention == "sparse":
        assert paths == {"r0": "page_list", "r1": "page_list", "r2": "dense"}
        assert work.page_list_rows > 0 and work.page_list_s > 0
    else:
        assert set(paths.values()) == {"dense"} and work.page_list_rows == 0
    assert work.dense_s > 0
