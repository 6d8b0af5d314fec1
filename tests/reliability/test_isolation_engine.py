"""Isolation inside one decoder: a request never reads a page it does not own (real weights, a real
kvtier process, the bounded hot tier with SPARSE residency, so pages move between the hot pool,
LRU buffers and kvtier's host pool).

The test poisons everything a request must not read: before each engine step, every hot slot no
running request owns, and at the start the whole host pool, are filled with large garbage. The
requests run in two waves, so the second wave reuses the slots and host pages that the first
wave's requests held. Every output must equal the same prompts' run on a clean, unbounded engine.
A read of a foreign or stale page, poisoned or another live request's, would change the tokens
(checked by hand: poisoning one slot a running request owns does change them)."""

from __future__ import annotations

import torch

from dhisparse import LLM, SamplingParams
from tests.decoder.prompts import long_document
from tests.kvtier.test_decoder_host_tier import SMOLLM_LAYOUT

SPARSE = {"attention": "sparse", "top_k_tokens": 64, "sink_pages": 1, "recent_pages": 2}
BOUNDED = {"kv_cache_tokens": 40 * 16, "max_model_len": 1024, "max_num_batched_tokens": 128}
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
POISON = 3.0e4


def garbage(shape, seed: int) -> torch.Tensor:
    """Large values of random sign: a key of it outscores every real key for about half the
    queries, so a read of it shows in the output (a constant could be ignored by the softmax)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * POISON


def poison_free_slots(engine, step: int) -> int:
    free = engine.allocator.free_slot_order()
    if free:
        storage = engine.pool.storage  # [layers, K/V, slots, page_size, heads, head_dim]
        storage[:, :, free] = garbage(storage[:, :, free].shape, step)
    return len(free)


def test_no_request_reads_a_page_it_does_not_own(loaded_model, kvtier_process):
    prompts = [loaded_model.tokenizer.encode(long_document(n)) for n in (16, 13, 18, 14)]
    clean = LLM(loaded=loaded_model, kv_cache_tokens=16384, max_model_len=1024, **SPARSE)
    reference = [o.token_ids for o in clean.generate(prompts, PARAMS)]

    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=120, instance="iso-engine")
    engine = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-iso", residency="always-sparse",
                 **SPARSE, **BOUNDED).engine
    host = engine.host_tier.client.host_pool.pool
    host.copy_(garbage(host.shape, seed=-1 & 0xFFFF))  # kvtier's whole host pool
    outputs, poisoned_steps, fetched = {}, 0, 0
    for wave in (prompts[:2], prompts[2:]):
        ids = [engine.add_request(p, PARAMS) for p in wave]
        while engine.has_unfinished():
            poisoned_steps += poison_free_slots(engine, poisoned_steps) > 0
            engine.step()
        for i in ids:
            out = engine.pop_finished(i)
            outputs[i] = out.output_ids
            fetched += out.stats.as_dict(len(out.output_ids))["num_buffer_misses"]
    assert list(outputs.values()) == reference
    assert poisoned_steps > 8 and fetched > 0  # the poison was there, and pages did come from the host pool
    engine.step()
    stats = engine.host_tier.client.stats(check_integrity=True)
    engine.close()
    assert stats["integrity_ok"] and stats["num_used_pages"] == 0, stats
