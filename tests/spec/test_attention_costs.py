"""The verify budget's attention pricing: what a step's decode / verify attention is counted as,
what the budget learns from it, and how it changes the draft lengths. Exact figures."""

import pytest

from services.decoder.model.attention import AttentionWork
from services.decoder.spec.attention_costs import AttentionCosts, LineFit
from services.decoder.spec.verify_budget import CalibratedCosts, CostTable, choose_draft_plan, expected_committed
from tests.spec.test_verify_budget_costs import _decoding_request, _drafter

FLAT = CostTable((1, 64), (0.010, 0.010))  # 10 ms per step at any size


def test_a_line_fit_finds_the_fixed_part_and_the_slope():
    """Steps that cost 30 ms + 0.4 us per row: the fit recovers both from two row counts; with one
    row count only (every request decoding one token) and no profile it cannot see a fixed part
    and goes through 0; with a profile's line the slope is the profile's and the fixed part the
    steps' (the profile's 10 ms fixed part was wrong here), until spread steps say otherwise."""
    fit = LineFit()
    assert fit.line() == (0.0, 0.0) and not fit.known
    for rows in (40_000, 320_000, 40_000, 320_000):
        fit.observe(rows, 0.030 + 0.4e-6 * rows)
    assert fit.line() == pytest.approx((0.030, 0.4e-6))
    one = LineFit()
    one.observe(40_000, 0.046)
    assert one.line() == pytest.approx((0.0, 0.046 / 40_000))
    # the profile: 10 ms + 0.4 us per row over 8,640 .. 552,960 rows; serving sees 46,680 rows at 48.7 ms
    anchored = LineFit(prior=tuple((r, 0.010 + 0.4e-6 * r) for r in (8_640, 34_560, 138_240, 552_960)))
    for _ in range(30):
        anchored.observe(46_680, 0.030 + 0.4e-6 * 46_680)
    assert anchored.line() == pytest.approx((0.030, 0.4e-6))
    for rows in (93_360, 186_720, 373_440):  # verify steps: 0.3 us per row over there
        anchored.observe(rows, 0.030 + 0.4e-6 * 46_680 + 0.3e-6 * (rows - 46_680))
    assert 0.3e-6 < anchored.line()[1] < 0.4e-6
    # a negative intercept (rows cost more than proportionally) is refitted through 0
    steep = LineFit()
    for rows in (1_000, 2_000):
        steep.observe(rows, 1e-6 * rows - 0.0005)
    assert steep.line()[0] == 0.0 and steep.line()[1] > 0


def test_each_path_is_fed_its_own_measurements_and_fetches_are_taken_out():
    # a profile of 1 and 2 query tokens on one 10,000-row context: 1 ms, then 0.1 ms more
    costs = AttentionCosts(dense_prior=((10_000, 10_000, 0.001), (20_000, 10_000, 0.0011)))
    assert costs.dense.s_per_query_row == pytest.approx(1e-8) and costs.position_s("dense", 10_000) == pytest.approx(1e-4)
    assert costs.seconds("dense", 30_000, 10_000) == pytest.approx(0.0012)
    assert costs.seconds("page_list", 10**6, 10**6) == 0.0 and costs.seconds("dense", 0, 0) == 0.0  # unmeasured; not run
    # 30 ms of page-list attention, 10 of them host fetches, over 10,000 rows
    costs.observe(AttentionWork(page_list_s=0.030, page_list_rows=10_000, fetch_s=0.010))
    assert costs.seconds("page_list", 10_000, 10_000) == pytest.approx(0.020)
    assert costs.position_s("page_list", 1_000) == pytest.approx(0.002)
    assert costs.dense.num_observed == 0  # no dense rows this step
    costs.observe(AttentionWork(dense_s=1.0, dense_rows=10, dense_context_rows=10, page_list_s=1.0, page_list_rows=10))
    assert costs.dense.num_observed == 0 and costs.page_list.num_observed == 1  # too few rows


def test_a_dense_verify_token_costs_its_scoring_not_another_read_of_its_context():
    """Dense attention gathers each request's keys and values once, whatever its query count:
    the profile (1 to 8 query tokens on one 7,710-row context, 2 ms + 0.05 us per query row) gives
    the query part; decode steps at 4 x 180,000 context rows (6K tokens x 30 layers) that take
    340 ms fit the context line, and a drafted position there costs 180,000 x 0.05 us = 9 ms, not
    the 85 ms of a whole read (the one-line model's price). A profile of one step size measures
    no query part: a query row is then priced like a context row."""
    context = 7_710
    prior = tuple((n * context, context, 0.002 + 0.05e-6 * (n - 1) * context) for n in (1, 2, 4, 8))
    costs = AttentionCosts(dense_prior=prior)
    assert costs.dense.s_per_query_row == pytest.approx(0.05e-6)
    for _ in range(40):
        costs.observe(AttentionWork(dense_s=0.340, dense_rows=720_000, dense_context_rows=720_000))
    assert costs.seconds("dense", 720_000, 720_000) == pytest.approx(0.340, rel=0.01)
    assert costs.position_s("dense", 180_000) == pytest.approx(0.009)
    # a verify step of 2 tokens each: the reads once, the scoring twice
    assert costs.seconds("dense", 1_440_000, 720_000) == pytest.approx(0.340 + 0.036, rel=0.01)
    one_size = AttentionCosts(dense_prior=((context, context, 0.002),))
    assert one_size.position_s("dense", context) == pytest.approx(0.002)


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
                             base_extra_s=attend_base_ms / 1e3)
    expected = _best_k(0.5, 0.010 + attend_base_ms / 1e3, attend_ms / 1e3)
    assert plan.lengths == [expected]
    assert plan.seconds == pytest.approx(0.010 + (attend_base_ms + expected * attend_ms) / 1e3)
    assert plan.base_rate == pytest.approx(1 / (0.010 + attend_base_ms / 1e3))
    assert [_best_k(0.5, b / 1e3 + 0.01, a / 1e3) for b, a in ((0, 0), (0, 2), (30, 2))] == [7, 1, 3]


