"""The in-process baseline: the same prompts through the same engine, configured and threaded the
way the decoder service runs it, closed loop at the same concurrency, no gateway, no gRPC (the
denominator of the gateway-overhead ratio).

"The way the decoder runs it" matters on CPU:

- same ``DecoderConfig`` (threads, and the host tier: sealed pages are written back to the same
  kvtier the stack's decoder uses, when the stack has one);
- the engine steps on its own thread behind ``EngineLoop``, as in the decoder, not on the main
  thread. With libgomp (torch's OpenMP) a process whose only OpenMP master is the main thread
  spins its workers between parallel regions (~300k iterations), which is the fastest mode on an
  otherwise idle machine and collapses as soon as anything else wants a core; the decoder process
  has two masters (the main thread loaded the model, the engine thread steps it), more OpenMP
  threads than cores, so libgomp throttles spinning. A main-thread baseline therefore measures a
  different OpenMP regime than the one being served, not gateway overhead.

Prompts are tokenized before the clock starts (the stack's decoder tokenizes inside its timing:
that cost is part of serving).
"""

from __future__ import annotations

import threading
import time
import uuid

from benchmarks.progress import progress
from services.decoder.config import DecoderConfig
from services.decoder.engine.engine import Engine
from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.service.engine_loop import EngineLoop


def encode_chat(engine: Engine, messages: list[dict]) -> list[int]:
    tokenizer = engine.tokenizer
    return tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)


def run_closed_loop(loop: EngineLoop, prompts: list[list[int]], max_tokens: int, concurrency: int,
                    desc: str | None = None) -> dict:
    """``concurrency`` client threads, each submitting the next prompt once its previous one
    finished (like the HTTP load generator); returns output tokens, wall time and tokens/s. With
    ``desc``, a progress bar (stderr) counts the completed requests."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    pending = list(prompts)
    lock = threading.Lock()
    counts: list[int] = []
    bar = progress(desc=desc, total=len(prompts), unit="req") if desc else None

    def client() -> None:
        while True:
            with lock:
                if not pending:
                    return
                prompt = pending.pop(0)
            handle = loop.submit(prompt, params, f"inproc-{uuid.uuid4().hex}")
            num_tokens = sum(len(output.token_ids) for output in handle)
            with lock:
                counts.append(num_tokens)
                if bar is not None:
                    bar.update()

    start = time.perf_counter()
    threads = [threading.Thread(target=client, name=f"client-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    duration_s = time.perf_counter() - start
    if bar is not None:
        bar.close()
    num_tokens = sum(counts)
    return {"output_tokens": num_tokens, "duration_s": duration_s, "output_tokens_per_s": num_tokens / duration_s}


def in_process_baseline(prompts: list[list[dict]], max_tokens: int, concurrency: int,
                        config: DecoderConfig | None = None) -> dict:
    config = config or DecoderConfig()
    engine = Engine(config)
    loop = EngineLoop(engine).start()
    try:
        ids = [encode_chat(engine, m) for m in prompts]
        run_closed_loop(loop, ids[:concurrency], 4, concurrency)  # warm-up (packs, allocator)
        result = run_closed_loop(loop, ids, max_tokens, concurrency, desc="serve in-process")
    finally:
        loop.stop(timeout=30)
        engine.close()
    result["config"] = {"num_threads": config.num_threads, "host_tier": config.kvtier_address is not None,
                        "engine_thread": True}
    return result
