"""Start-up profile for the adaptive verify budget, measured on this engine: step seconds vs batch
tokens, the drafter's seconds vs the requests it drafts for in one call, and the seconds one host
page costs to fetch into the hot pool (per layer)."""

from __future__ import annotations

import statistics
import time

from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.engine.scheduler import ScheduledRequest
from services.decoder.spec.drafter import DraftRequest
from services.decoder.spec.verify_budget import BudgetProfile, CostTable

PROFILE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
PROFILE_DRAFT_REQUESTS = (1, 4, 16)


def profile_engine(engine, context_tokens: int = 256, repeats: int = 3) -> BudgetProfile:
    """Prefills one synthetic request of ``context_tokens`` tokens, times a verify step of each
    size in ``PROFILE_TOKENS`` on it (median of ``repeats``), a drafter call for it repeated
    ``PROFILE_DRAFT_REQUESTS`` times and, with a host tier, the fetch of its written-back pages;
    then aborts it. Run on an idle engine with a drafter attached (at start-up)."""
    vocab = engine.model_config.vocab_size
    prompt = [(7919 * i) % vocab for i in range(1, context_tokens + 1)]
    params = SamplingParams(max_tokens=2 * max(PROFILE_TOKENS), ignore_eos=True)
    rid = engine.add_request(prompt, params, request_id="__profile__")
    request = engine.requests[rid]
    try:
        while request.num_computed_tokens < len(prompt):
            engine.step()
        seconds = []
        for num_tokens in PROFILE_TOKENS:
            if not engine.controller.grow(request, request.num_computed_tokens + num_tokens):
                break
            sched = ScheduledRequest(request, 1, [prompt[0]] * (num_tokens - 1))
            seconds.append(_median_s(lambda sched=sched: engine.runner.execute([sched]), repeats))
        draft_seconds = [_median_s(lambda n=n: engine.speculator.drafter.propose_batch(
            [DraftRequest(rid, prompt, engine.speculator.spec_tokens)] * n), repeats) for n in PROFILE_DRAFT_REQUESTS]
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
    return BudgetProfile(CostTable(PROFILE_TOKENS[: len(seconds)], tuple(seconds)),
                         CostTable(PROFILE_DRAFT_REQUESTS, tuple(draft_seconds)), fetch_s)


def _median_s(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
