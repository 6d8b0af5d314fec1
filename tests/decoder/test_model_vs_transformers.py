"""Our llama runtime against the transformers oracle on the same GGUF weights (fp32)."""

import pytest
import torch

from services.decoder.kv.hot_pool import HotPool
from services.decoder.model.attention import AttentionMetadata, PagedAttention, build_group
from services.decoder.model.llama import LlamaModel
from tests.decoder.prompts import SHORT_PROMPTS, long_document

PAGE_SIZE = 16


@pytest.fixture(scope="module")
def our_model(loaded_model):
    return LlamaModel(loaded_model.config, loaded_model.weights, torch.float32)


def chunked_prefill_logits(model: LlamaModel, ids: list[int], chunk: int) -> torch.Tensor:
    """Runs ``ids`` through the paged path in chunks; slots are deliberately non-contiguous
    and out of order. Returns logits at every position: ``[len(ids), vocab]``."""
    cfg = model.config
    num_pages = -(-len(ids) // PAGE_SIZE)
    pool = HotPool(cfg.num_layers, 2 * num_pages + 3, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, model.dtype)
    slots = [2 * num_pages + 2 - 2 * p for p in range(num_pages)]  # reversed, with gaps
    attention = PagedAttention(pool, cfg.num_heads, model.scale)
    out = []
    for start in range(0, len(ids), chunk):
        pos = list(range(start, min(start + chunk, len(ids))))
        meta = AttentionMetadata(
            positions=torch.tensor(pos),
            write_rows=torch.tensor([slots[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in pos]),
            groups=[build_group(0, [pos], [slots], [pos[-1] + 1], PAGE_SIZE)],
        )
        out.append(model.forward(torch.tensor(ids[start : pos[-1] + 1]), meta, attention))
    return torch.cat(out)


@pytest.mark.parametrize("prompt_index", range(len(SHORT_PROMPTS)))
def test_logits_match_transformers_every_position(our_model, hf_oracle, loaded_model, prompt_index):
    ids = loaded_model.tokenizer.encode(SHORT_PROMPTS[prompt_index])
    ours = chunked_prefill_logits(our_model, ids, chunk=5)
    with torch.no_grad():
        ref = hf_oracle(torch.tensor([ids])).logits[0].float()
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-3


def test_logits_match_transformers_on_a_2000_token_prompt(our_model, hf_oracle, loaded_model):
    ids = loaded_model.tokenizer.encode(long_document())
    assert 1900 <= len(ids) <= 2600, len(ids)
    ours = chunked_prefill_logits(our_model, ids, chunk=512)
    with torch.no_grad():
        ref = hf_oracle(torch.tensor([ids])).logits[0].float()
    assert (ours - ref).abs().max().item() <= 1e-3


def test_greedy_64_token_continuations_identical(llm, hf_oracle, loaded_model):
    from dhisparse import SamplingParams

    tok = loaded_model.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}]),
        SHORT_PROMPTS[1],
        SHORT_PROMPTS[2],
    ]
    encoded = [tok.encode(p, add_special_tokens=False) for p in prompts]
    outs = llm.generate(encoded, SamplingParams(max_tokens=64))
    eos = set(loaded_model.config.eos_token_ids)
    for ids, out in zip(encoded, outs):
        with torch.no_grad():
            ref = hf_oracle.generate(
                torch.tensor([ids]), max_new_tokens=64, do_sample=False, eos_token_id=sorted(eos), pad_token_id=sorted(eos)[0]
            )[0, len(ids) :].tolist()
        assert out.token_ids == ref
        assert out.finish_reason == ("stop" if ref[-1] in eos else "length")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runtime_tracks_fp32(loaded_model, our_model, dtype):
    """bf16/fp16 weights, pool and activations: same argmax at every position of a prompt and
    logits close to fp32 (tolerance: bf16 keeps 8 mantissa bits, so ~1% relative error per op
    compounds over 30 layers; we bound the error relative to the logits' spread)."""
    half = LlamaModel(loaded_model.config, loaded_model.weights, dtype)
    ids = loaded_model.tokenizer.encode(SHORT_PROMPTS[3])
    ref = chunked_prefill_logits(our_model, ids, chunk=4)
    got = chunked_prefill_logits(half, ids, chunk=4)
    assert half.layers[0].qkv.weight.dtype == dtype
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.9
    assert ((got - ref).abs().max() / ref.std()).item() < 0.35


def test_bf16_projections_in_an_fp32_model_track_fp32(loaded_model, our_model):
    """gemm_dtype=bf16: only the matmuls' inputs and weights are rounded to bf16 (fp32
    accumulation); norms, residual stream, attention and KV stay fp32. Measured on these prompts:
    max |logit error| 0.04-0.07 of the logits' spread (full bf16: 0.08-0.22), same argmax at every
    position but one near-tie of prompt 3 (which full bf16 shares)."""
    mixed = LlamaModel(loaded_model.config, loaded_model.weights, torch.float32, gemm_dtype=torch.bfloat16)
    assert mixed.layers[0].gate_up.weight.dtype == torch.bfloat16 and mixed.lm_head.weight.dtype == torch.bfloat16
    assert mixed.embed_tokens.dtype == torch.float32 and mixed.layers[0].input_norm.dtype == torch.float32
    for prompt in SHORT_PROMPTS:
        ids = loaded_model.tokenizer.encode(prompt)
        ref = chunked_prefill_logits(our_model, ids, chunk=4)
        got = chunked_prefill_logits(mixed, ids, chunk=4)
        assert got.dtype == torch.float32
        assert (got.argmax(-1) == ref.argmax(-1)).float().mean().item() >= 0.9
        assert ((got - ref).abs().max() / ref.std()).item() < 0.15
