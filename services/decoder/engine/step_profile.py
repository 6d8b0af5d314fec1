"""Start-up profile for the adaptive verify budget: step seconds vs batch tokens, and the
seconds one host page costs to fetch into the hot pool (per layer), measured on this engine."""

from __future__ import annotations

import statistics
import time

from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.engine.scheduler import ScheduledRequest
from services.decoder.spec.verify_budget import StepCostTable

PROFILE_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def profile_engine(engine, context_tokens: int = 256, repeats: int = 3) -> tuple[StepCostTable, float]:
    """Prefills one synthetic request of ``context_tokens`` tokens, times a verify step of each
    size in ``PROFILE_TOKENS`` on it (median of ``repeats``) and, with a host tier, the fetch of
    its written-back pages; then aborts it. Returns (step cost table, seconds per page-layer
    fetched; 0 without a host tier). Run on an idle engine (at start-up)."""
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
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                engine.runner.execute([sched])
                times.append(time.perf_counter() - start)
            seconds.append(statistics.median(times))
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
    return StepCostTable(PROFILE_TOKENS[: len(seconds)], tuple(seconds)), fetch_s
