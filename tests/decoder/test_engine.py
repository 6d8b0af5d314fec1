"""Engine behaviour on real weights: continuous batching, chunked prefill, preemption,
cancellation, bad input. Oracle: each request decoded alone (greedy)."""

import pytest
import torch

from dhisparse import LLM, InvalidRequestError, SamplingParams
from services.decoder.engine.request import RequestStatus
from tests.decoder.prompts import SHORT_PROMPTS, long_document


@pytest.fixture(scope="module")
def four_prompts(loaded_model):
    tok = loaded_model.tokenizer
    texts = [SHORT_PROMPTS[0], long_document(12), SHORT_PROMPTS[1], long_document(40)]
    ids = [tok.encode(t) for t in texts]
    assert len({len(i) for i in ids}) == 4
    return ids


@pytest.fixture(scope="module")
def alone_outputs(llm, four_prompts):
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    return [llm.generate([ids], params)[0].token_ids for ids in four_prompts]


def test_batch_of_four_equals_each_alone(loaded_model, four_prompts, alone_outputs):
    # a small step budget forces chunked prefill interleaved with other requests' decode steps
    batched = LLM(loaded=loaded_model, max_num_batched_tokens=48, kv_cache_tokens=4096, max_model_len=4096)
    outs = batched.generate(four_prompts, SamplingParams(max_tokens=24, ignore_eos=True))
    assert [o.token_ids for o in outs] == alone_outputs
    assert all(o.finish_reason == "length" for o in outs)
    assert batched.engine.check_integrity()
    assert batched.engine.allocator.num_free_slots == batched.engine.allocator.num_slots


def test_preemption_under_slot_pressure_loses_nothing(llm, loaded_model, four_prompts):
    # the default policy (always-full) admits a request only when its prompt fits, so pressure
    # comes from growth: two 217-token prompts (14 pages each) are admitted into 32 pages, then
    # 64 new tokens each need 36 pages: the scheduler must preempt and recompute
    prompt = four_prompts[1]
    params = SamplingParams(max_tokens=64, ignore_eos=True)
    alone = llm.generate([prompt], params)[0].token_ids
    tight = LLM(loaded=loaded_model, kv_cache_tokens=32 * 16, max_model_len=32 * 16, max_num_batched_tokens=512)
    outs = tight.generate([prompt, prompt], params)
    assert [o.token_ids for o in outs] == [alone, alone]
    assert sum(o.stats["num_preemptions"] for o in outs) > 0
    assert tight.engine.check_integrity()
    assert tight.engine.allocator.num_free_slots == tight.engine.allocator.num_slots


def test_cancel_frees_every_page(loaded_model, four_prompts):
    llm = LLM(loaded=loaded_model, kv_cache_tokens=4096, max_model_len=4096, max_num_batched_tokens=64)
    engine = llm.engine
    params = SamplingParams(max_tokens=50, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in four_prompts]
    for _ in range(6):
        engine.step()
    victim = engine.requests[ids[3]]
    assert victim.slots, "the victim should hold pages before cancellation"
    held_before = engine.allocator.num_used_slots
    victim_pages = len(victim.slots)
    assert engine.abort(ids[3])
    assert victim.status is RequestStatus.FINISHED and victim.finish_reason == "abort"
    assert not victim.slots
    assert engine.allocator.num_used_slots == held_before - victim_pages
    assert engine.check_integrity()
    assert not engine.abort(ids[3]), "a second abort is a no-op"
    engine.run_until_done()
    assert engine.check_integrity()
    assert engine.allocator.num_free_slots == engine.allocator.num_slots
    assert all(len(engine.requests[i].output_ids) == 50 for i in ids[:3])


def test_streaming_deltas_concatenate_to_text(llm):
    deltas = {}
    out = llm.generate(SHORT_PROMPTS[3], SamplingParams(max_tokens=20), on_event=lambda e: deltas.setdefault(e.request_id, []).append(e.text_delta))[0]
    assert "".join(deltas[out.request_id]) == out.text


def test_stop_string_cuts_text(llm):
    free = llm.generate(SHORT_PROMPTS[2], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    assert "\n" in free.text
    stop = free.text[free.text.index("\n") : free.text.index("\n") + 2]
    cut = llm.generate(SHORT_PROMPTS[2], SamplingParams(max_tokens=30, ignore_eos=True, stop=(stop,)))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert free.token_ids[: len(cut.token_ids)] == cut.token_ids


def test_stop_token_id(llm):
    free = llm.generate(SHORT_PROMPTS[0], SamplingParams(max_tokens=10, ignore_eos=True))[0]
    target = free.token_ids[4]
    out = llm.generate(SHORT_PROMPTS[0], SamplingParams(max_tokens=10, ignore_eos=True, stop_token_ids=(target,)))[0]
    first = free.token_ids.index(target)
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop"


def test_seeded_sampling_reproducible_and_batch_independent(llm, loaded_model):
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    a = llm.generate(SHORT_PROMPTS[0], params)[0].token_ids
    other = SamplingParams(max_tokens=16, temperature=1.0, seed=9, ignore_eos=True)
    b = llm.generate([SHORT_PROMPTS[0], SHORT_PROMPTS[1]], [params, other])[0].token_ids
    assert a == b
    c = llm.generate(SHORT_PROMPTS[0], SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=99, ignore_eos=True))[0].token_ids
    assert c != a


def _assert_untouched(llm):
    engine = llm.engine
    assert not engine.requests and not engine.has_unfinished()
    assert engine.allocator.num_free_slots == engine.allocator.num_slots
    assert engine.check_integrity()


@pytest.mark.parametrize(
    "prompt, kwargs, message",
    [
        ("", {}, "empty"),
        ([[]], {}, "empty"),
        ("hello", {"max_tokens": 0}, "max_tokens"),
        ("hello", {"temperature": -1.0}, "temperature"),
        ([49152], {}, "outside"),
    ],
)
def test_bad_requests_change_no_state(llm, prompt, kwargs, message):
    with pytest.raises(InvalidRequestError, match=message):
        llm.generate(prompt, SamplingParams(**kwargs))
    _assert_untouched(llm)


def test_prompt_longer_than_context_is_rejected(llm):
    too_long = [1] * llm.engine.max_model_len
    with pytest.raises(InvalidRequestError, match="context"):
        llm.generate([too_long], SamplingParams())
    _assert_untouched(llm)


def test_batch_with_one_bad_prompt_queues_nothing(llm):
    with pytest.raises(InvalidRequestError):
        llm.generate([SHORT_PROMPTS[0], [1] * llm.engine.max_model_len], SamplingParams())
    _assert_untouched(llm)


def test_generation_stops_at_model_context(loaded_model):
    llm = LLM(loaded=loaded_model, max_model_len=40, kv_cache_tokens=64)
    out = llm.generate([5] * 30, SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert len(out.token_ids) == 10 and out.finish_reason == "length"


def test_pool_smaller_than_one_sequence_is_a_config_error(loaded_model):
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        LLM(loaded=loaded_model, kv_cache_tokens=256, max_model_len=1024)


def test_context_past_training_needs_an_explicit_flag(loaded_model):
    trained = loaded_model.config.max_position_embeddings
    with pytest.raises(ValueError, match="allow_long_context"):
        LLM(loaded=loaded_model, max_model_len=trained * 2, kv_cache_tokens=trained * 2)
    long_llm = LLM(loaded=loaded_model, max_model_len=trained * 2, kv_cache_tokens=trained * 2, allow_long_context=True)
    assert long_llm.engine.max_model_len == trained * 2
    assert long_llm.engine.model.rope.cos.shape[0] == trained * 2
