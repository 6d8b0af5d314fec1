"""Speculative decoding inside the engine on real weights: lossless against plain decoding."""

import pytest
import torch

from dhisparse import LLM, SamplingParams

SPARSE = dict(attention="sparse", top_k_tokens=64, sink_pages=1, recent_pages=2)


@pytest.mark.parametrize("attention", [{}, SPARSE], ids=["dense", "sparse"])
def test_greedy_ngram_speculation_is_lossless(loaded_model, prompts, attention):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    plain = LLM(loaded=loaded_model, **attention).generate(prompts, params)
    spec_llm = LLM(loaded=loaded_model, spec="ngram", spec_tokens=6, **attention)
    spec = spec_llm.generate(prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert [o.text for o in spec] == [o.text for o in plain]
    stats = [o.stats for o in spec]
    assert sum(s["accepted_tokens"] for s in stats) > 0, "the copy-heavy prompt must accept drafts"
    assert sum(s["drafted_tokens"] - s["accepted_tokens"] for s in stats) > 0, "and some must be rejected"
    assert stats[0]["mean_acceptance_length"] > 1.5
    assert spec_llm.engine.check_integrity()
    assert spec_llm.engine.allocator.num_free_slots == spec_llm.engine.allocator.num_slots


def _run_to(engine, request_id, num_output_tokens):
    while len(engine.requests[request_id].output_ids) < num_output_tokens:
        engine.step()


def test_rejected_rows_never_reach_digests(loaded_model, prompts):
    """Same committed tokens -> same digests of every sealed page, with and without speculation
    (a rejected draft row leaking into a digest would change min/max by O(1), not O(1e-6))."""
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    spec = LLM(loaded=loaded_model, spec="ngram", spec_tokens=7, **SPARSE).engine
    plain = LLM(loaded=loaded_model, **SPARSE).engine
    sid = spec.add_request(prompts[0], params)
    _run_to(spec, sid, 60)
    target = len(spec.requests[sid].output_ids)
    pid = plain.add_request(prompts[0], params)
    _run_to(plain, pid, target)
    s_req, p_req = spec.requests[sid], plain.requests[pid]
    assert s_req.output_ids == p_req.output_ids
    assert s_req.stats.drafted_tokens > s_req.stats.accepted_tokens > 0
    num_sealed = min(s_req.num_computed_tokens, p_req.num_computed_tokens) // spec.config.page_size
    s_rows = torch.tensor(s_req.digest_rows[:num_sealed])
    p_rows = torch.tensor(p_req.digest_rows[:num_sealed])
    for layer in range(spec.model_config.num_layers):
        for name, table in spec.runner.digests.tables.items():
            got = table[layer][s_rows]
            want = plain.runner.digests.tables[name][layer][p_rows]
            # keys of a token computed inside a verify block vs alone differ by GEMM rounding only
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    assert spec.check_integrity()


def test_sampled_speculation_runs_and_is_reproducible(loaded_model, prompts):
    params = SamplingParams(max_tokens=30, temperature=0.8, seed=3, ignore_eos=True)
    a = LLM(loaded=loaded_model, spec="ngram").generate(prompts[:2], params)
    b = LLM(loaded=loaded_model, spec="ngram").generate(prompts[:2], params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(len(o.token_ids) == 30 for o in a)


def test_spec_settings_are_validated(loaded_model):
    with pytest.raises(ValueError, match="recent_pages"):
        LLM(loaded=loaded_model, spec="ngram", spec_tokens=20, attention="sparse", recent_pages=2)
    with pytest.raises(ValueError, match="spec"):
        LLM(loaded=loaded_model, spec="eagle")


def test_equal_length_verify_blocks_share_one_attention_group(loaded_model, prompts):
    """Dense verify blocks of the same length are attended in one padded causal group (one
    pair of batched matmuls per layer instead of one per request), with output unchanged."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = [o.token_ids for o in LLM(loaded=loaded_model).generate(prompts[1:], params)]
    llm = LLM(loaded=loaded_model, spec="dspark", spec_tokens=7)  # a fixed 7-token draft: 8-token blocks
    seen = []
    forward = llm.engine.model.forward

    def spy(input_ids, meta, *args, **kwargs):
        seen.append([(g.num_reqs, g.num_query_tokens) for g in meta.groups])
        return forward(input_ids, meta, *args, **kwargs)

    llm.engine.model.forward = spy
    assert [o.token_ids for o in llm.generate(prompts[1:], params)] == plain
    assert [(3, 8)] in seen  # all three requests verifying at once: one group
    assert all(len({q for _, q in step}) == len(step) for step in seen)  # never two groups of one length
