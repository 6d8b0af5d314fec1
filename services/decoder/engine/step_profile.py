"""Start-up profile for the adaptive verify budget, measured on this engine: step seconds vs batch
tokens (attention taken out), each attention path's seconds vs key rows, the drafter's seconds vs
the requests it drafts for in one call, and the seconds one host page costs to fetch into the hot
pool (per layer)."""

from __future__ import annotations

import statistics
import time

from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.engine.scheduler import ScheduledRequest
from services.decoder.model.attention import AttentionWork
from services.decoder.spec.drafter import DraftRequest
from services.decoder.spec.verify_budget import BudgetProfile, CostTable

PROFILE_TOKENS = (1, 2, 3, 4, 8, 16, 32, 64)  # 8 .. 64: the MKL packs' buckets, should the GEMM plan pad to them
PROFILE_DRAFT_REQUESTS = (1, 4, 16)
# step sizes at which a sparse engine's page-list attention is timed (the same request, every
# token forced through its own selection): its line's fixed part and slope
PAGE_LIST_PROFILE_TOKENS = (1, 4, 16, 64)
# drafter calls that build every weight copy its kernels use (model/linear.py: MKL packs of 8 ..
# 64 rows, oneDNN's) for its block (8 rows per request) and head (up to 7 per request) before
# anything is timed, while serving never: a draft call must not be priced at a pack build
PACK_WARMUP_REQUESTS = (1, 2, 4, 8, 16)
# positions per request of the call that prices one more asked position: the budget mostly
# weighs the first extra positions, and right after a target step they cost the most (the Markov
# head's codebook and the LM head's rows are read cold). DSpark at one request on the 2-core CPU:
# 1 -> 2 -> 3 positions took +0.15-0.35 and +0.45 ms, where a 7-position call priced each at
# 0.08-0.18 ms, and the budget took headroom and second tokens it could not pay for (code_edit, c=1)
PROFILE_DRAFT_POSITIONS = 3


