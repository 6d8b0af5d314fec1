"""EngineLoop: the engine on its own thread behind a submit/cancel queue (real model, no server)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dhisparse import SamplingParams
from services.decoder.config import DecoderConfig
from services.decoder.engine.engine import Engine
from services.decoder.engine.sampling_params import InvalidRequestError
from services.decoder.service.engine_loop import DrainingError, EngineLoop, QueueFullError
from tests.serving.conftest import one_thread


@pytest.fixture
def loop(reference_llm):
    with one_thread():
        engine = Engine(DecoderConfig(kv_cache_tokens=4096, max_model_len=1024, max_num_seqs=2), loaded=reference_llm.engine.loaded)
        loop = EngineLoop(engine, max_num_waiting=2).start()
        yield loop
        loop.stop(timeout=10)
        assert not loop.is_alive()
        engine.check_integrity()


def wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_streams_what_the_engine_generates(loop, reference):
    ids = loop.engine.tokenizer.encode("The capital of France is")
    expected = reference(ids, 8)
    with ThreadPoolExecutor(3) as pool:  # several submitting threads at once
        handles = list(pool.map(lambda i: loop.submit(ids, SamplingParams(max_tokens=8), f"r{i}"), range(3)))
    for handle in handles:
        outputs = list(handle)
        assert [t for o in outputs for t in o.token_ids] == expected.token_ids
        assert "".join(o.text_delta for o in outputs) == expected.text
        last = outputs[-1]
        assert last.finished and last.finish_reason == "length"
        assert (last.num_prompt_tokens, last.num_output_tokens) == (len(ids), 8)
        assert last.timing["prefill_s"] >= 0 and "num_verify_steps" in last.timing
        # 6 prompt + 8 output tokens: one page, FULL, nothing moved (no host tier here)
        assert outputs[0].residency == {"mode": "full", "num_hot_pages": 1, "num_hot_hits": 0, "num_hot_misses": 0,
                                        "num_bytes_fetched": 0, "num_bytes_written": 0}
        assert last.residency["num_hot_pages"] == 0  # released when it finished
    wait_until(lambda: loop.num_in_flight == 0)
    stats = loop.stats()
    assert stats.num_requests_finished == 3 and stats.num_generated_tokens == 24
    assert stats.num_free_slots == stats.num_total_slots


def test_refusals_raise_in_the_caller(loop):
    with pytest.raises(InvalidRequestError):
        loop.submit([], SamplingParams(), "empty")
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    loop.submit([1, 2, 3], long, "dup")
    with pytest.raises(InvalidRequestError):
        loop.submit([1, 2, 3], long, "dup")
    loop.cancel("dup")


def test_cancel_frees_the_slots(loop):
    handle = loop.submit([1, 2, 3, 4], SamplingParams(max_tokens=500, ignore_eos=True), "long")
    first = handle.get(timeout=30)
    assert not first.finished and loop.is_active("long")
    loop.cancel("long")
    outputs = list(handle)
    assert outputs[-1].finish_reason == "abort"
    wait_until(lambda: loop.stats().num_free_slots == loop.stats().num_total_slots)
    assert not loop.is_active("long")
    loop.cancel("long")  # unknown or finished: a no-op


def test_queue_limit_and_drain(loop):
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    long_prompt = list(range(1, 200))
    handles = []
    # 2 seats (max_num_seqs) + 2 waiting places (max_num_waiting): exactly the 5th is refused, however
    # many of the first 4 a step has moved to running by then (none finishes in the meantime)
    with pytest.raises(QueueFullError):
        for i in range(8):
            handles.append(loop.submit(long_prompt, params, f"w{i}"))
    assert len(handles) == 4
    loop.drain()
    with pytest.raises(DrainingError):
        loop.submit([1], SamplingParams(max_tokens=1), "late")
    assert loop.stop(timeout=0) is False  # nothing finished in time: the rest is aborted
    for handle in handles:
        assert list(handle)[-1].finished


def test_stop_hands_back_requests_with_no_output_and_aborts_the_rest_without_kvtier(loop):
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    running = [loop.submit([1, 2, 3, 4], params, f"run{i}") for i in range(2)]
    for handle in running:
        assert handle.get(timeout=30).token_ids  # generating
    waiting = [loop.submit([5, 6, 7], params, f"wait{i}") for i in range(2)]  # max_num_seqs=2: they wait
    assert loop.stop(timeout=0) is False
    for handle in running:  # output delivered and no kvtier to leave it in: aborted
        assert list(handle)[-1].finish_reason == "abort"
    for handle in waiting:  # nothing delivered: the client may start it afresh on another decoder
        outputs = list(handle)
        assert [o.finish_reason for o in outputs] == ["handoff"] and outputs[0].num_output_tokens == 0
    assert loop.stats().num_handed_off_requests == 2