def test_the_step_table_learns_the_step_without_its_attention():
    """A 10 ms table and a step that took 40 ms, 30 of them page-list attention over 15,000 rows:
    the table is right (ratio 1), and a request whose next token reads 1,500 rows is priced at
    the page-list line's slope times those rows per verified position (one row count measured:
    the line goes through 0, 2 us per row, 3 ms)."""
    from services.decoder.engine.speculation import Speculator
    from services.decoder.spec.verify_budget import BudgetProfile

    request = _decoding_request()
    profile = BudgetProfile(FLAT, CostTable((1, 16), (0.001, 0.001)), dense_attention_points=((7_680, 7_680, 0.001),))
    speculator = Speculator(_drafter(), spec_tokens=4, query_key_rows=lambda r: ("page_list", 1500))
    speculator.profile = profile
    assert speculator.prices.attend_s_per_position(request) == 0.0  # page-list not measured yet
    speculator.observe_step(4, 0.040, AttentionWork(page_list_s=0.030, page_list_rows=15_000))
    assert speculator.step_costs.ratio_at(4) == pytest.approx(1.0)
    assert speculator.prices.attend_s_per_position(request) == pytest.approx(0.003)
    assert speculator.prices.attend_s([(request, 10)]) == pytest.approx(0.030)
    without = Speculator(_drafter(), spec_tokens=4)  # no key-row counts: the table holds attention
    without.profile = profile
    without.observe_step(4, 0.040, AttentionWork(page_list_s=0.030, page_list_rows=15_000))
    # 4x the table, moved as far as one measurement may (MAX_JUMP)
    assert without.step_costs.ratio_at(4) == pytest.approx(CalibratedCosts.MAX_JUMP)
    assert without.prices.attend_s_per_position(request) == 0.0


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
    assert work.dense_context_rows == work.dense_rows  # one query token each: each context read once
    if attention == "sparse":
        assert paths == {"r0": "page_list", "r1": "page_list", "r2": "dense"}
        assert work.page_list_rows > 0 and work.page_list_s > 0
    else:
        assert set(paths.values()) == {"dense"} and work.page_list_rows == 0
    assert work.dense_s > 0


def test_a_sparse_engines_profile_times_both_attention_paths(loaded_model):
    """The start-up profile of a sparse engine with the adaptive budget: dense attention at every
    step size (its request is within the selection budget), the page-list path at 1, 4, 16 and 64
    tokens (forced, then switched back); each path's rows grow with the tokens, and the
    speculator's lines start from those points. With a budget below the profile's context its
    steps select anyway: then they are the page-list points, and there are no dense ones."""
    from dhisparse import LLM
    from services.decoder.engine.step_profile import PAGE_LIST_PROFILE_TOKENS, PROFILE_TOKENS

    llm = LLM(loaded=loaded_model, spec="ngram", spec_tokens=4, verify_budget="adaptive", attention="sparse",
              top_k_tokens=1024, sink_pages=1, recent_pages=2)  # the profile's 256 tokens within the budget
    speculator, runner = llm.engine.speculator, llm.engine.runner
    profile = speculator.profile
    dense, page_list = profile.dense_attention_points, profile.page_list_attention_points
    assert len(dense) == len(PROFILE_TOKENS) and len(page_list) == len(PAGE_LIST_PROFILE_TOKENS)
    for points in (dense, page_list):
        rows = [p[0] for p in points]
        assert rows == sorted(set(rows)) and all(p[-1] > 0 for p in points)
    # one token 256 positions in (17 pages, all selected): 30 layers x (17 x 16 selected + 2 x 17 digest rows)
    assert page_list[0][0] == 30 * (17 * 16 + 2 * 17)
    assert dense[0][:2] == (30 * 257, 30 * 257)
    # n query tokens on one request: its context gathered once, 30 x (256 + n) rows at its last token
    assert [c for _, c, _ in dense] == [30 * (256 + n) for n in PROFILE_TOKENS]
    assert not runner.force_selection and llm.engine.allocator.num_free_slots == llm.engine.allocator.num_slots
    costs = speculator.prices.attention_costs
    assert costs.dense.context.known and costs.page_list.known and costs.position_s("page_list", 1) > 0
    assert costs.dense.s_per_query_row > 0
    small = LLM(loaded=loaded_model, spec="ngram", spec_tokens=4, verify_budget="adaptive", attention="sparse",
                top_k_tokens=64, sink_pages=1, recent_pages=2)
    profile = small.engine.speculator.profile
    assert not profile.dense_attention_points and len(profile.page_list_attention_points) == len(PROFILE_TOKENS)
    assert profile.page_list_attention_points[0][0] == 30 * (7 * 16 + 2 * 17)
    assert small.engine.speculator.prices.attention_costs.position_s("page_list", 1) > 0