def profile_engine(engine, context_tokens: int = 256, repeats: int = 5) -> BudgetProfile:
    """Prefills one synthetic request of ``context_tokens`` tokens, times a verify step of each
    size in ``PROFILE_TOKENS`` on it (median of ``repeats``; its attention apart), on a sparse
    engine the page-list path's attention at ``PAGE_LIST_PROFILE_TOKENS``, a drafter call for it repeated
    ``PROFILE_DRAFT_REQUESTS`` times asking one position each (one untimed call of each size
    first, then each timed call right after a target step), each again asking
    ``PROFILE_DRAFT_POSITIONS`` positions per request (what one more asked position costs at that many requests: a block
    drafter's heads run per position, and their padded GEMM rows make it no constant) and, with a host tier, the fetch of its written-back pages; then
    aborts it. Run on an idle engine with a drafter attached (at start-up)."""
    vocab = engine.model_config.vocab_size
    prompt = [(7919 * i) % vocab for i in range(1, context_tokens + 1)]
    params = SamplingParams(max_tokens=2 * max(PROFILE_TOKENS), ignore_eos=True)
    rid = engine.add_request(prompt, params, request_id="__profile__")
    request = engine.requests[rid]
    try:
        while request.num_computed_tokens < len(prompt):
            engine.step()
        seconds = []
        # (key rows[, context rows], attention seconds) per step size and path
        dense_points: list[tuple[int, int, float]] = []
        page_list_points: list[tuple[int, float]] = []
        for num_tokens in PROFILE_TOKENS:
            if not engine.controller.grow(request, request.num_computed_tokens + num_tokens):
                break
            sched = ScheduledRequest(request, 1, [prompt[0]] * (num_tokens - 1))
            step_s, work = _median_step(engine, sched, repeats)
            seconds.append(step_s)
            if work.dense_rows:
                dense_points.append((work.dense_rows, work.dense_context_rows, work.dense_s))
            if work.page_list_rows:  # a selection budget smaller than the profile's context
                page_list_points.append((work.page_list_rows, work.page_list_s - work.fetch_s))
        if engine.runner.sparse is not None and not page_list_points:  # the same steps through per-token selections
            engine.runner.force_selection = True
            try:
                for num_tokens in (n for n in PAGE_LIST_PROFILE_TOKENS if seconds and n <= PROFILE_TOKENS[len(seconds) - 1]):
                    sched = ScheduledRequest(request, 1, [prompt[0]] * (num_tokens - 1))
                    work = _median_step(engine, sched, repeats)[1]
                    page_list_points.append((work.page_list_rows, work.page_list_s - work.fetch_s))
            finally:
                engine.runner.force_selection = False
        drafter = engine.speculator.drafter
        drafter.prepare([rid])
        asks = {n: [DraftRequest(rid, prompt, engine.speculator.spec_tokens)] * n for n in PACK_WARMUP_REQUESTS}
        for n in PACK_WARMUP_REQUESTS:  # untimed: the first call at a row count builds its GEMM packs
            drafter.propose_batch(asks[n])
        # each timed call right after a target step, as while serving: the step reads every target
        # weight and evicts the drafter's from the caches (back-to-back calls read ~30% faster)
        decode_step = ScheduledRequest(request, 1, [])
        spec_tokens = engine.speculator.spec_tokens

        def draft_s(num_requests: int, num_positions: int) -> float:
            ask = [DraftRequest(rid, prompt, num_positions)] * num_requests
            return _median_s(lambda: drafter.propose_batch(ask), repeats,
                             before=lambda: engine.runner.execute([decode_step]))

        draft_seconds = [draft_s(n, 1) for n in PROFILE_DRAFT_REQUESTS]  # one position each
        # each position beyond the first, per request count: from a call asking PROFILE_DRAFT_POSITIONS each
        asked = min(spec_tokens, PROFILE_DRAFT_POSITIONS)
        s_per_position = [max(draft_s(n, asked) - one, 0.0) / (n * (asked - 1)) if asked > 1 else 0.0
                          for n, one in zip(PROFILE_DRAFT_REQUESTS, draft_seconds)]
        fetch_s = 0.0
        tier = engine.host_tier
        if tier is not None and request.num_host_pages:
            pages = list(range(request.num_host_pages))
            start = time.perf_counter()
            tier.fetch(rid, pages, [request.slots[p] for p in pages])
            fetch_s = (time.perf_counter() - start) / (len(pages) * engine.model_config.num_layers)
    finally:
        engine.abort(rid)
        engine.requests.pop(rid, None)
        if engine.host_tier is not None:
            engine.host_tier.flush()
    counts = PROFILE_TOKENS[: len(seconds)]
    step_costs = CostTable(counts, tuple(_never_less_for_more(seconds)), step_pads(engine.model.lm_head, counts))
    return BudgetProfile(step_costs, CostTable(PROFILE_DRAFT_REQUESTS, tuple(draft_seconds)), fetch_s,
                         CostTable(PROFILE_DRAFT_REQUESTS, tuple(s_per_position)), tuple(dense_points),
                         tuple(page_list_points))


def step_pads(linear, counts: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """``(count, padded count)`` for the step sizes up to ``counts[-1]`` whose GEMMs run padded
    (every projection follows the model's one plan, so the LM head speaks for all) and whose
    padded count was profiled."""
    pairs = ((n, linear.padded_rows(n)) for n in range(1, counts[-1] + 1))
    return tuple((n, to) for n, to in pairs if to != n and to in counts)


def _median_step(engine, sched: ScheduledRequest, repeats: int) -> tuple[float, AttentionWork]:
    """The median over ``repeats`` target passes over ``sched`` of its seconds without its decode /
    verify attention (priced apart: ``spec/attention_costs.py``), and the attention of the pass
    whose attention took the median time."""
    times, works = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        work = engine.runner.execute([sched]).attention
        times.append(time.perf_counter() - start - work.seconds)
        works.append(work)
    works.sort(key=lambda w: w.seconds)
    return statistics.median(times), works[len(works) // 2]


def _never_less_for_more(seconds: list[float]) -> list[float]:
    """A step of more tokens does the same work and more, so a smaller step's time is at most
    that of any larger one: each time becomes the minimum of it and every later one. One
    disturbed measurement (a transient load, a page fault) then cannot price a small step above
    a large one, which would make drafts look free: the budget would verify up to the larger
    size on every step, and never measure the small step again to correct it."""
    out = list(seconds)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def _median_s(call, repeats: int, before=None) -> float:
    """Median seconds of ``call`` over ``repeats``; ``before`` (untimed) runs ahead of each."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
