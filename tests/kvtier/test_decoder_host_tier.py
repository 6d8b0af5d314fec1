"""The decoder engine with a real kvtier process: eager write-back of sealed pages, one batched
kvtier call per step, nothing left behind."""

import pytest
import torch

from dhisparse import LLM, InvalidRequestError, SamplingParams
from tests.decoder.prompts import SHORT_PROMPTS, long_document

SMOLLM_LAYOUT = {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64, "page_size": 16, "dtype": "float32"}


def test_sealed_pages_reach_host_pages_byte_exact(loaded_model, kvtier_process):
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=256)
    llm = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-a", spec="ngram")
    engine = llm.engine
    tok = loaded_model.tokenizer
    prompts = [tok.encode(long_document(30)), tok.encode(SHORT_PROMPTS[1]), tok.encode(long_document(10))]
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    steps = 0
    while min(len(engine.requests[i].output_ids) for i in ids) < 40:
        engine.step()
        steps += 1
    tier = engine.host_tier
    assert tier.num_step_calls <= steps, "at most one kvtier call per engine step"
    page_size = engine.config.page_size
    checked = 0
    for rid in ids:
        request = engine.requests[rid]
        num_sealed = request.num_computed_tokens // page_size
        assert tier.num_sealed[rid] == num_sealed
        host_ids = tier.host_pages[rid][:num_sealed]
        for layer in range(engine.model_config.num_layers):
            host_k, host_v = tier.client.host_pages(layer)
            slots = torch.tensor(request.slots[:num_sealed])
            assert torch.equal(host_k[torch.tensor(host_ids)], engine.pool.k[layer][slots])
            assert torch.equal(host_v[torch.tensor(host_ids)], engine.pool.v[layer][slots])
        checked += num_sealed
    assert checked > 50
    for rid in ids:
        engine.abort(rid)
    engine.step()  # an idle step flushes the frees
    stats = tier.client.stats(check_integrity=True)
    assert stats["integrity_ok"], stats
    assert stats["num_used_pages"] == 0 and stats["num_requests"] == 0, stats
    assert engine.check_integrity()


def test_outputs_identical_with_and_without_the_host_tier(loaded_model, kvtier_process, llm):
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=128)
    tiered = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-b")
    prompts = [SHORT_PROMPTS[0], SHORT_PROMPTS[2]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    assert [o.token_ids for o in tiered.generate(prompts, params)] == [o.token_ids for o in llm.generate(prompts, params)]
    stats = tiered.engine.host_tier.client.stats(check_integrity=True)
    assert stats["integrity_ok"] and stats["num_used_pages"] == 0 and stats["num_requests"] == 0, stats


def test_preempted_requests_come_back_from_host_pages_not_recompute(loaded_model, kvtier_process):
    """Under slot pressure the scheduler preempts; with the host tier, written-back pages are
    copied back (a prefill counter proves they are not recomputed) and nothing changes."""
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=512)
    tok = loaded_model.tokenizer
    prompts = [tok.encode(long_document(n)) for n in (40, 12, 35, 5)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    tight = dict(kv_cache_tokens=60 * 16, max_model_len=60 * 16, max_num_batched_tokens=256)
    recompute = LLM(loaded=loaded_model, **tight).generate(prompts, params)
    tiered_llm = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-c", **tight)
    swapped = tiered_llm.generate(prompts, params)
    assert [o.token_ids for o in swapped] == [o.token_ids for o in recompute]
    assert sum(o.stats["num_preemptions"] for o in swapped) > 0
    assert sum(o.stats["num_swapped_in_pages"] for o in swapped) > 0
    prefill_swapped = sum(o.stats["num_prefill_tokens"] for o in swapped)
    prefill_recompute = sum(o.stats["num_prefill_tokens"] for o in recompute)
    assert prefill_swapped < prefill_recompute
    assert tiered_llm.engine.check_integrity()
    stats = tiered_llm.engine.host_tier.client.stats(check_integrity=True)
    assert stats["integrity_ok"] and stats["num_used_pages"] == 0, stats


def test_full_host_pool_is_backpressure_not_an_error(loaded_model, kvtier_process, llm):
    """kvtier's host pool holds 40 pages; three ~20-page requests cannot all hold host pages at
    once: the engine queues the newest until pages come back, and every output is unchanged."""
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=40)
    tok = loaded_model.tokenizer
    prompts = [tok.encode(long_document(n)) for n in (16, 18, 14)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    tiered = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-bp")
    outs = tiered.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in llm.generate(prompts, params)]
    assert sum(o.stats["num_host_waits"] for o in outs) > 0
    with pytest.raises(InvalidRequestError, match="host pool has 40"):
        tiered.engine.add_request(tok.encode(long_document(40)), params)
    assert tiered.engine.check_integrity()
    stats = tiered.engine.host_tier.client.stats(check_integrity=True)
    tiered.engine.close()
    assert stats["integrity_ok"] and stats["num_used_pages"] == 0, stats
