"""The DFlash and DSpark drafters shipped for the default model: they load by default, verify
losslessly, and (trained) get drafts accepted on held-out chat prompts. A random drafter of the
same shape commits 1.0 tokens per verify (nothing accepted); the shipped ones measured 1.78-1.88
on held-out distilled chat (decoding walk, their README.md) and 1.58 in the engine on chat prompts
like these (1.4-1.45 before the 2026-12-01 data round), so 1.1 separates trained from untrained."""

import pytest

from dhisparse import LLM, SamplingParams
from services.decoder.spec.dflash.drafter import shipped_checkpoint

# held out: never in the training prompt set (services/decoder/spec/training/prompts.py)
CHAT = ["What are three good habits for learning a new language?", "Explain what a hash table is to a beginner.",
        "Give me a short plan for a rainy Sunday."]


@pytest.fixture(scope="module")
def chat_prompts(loaded_model):
    tok = loaded_model.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}]), add_special_tokens=False)
            for c in CHAT]


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_shipped_drafter_is_lossless_and_accepts(loaded_model, chat_prompts, kind):
    assert (shipped_checkpoint(kind) / "model.safetensors").is_file()
    params = SamplingParams(max_tokens=48)
    plain = [o.token_ids for o in LLM(loaded=loaded_model).generate(chat_prompts, params)]
    llm = LLM(loaded=loaded_model, spec=kind, spec_tokens=7)  # the shipped checkpoint, no path given
    outs = llm.generate(chat_prompts, params)
    assert [o.token_ids for o in outs] == plain
    accepted = sum(o.stats["accepted_tokens"] for o in outs)
    steps = sum(o.stats["num_verify_steps"] for o in outs)
    assert steps > 0 and (accepted + steps) / steps > 1.1, (accepted, steps)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_shipped_drafter_starts_the_budget_from_its_heldout_acceptance(loaded_model, kind):
    """The adaptive budget's starting survival estimate is the checkpoint's measured held-out mean
    acceptance length turned into a per-position survival (1 + p + ... + p^7 = that length)."""
    from services.decoder.spec.dflash.checkpoint import read_heldout_acceptance_length
    from services.decoder.spec.verify_budget import expected_committed

    heldout = read_heldout_acceptance_length(shipped_checkpoint(kind))
    assert heldout is not None and 1.0 < heldout < 8.0
    llm = LLM(loaded=loaded_model, spec=kind, spec_tokens=7, verify_budget="adaptive")
    prior = llm.engine.speculator.drafter.prior_acceptance
    assert expected_committed([prior] * 7) == pytest.approx(heldout)
    assert llm.engine.speculator.acceptance.rate == pytest.approx(prior)
    # the start-up profile built every packed-GEMM bucket of the draft head, so no drafter call
    # while serving pays for (and is priced at) a pack build
    from services.decoder.model.linear import PACK_BUCKETS_ROWS

    assert set(llm.engine.speculator.drafter.head._packs) == set(PACK_BUCKETS_ROWS)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_a_shorter_draft_is_the_full_drafts_prefix(loaded_model, chat_prompts, kind):
    """The drafter scores only the positions a request asks for (its heads pick left to right,
    the block's attention stays whole), so asking for 2 tokens gives the first 2 of the 7-token
    draft, with the same confidences."""
    from services.decoder.spec.drafter import DraftRequest

    llm = LLM(loaded=loaded_model, spec=kind, spec_tokens=7)
    engine = llm.engine
    rid = engine.add_request(chat_prompts[1], SamplingParams(max_tokens=256))
    request = engine.requests[rid]
    while len(request.output_ids) < 16:  # a context to draft from; the request still runs
        engine.step()
    assert rid in engine.requests and not request.finish_reason
    drafter = engine.speculator.drafter
    ids = request.prompt_ids + request.output_ids
    full, = drafter.propose_batch([DraftRequest(rid, ids, 7)])
    short, = drafter.propose_batch([DraftRequest(rid, ids, 2)])
    assert len(full.tokens) == 7 and short.tokens == full.tokens[:2]
    if kind == "dspark":
        assert short.confidences == pytest.approx(full.confidences[:2], abs=1e-5)
    engine.abort(rid)


@pytest.mark.parametrize("attention", [{}, dict(attention="sparse", top_k_tokens=16, sink_pages=1, recent_pages=2)],
                         ids=["dense", "sparse"])
def test_bf16_projections_verify_losslessly(loaded_model, chat_prompts, attention):
    """gemm_dtype=bf16 (oneDNN kernels): speculation against that target reproduces that
    target's own plain greedy decoding, token for token, dense and with a sparse selection."""
    params = SamplingParams(max_tokens=48)
    fields = dict(gemm_dtype="bfloat16", **attention)
    plain = LLM(loaded=loaded_model, **fields)
    assert plain.engine.model.layers[0].qkv.packed_path == "onednn-bf16"
    want = [o.token_ids for o in plain.generate(chat_prompts, params)]
    llm = LLM(loaded=loaded_model, spec="dspark", spec_tokens=7, **fields)
    outs = llm.generate(chat_prompts, params)
    assert [o.token_ids for o in outs] == want
    assert sum(o.stats["accepted_tokens"] for o in outs) > 0
    assert llm.engine.check_integrity()
