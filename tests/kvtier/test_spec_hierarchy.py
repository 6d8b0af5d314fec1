"""Block drafting over the sparse hierarchy (real kvtier process, real weights): a hot pool far
smaller than the requests' KV, SPARSE requests fetching cold pages from the host tier, verify
blocks of 8 tokens: the greedy tokens equal plain decoding with the same sparse settings, and
the drafts' rejected rows leave nothing behind in digests, host pages or residency state."""

from dhisparse import LLM, SamplingParams
from tests.kvtier.test_decoder_host_tier import SMOLLM_LAYOUT
from tests.kvtier.test_residency_engine import BOUNDED, SPARSE, prompts  # noqa: F401 (fixture)
from tests.spec.dflash_fixtures import write_random_checkpoint
from tests.spec.test_dflash_engine import partly_right

PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)
SPEC_SPARSE = dict(SPARSE, recent_pages=2)  # 7 draft tokens + the anchor span at most 2 pages


def test_block_drafting_over_a_bounded_hot_pool_is_lossless(loaded_model, kvtier_process, prompts, tmp_path):
    prompts = prompts[:4]
    unbounded = LLM(loaded=loaded_model, kv_cache_tokens=16384, max_model_len=1024, **SPEC_SPARSE)
    plain = [o.token_ids for o in unbounded.generate(prompts, PARAMS)]
    kvtier = kvtier_process(**SMOLLM_LAYOUT, host_pool_pages=640)
    checkpoint = write_random_checkpoint(tmp_path / "dflash", kind="dflash", seed=11)
    llm = LLM(loaded=loaded_model, kvtier_address=kvtier.address, decoder_id="dec-spec", residency="always-sparse",
              spec="dflash", spec_tokens=7, draft_model=str(checkpoint), **SPEC_SPARSE, **BOUNDED)
    engine = llm.engine
    ids = [engine.add_request(p, PARAMS) for p in prompts]
    partly_right(engine, dict(zip(ids, plain)), {i: len(p) for i, p in zip(ids, prompts)})
    max_running = 0
    while engine.has_unfinished():
        engine.step()
        max_running = max(max_running, len(engine.scheduler.running))
        assert engine.check_integrity()
    outputs = [engine.pop_finished(i) for i in ids]
    assert [o.output_ids for o in outputs] == plain
    stats = [o.stats.as_dict(len(o.output_ids)) for o in outputs]
    assert max_running >= 2  # SPARSE requests side by side in 96 slots (one alone needs ~50 pages FULL)
    assert sum(s["num_buffer_misses"] for s in stats) > 0  # cold pages came from the host tier
    assert sum(s["accepted_tokens"] for s in stats) > 0
    assert sum(s["drafted_tokens"] - s["accepted_tokens"] for s in stats) > 0
    assert engine.allocator.num_free_slots == engine.allocator.num_slots
    engine.step()  # an idle step flushes the last frees to kvtier
    kv_stats = engine.host_tier.client.stats(check_integrity=True)
    engine.close()
    assert kv_stats["integrity_ok"] and kv_stats["num_used_pages"] == 0, kv_stats
