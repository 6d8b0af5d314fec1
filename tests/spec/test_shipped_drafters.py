"""The DFlash, DFlash2 and DSpark drafters shipped for the default model: they load by default,
verify losslessly, and (trained) get drafts accepted on held-out chat prompts. A random drafter of
the same shape commits 1.0 tokens per verify (nothing accepted); the shipped ones measured
2.05-2.11 on held-out distilled chat (decoding walk, their README.md) and 1.85 in the engine on 24
held-out chat prompts, so 1.1 separates trained from untrained."""

import math

import pytest
import torch

from dhisparse import LLM, SamplingParams
from services.decoder.spec.dflash.drafter import shipped_checkpoint
from services.decoder.spec.drafter import LEARNED_DRAFTERS

# held out: never in the training prompt set (services/decoder/spec/training/prompts.py)
CHAT = ["What are three good habits for learning a new language?", "Explain what a hash table is to a beginner.",
        "Give me a short plan for a rainy Sunday."]


@pytest.fixture(scope="module")
def chat_prompts(loaded_model):
    tok = loaded_model.tokenizer
    return [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}]), add_special_tokens=False)
            for c in CHAT]


@pytest.mark.parametrize("kind", LEARNED_DRAFTERS)
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


@pytest.mark.parametrize("kind", LEARNED_DRAFTERS)
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
    assert llm.engine.speculator.depth.rates(1) == pytest.approx([prior])
    # the start-up profile built every weight copy the draft head's kernels use (MKL pack buckets,
    # oneDNN's), so no drafter call while serving pays for (and is priced at) a pack build
    head = llm.engine.speculator.drafter.head
    assert not any(head.needs_build(head.kernel(rows), rows) for rows in range(1, 8 * 16))


@pytest.mark.parametrize("kind", LEARNED_DRAFTERS)
def test_a_shorter_draft_is_the_full_drafts_prefix(loaded_model, chat_prompts, kind):
    """The drafter scores only the positions a request asks for (its heads pick left to right,
    the block's attention stays whole), so asking for 2 tokens gives the first 2 of the 7-token
    draft, with the same confidences (every kind scores its picks)."""
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
    assert short.confidences == pytest.approx(full.confidences[:2], abs=1e-5)
    engine.abort(rid)


def bf16_ulp(value: float) -> float:
    """The spacing of bfloat16 numbers (8 significant bits) around ``value``."""
    return 2.0 ** (math.floor(math.log2(abs(value))) - 7)


def greedy_alone_with_logits(loaded_model, prompt, params, **fields):
    """Plain greedy decoding of one request alone (one row per step) and the logits each step
    chose from: ``(token_ids, [vocab] logits per generated token)``."""
    llm = LLM(loaded=loaded_model, **fields)
    forward, rows = llm.engine.model.forward, []

    def recording_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        rows.append((out[0] if isinstance(out, tuple) else out)[-1].clone())
        return out

    llm.engine.model.forward = recording_forward
    return llm.generate([prompt], params)[0].token_ids, rows


@pytest.mark.parametrize("attention", [{}, dict(attention="sparse", top_k_tokens=16, sink_pages=1, recent_pages=2)],
                         ids=["dense", "sparse"])
def test_bf16_projections_verify_losslessly(loaded_model, chat_prompts, attention):
    """gemm_dtype=bf16 (oneDNN kernels): speculation against that target reproduces that
    target's own greedy decoding, dense and with a sparse selection, up to bf16 rounding ties.

    Why not token for token: the oneDNN bf16 GEMM returns bf16, so logits near 20 are quantised to
    0.125 and exact ties between the top two tokens occur; and a row's rounding depends on the
    batch's row count on some CPUs (AVX512-BF16 on AMD EPYC: the K=1536 down projection differs
    from 7-15 rows on; on the AMX machine it matched up to 16). Plain batched decoding departs
    from one-request decoding at such ties too (measured: gaps 0, 0.0625, 0.125). So each
    speculative output must equal the request decoded alone up to its first difference, and
    there the token it took must be within two bf16 steps of the alone run's argmax logit; a
    verifier that accepted a wrong draft token would leave a gap of whole logits."""
    params = SamplingParams(max_tokens=48)
    fields = dict(gemm_dtype="bfloat16", **attention)
    llm = LLM(loaded=loaded_model, spec="dspark", spec_tokens=7, **fields)
    # whichever bf16 kernels this machine's GEMM plan picks (oneDNN's where the CPU has them: AMX,
    # AVX512-BF16): bf16 results either way, and the same bound applies
    assert llm.engine.model.layers[0].qkv.weight.dtype == torch.bfloat16
    outs = llm.generate(chat_prompts, params)
    matched = 0
    for prompt, out in zip(chat_prompts, outs):
        alone, logits = greedy_alone_with_logits(loaded_model, prompt, params, **fields)
        first = next((i for i, (a, b) in enumerate(zip(alone, out.token_ids)) if a != b), None)
        if first is None:
            assert out.token_ids == alone
            matched += len(alone)
            continue
        row = logits[first]
        gap = (row.max() - row[out.token_ids[first]]).item()
        assert gap <= 2 * bf16_ulp(row.max().item()), (first, gap)
        matched += first
    assert matched >= len(chat_prompts) * params.max_tokens // 2  # ties are rare: most tokens compared
    assert sum(o.stats["accepted_tokens"] for o in outs) > 0
    assert llm.engine.check_integrity()


def test_the_engine_accepts_what_the_offline_evaluation_scores(loaded_model, chat_prompts):
    """The figure the cards report (``eval-drafter``: drafts at every answer anchor of a sequence
    the target answered greedily, scored against that answer) is what decoding measures: on the
    engine's own answer, each verify step that drafted a whole block accepts exactly the tokens
    the offline evaluation scores at its anchor (DFlash, its matmuls in fp32 as the evaluation's)."""
    from services.decoder.spec.dflash.checkpoint import load_checkpoint, read_draft_vocab
    from services.decoder.spec.training.dataset import Sequence
    from services.decoder.spec.training.evaluate import anchor_lengths
    from services.decoder.spec.training.target_features import target_features

    checkpoint = shipped_checkpoint("dflash")
    llm = LLM(loaded=loaded_model, spec="dflash", spec_tokens=7, draft_gemm_dtype="float32")
    speculator, steps = llm.engine.speculator, []
    record = speculator.record

    def recording(request, num_drafted, num_accepted):
        steps.append((num_drafted, num_accepted))
        record(request, num_drafted, num_accepted)

    speculator.record = recording
    prompt = chat_prompts[1]
    ids = list(prompt) + llm.generate([prompt], SamplingParams(max_tokens=64))[0].token_ids
    net, model = load_checkpoint(checkpoint), llm.engine.model
    features = target_features(model, ids, tuple(net.cfg.target_layer_ids))
    lengths = anchor_lengths(net, model.embed_tokens, Sequence("s", "chat", "heldout", torch.tensor(ids), features,
                                                              len(prompt)),
                             vocab=read_draft_vocab(checkpoint, model.config.vocab_size))
    anchor, compared = len(prompt), 0  # the first verify step drafts after the prefill's token
    for num_drafted, num_accepted in steps:
        if num_drafted == 7 and anchor - len(prompt) < len(lengths):
            assert num_accepted + 1 == lengths[anchor - len(prompt)], (anchor, num_accepted, lengths[anchor - len(prompt)])
            compared += 1
        anchor += num_accepted + 1
    # the walk covered the answer: after it, at most the last token, decoded with no room left to draft
    assert compared >= 20 and anchor >= len(ids) - 2
