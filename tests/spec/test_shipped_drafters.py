"""The DFlash and DSpark drafters shipped for the default model: they load by default, verify
losslessly, and (trained) get drafts accepted on held-out chat prompts. A random drafter of the
same shape commits 1.0 tokens per verify (nothing accepted); the shipped ones measured 1.77-1.89
on held-out chat anchors (their README.md) and 1.3-1.5 in the engine on chat prompts like these,
so 1.1 separates trained from untrained."""

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
