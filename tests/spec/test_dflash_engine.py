"""DFlash / DSpark drafters inside the engine on real weights: lossless against plain decoding,
and the drafter's context holds exactly the committed positions' target features."""

import pytest
import torch

from dhisparse import LLM, SamplingParams
from services.decoder.spec.drafter import Draft
from tests.spec.dflash_fixtures import write_random_checkpoint

PARAMS = SamplingParams(max_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    return {kind: str(write_random_checkpoint(root / kind, kind=kind, seed=7)) for kind in ("dflash", "dspark")}


def partly_right(engine, truths: dict[str, list[int]], prompt_lens: dict[str, int]) -> None:
    """Makes the engine's drafter propose, at the n-th verify of a request, ``n % 8`` tokens of
    the true greedy continuation followed by its own tokens: acceptance of every length happens,
    and so do rejections after an accepted prefix."""
    inner = engine.speculator.drafter.propose_batch

    def mixed(asks):
        drafts = inner(asks)
        out = []
        for ask, draft in zip(asks, drafts):
            done = len(ask.token_ids) - prompt_lens[ask.request_id]
            right = truths[ask.request_id][done : done + done % 8]
            tokens = (right + draft.tokens[len(right):])[: ask.max_tokens]
            out.append(Draft(tokens, (draft.confidences + [0.5] * 8)[: len(tokens)]))
        return out

    engine.speculator.drafter.propose_batch = mixed


def _run(llm, prompts, truths=None):
    engine = llm.engine
    ids = [engine.add_request(p, PARAMS) for p in prompts]
    if truths is not None:
        partly_right(engine, dict(zip(ids, truths)), {i: len(p) for i, p in zip(ids, prompts)})
    engine.run_until_done()
    return [engine.pop_finished(i) for i in ids]


@pytest.fixture(scope="module")
def plain_outputs(loaded_model, prompts):
    return [o.token_ids for o in LLM(loaded=loaded_model).generate(prompts, PARAMS)]


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_greedy_block_drafting_is_lossless(loaded_model, prompts, checkpoints, plain_outputs, kind):
    """Dense attention; the sparse, tiered case is ``tests/kvtier/test_spec_hierarchy.py``."""
    llm = LLM(loaded=loaded_model, spec=kind, spec_tokens=7, draft_model=checkpoints[kind])
    outputs = _run(llm, prompts, truths=plain_outputs)
    assert [o.output_ids for o in outputs] == plain_outputs
    stats = [o.stats for o in outputs]
    assert sum(s.accepted_tokens for s in stats) > 0
    assert sum(s.drafted_tokens - s.accepted_tokens for s in stats) > 0
    assert llm.engine.check_integrity()
    assert llm.engine.speculator.drafter.contexts == {}  # finished requests leave no draft context
    assert llm.engine.allocator.num_free_slots == llm.engine.allocator.num_slots


def test_the_draft_context_holds_only_committed_features(loaded_model, prompts, checkpoints):
    """A run with many rejections and a run that never drafts give the drafter the same context
    (same positions, same keys/values up to GEMM rounding): rejected rows never reach it. The
    drafters run fp32 matmuls: what this checks is which rows the context holds, and fp32 rounding
    keeps the bound on how a row's values may differ tight (bf16 inputs differ by up to ~1e-2)."""
    fields = dict(spec="dflash", spec_tokens=7, draft_model=checkpoints["dflash"], draft_gemm_dtype="float32")
    spec = LLM(loaded=loaded_model, **fields).engine
    still = LLM(loaded=loaded_model, **fields).engine
    still.speculator.drafter.propose_batch = lambda asks: [Draft([]) for _ in asks]
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    sid = spec.add_request(prompts[0], params)
    while len(spec.requests[sid].output_ids) < 40:
        spec.step()
    s_req = spec.requests[sid]
    assert s_req.stats.drafted_tokens > s_req.stats.accepted_tokens
    pid = still.add_request(prompts[0], params)
    while still.requests[pid].num_computed_tokens < s_req.num_computed_tokens:
        still.step()
    a, b = spec.speculator.drafter.context(sid), still.speculator.drafter.context(pid)
    assert a.end == b.end == s_req.num_computed_tokens
    assert torch.equal(a.slot_pos, b.slot_pos)
    # a position's features computed inside a verify block vs alone differ by GEMM rounding only
    torch.testing.assert_close(a.k, b.k, rtol=0, atol=2e-3)
    torch.testing.assert_close(a.v, b.v, rtol=0, atol=2e-3)


def test_sampled_block_drafting_is_reproducible(loaded_model, prompts, checkpoints):
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=5, ignore_eos=True)
    runs = [LLM(loaded=loaded_model, spec="dspark", draft_model=checkpoints["dspark"]).generate(prompts[:2], params)
            for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    assert all(len(o.token_ids) == 24 for o in runs[0])


@pytest.mark.parametrize("option", ["auto", "float32", "bfloat16"])
def test_the_drafters_matmul_precision_follows_the_config(loaded_model, checkpoints, option):
    """``draft_gemm_dtype``: the draft layers' and head's matmuls run in it (auto: bf16 where
    oneDNN runs bf16 kernels); the target's LM head is shared only in the target's precision."""
    from services.decoder.model.linear import onednn_bf16_supported
    from services.decoder.spec.dflash.layers import PackedLinear

    engine = LLM(loaded=loaded_model, spec="dflash", draft_model=checkpoints["dflash"],
                 draft_gemm_dtype=option).engine
    drafter = engine.speculator.drafter
    bf16 = option == "bfloat16" or (option == "auto" and onednn_bf16_supported())
    want = torch.bfloat16 if bf16 else torch.float32
    packed = [m for m in drafter.net.modules() if isinstance(m, PackedLinear)]
    assert packed and {m.gemm_dtype for m in packed} == {want}
    assert drafter.head.weight.dtype == want
    assert (drafter.head is engine.model.lm_head) == (not bf16)  # no draft vocabulary in this checkpoint
