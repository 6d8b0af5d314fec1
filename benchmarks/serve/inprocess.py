"""The in-process baseline: the same prompts through an ``Engine`` in this process, closed loop
at the same concurrency, no gateway, no gRPC (the denominator of the gateway-overhead ratio)."""

from __future__ import annotations

import time

from services.decoder.config import DecoderConfig
from services.decoder.engine.engine import Engine
from services.decoder.engine.sampling_params import SamplingParams


def encode_chat(engine: Engine, messages: list[dict]) -> list[int]:
    tokenizer = engine.tokenizer
    return tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)


def run_closed_loop(engine: Engine, prompts: list[list[int]], max_tokens: int, concurrency: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    pending = list(prompts)
    num_active = 0
    num_tokens = 0
    start = time.perf_counter()
    while pending or engine.has_unfinished():
        while pending and num_active < concurrency:
            engine.add_request(pending.pop(0), params)
            num_active += 1
        for event in engine.step():
            num_tokens += event.token_id is not None
            if event.finished:
                engine.pop_finished(event.request_id)
                num_active -= 1
    duration_s = time.perf_counter() - start
    return {"output_tokens": num_tokens, "duration_s": duration_s, "output_tokens_per_s": num_tokens / duration_s}


def in_process_baseline(prompts: list[list[dict]], max_tokens: int, concurrency: int,
                        config: DecoderConfig | None = None) -> dict:
    engine = Engine(config or DecoderConfig())
    ids = [encode_chat(engine, m) for m in prompts]
    run_closed_loop(engine, ids[:concurrency], 4, concurrency)  # warm-up (packs, allocator)
    return run_closed_loop(engine, ids, max_tokens, concurrency)
