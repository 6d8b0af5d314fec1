"""Sparse attention inside the engine, on real weights."""

import pytest
import torch

from dhisparse import LLM, SamplingParams
from tests.decoder.prompts import SHORT_PROMPTS, long_document


def capture_logits(llm: LLM) -> list[torch.Tensor]:
    """Records the logits of every forward the engine runs."""
    captured: list[torch.Tensor] = []
    forward = llm.engine.model.forward

    def recording_forward(*args, **kwargs):
        logits = forward(*args, **kwargs)
        captured.append(logits.clone())
        return logits

    llm.engine.model.forward = recording_forward
    return captured


@pytest.fixture(scope="module")
def prompts(loaded_model):
    tok = loaded_model.tokenizer
    return [tok.encode(long_document(n)) for n in (45, 20, 60)] + [tok.encode(SHORT_PROMPTS[1])]


@pytest.mark.parametrize("force_selection", [True, False], ids=["selection-path", "within-budget-shortcut"])
def test_sparse_at_full_budget_gives_dense_logits(loaded_model, prompts, force_selection):
    """Forced through page_select + the page-list kernel, a budget covering the context must
    reproduce dense decoding; by default the engine skips selection when the budget covers it."""
    dense = LLM(loaded=loaded_model, max_num_batched_tokens=256)
    sparse = LLM(loaded=loaded_model, max_num_batched_tokens=256, attention="sparse", top_k_tokens=8192)
    if force_selection:
        sparse.engine.runner._within_budget = lambda sched: False
    dense_logits, sparse_logits = capture_logits(dense), capture_logits(sparse)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    d = dense.generate(prompts, params)
    s = sparse.generate(prompts, params)
    assert [o.token_ids for o in d] == [o.token_ids for o in s]
    assert len(dense_logits) == len(sparse_logits)
    worst = max((a - b).abs().max().item() for a, b in zip(dense_logits, sparse_logits) if a.numel())
    assert worst <= 1e-5
    attention = sparse.engine.runner.attention
    if force_selection:
        assert attention.num_selected_pages == attention.num_context_pages > 0
    else:
        assert attention.num_selected_pages == attention.num_context_pages == 0


def test_sparse_decoding_batches_like_alone_and_really_skips_pages(loaded_model, prompts):
    settings = dict(attention="sparse", top_k_tokens=64, sink_pages=1, recent_pages=2, max_num_batched_tokens=128)
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    alone = [LLM(loaded=loaded_model, **settings).generate([p], params)[0].token_ids for p in prompts]
    batched_llm = LLM(loaded=loaded_model, **settings)
    batched = [o.token_ids for o in batched_llm.generate(prompts, params)]
    assert batched == alone
    attention = batched_llm.engine.runner.attention
    # budget = 1 sink + 4 top-k + 2 recent pages against contexts of up to ~50 pages
    assert attention.num_selected_pages < 0.5 * attention.num_context_pages
    assert batched_llm.engine.check_integrity()


def test_sparse_budget_changes_the_output_on_long_context(loaded_model, prompts):
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    dense = LLM(loaded=loaded_model).generate([prompts[2]], params)[0].token_ids
    tiny = LLM(loaded=loaded_model, attention="sparse", top_k_tokens=16, recent_pages=1).generate([prompts[2]], params)[0]
    assert tiny.token_ids != dense, "a 3-page budget over ~50 pages should change something (else sparse is not in effect)"


def test_bad_sparse_settings_are_rejected(loaded_model):
    with pytest.raises(ValueError, match="recent_pages"):
        LLM(loaded=loaded_model, attention="sparse", recent_pages=0)
    with pytest.raises(ValueError, match="attention"):
        LLM(loaded=loaded_model, attention="quest")


def test_preempted_sparse_request_recomputes_generated_tokens_with_their_own_selection(loaded_model, prompts):
    """Generated tokens were computed by sparse decode steps; a recompute after preemption must
    compute them the same way (not by a dense prefill chunk): the output equals the uninterrupted
    run, prompt chunks stop at the prompt's end and chunks of generated tokens span at most
    ``recent_pages`` pages (their candidates all sealed before the step)."""
    settings = dict(attention="sparse", top_k_tokens=64, sink_pages=1, recent_pages=2, max_num_batched_tokens=512)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    prompt = prompts[0]
    reference = LLM(loaded=loaded_model, **settings).generate([prompt], params)[0].token_ids
    engine = LLM(loaded=loaded_model, **settings).engine
    rid = engine.add_request(prompt, params)
    request = engine.requests[rid]
    while len(request.output_ids) < 45:
        engine.step()
    engine.scheduler.preempt(request)  # its slots go; prompt and 45 generated tokens are computed again
    assert request.num_computed_tokens == 0
    chunks = []
    schedule = engine.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        chunks.extend((s.request.num_computed_tokens, s.num_new_tokens) for s in batch if s.num_new_tokens > 1)
        return batch

    engine.scheduler.schedule = recording_schedule
    while engine.has_unfinished():
        engine.step()
    assert engine.pop_finished(rid).output_ids == reference
    prompt_len = len(prompt)
    # the prompt densely as at first (chunks of at most 512 tokens), ending exactly at its end
    assert sum(n for start, n in chunks if start < prompt_len) == prompt_len
    assert not any(start < prompt_len < start + n for start, n in chunks)
    generated = [(start, n) for start, n in chunks if start >= prompt_len]
    assert len(generated) > 1 and sum(n for _, n in generated) == 45  # the last one samples the 46th token
    assert all((start + n - 1) // 16 - start // 16 < 2 for start, n in generated)  # recent_pages=2
    assert engine.check_integrity()
