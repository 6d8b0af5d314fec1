"""The bounded hot tier end to end (real kvtier process, real weights): a hot pool far smaller
than the requests' KV gives the same greedy tokens as an unbounded pool with the same sparse
settings, under every residency policy, and leaves nothing behind."""

import pytest

from dhisparse import LLM, SamplingParams
from services.decoder.engine.request import Residency
from tests.decoder.prompts import long_document
from tests.kvtier.test_decoder_host_tier import SMOLLM_LAYOUT

# 4-page top-k, 1 sink page, 2 recent pages: contexts of 30-55 pages select a small part of them
SPARSE = dict(attention="sparse", top_k_tokens=64, sink_pages=1, recent_pages=2)
BOUNDED = dict(kv_cache_tokens=96 * 16, max_model_len=1024, max_num_batched_tokens=128)
PARAMS = SamplingParams(max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts(loaded_model):
    ids = [loaded_model.tokenizer.encode(long_document(n)) for n in (40, 48, 36, 50, 44, 38, 46, 42)]
    assert all(600 < len(i) < 1000 for i in ids), [len(i) for i in ids]  # 8 x ~800 tokens vs 1,536 hot
    return ids


@pytest.fixture(scope="module")
def unbounded_outputs(loaded_model, prompts):
    llm = LLM(loaded=loaded_model, kv_cache_tokens=16384, max_model_len=1024, **SPARSE)
    return [o.token_ids for o in llm.generate(prompts, PARAMS)]


@pytest.mark.parametrize("policy", ["always-sparse", "adaptive", "always-full"])
def test_bounded_hot_pool_gives_the_unbounded_outputs(loaded_model, kvtier_process, prompts, unbounded_outputs,
                                                      policy):
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=640)
    llm = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id=f"dec-{policy}",
              residency=policy, **SPARSE, **BOUNDED)
    engine = llm.engine
    modes_seen: set[Residency] = set()
    max_running = 0
    params = [PARAMS] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    while engine.has_unfinished():
        engine.step()
        running = engine.scheduler.running
        modes_seen |= {r.mode for r in running}
        max_running = max(max_running, len(running))
        assert engine.check_integrity()
    outputs = [engine.pop_finished(i) for i in ids]
    assert [o.output_ids for o in outputs] == unbounded_outputs
    stats = [o.stats.as_dict(len(o.output_ids)) for o in outputs]
    if policy == "always-full":
        assert modes_seen == {Residency.FULL}
        # its admission wall: 96 slots hold one ~50-page context (two only while one finishes)
        # (the SPARSE policies run >= 4 at once, below)
        assert max_running <= 2
    else:
        assert Residency.SPARSE in modes_seen
        assert max_running >= 4  # SPARSE requests need ~10 slots each
        assert sum(s["num_buffer_misses"] for s in stats) > 0  # cold pages were fetched from the host
        assert sum(s["num_buffer_hits"] for s in stats) > 0  # and the LRU buffers served repeats
    if policy == "adaptive":
        assert Residency.FULL in modes_seen and sum(s["num_demotions"] for s in stats) > 0
    assert engine.allocator.num_free_slots == engine.allocator.num_slots
    engine.step()  # an idle step flushes the last frees to kvtier
    kv_stats = engine.host_tier.client.stats(check_integrity=True)
    engine.close()
    assert kv_stats["integrity_ok"] and kv_stats["num_used_pages"] == 0, kv_stats
