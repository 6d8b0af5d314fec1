"""The engine's device option: what it refuses, that a forward keeps every tensor on the model's
device, and (where CUDA exists) that GPU greedy decoding equals CPU greedy decoding."""

import pytest
import torch
from pydantic import ValidationError

from dhisparse import LLM, SamplingParams
from services.decoder.config import DecoderConfig
from services.decoder.kv.hot_pool import HotPool
from services.decoder.model.attention import (
    AttentionMetadata,
    PagedAttention,
    build_group,
)
from services.decoder.model.llama import LlamaModel


@pytest.mark.parametrize("fields, named", [
    ({"attention": "sparse"}, "attention='sparse'"),
    ({"kvtier_address": "127.0.0.1:1"}, "kvtier_address"),
    ({"spec": "dflash"}, "spec='dflash'"),
])
def test_a_gpu_device_refuses_the_cpu_only_paths(fields, named):
    with pytest.raises(ValidationError, match=named):
        DecoderConfig(device="cuda", **fields)
    DecoderConfig(device="cuda", spec="ngram")  # dense decoding with n-gram speculation is fine
    DecoderConfig(device="cuda:1")


def test_a_device_name_is_validated():
    with pytest.raises(ValidationError, match="device"):
        DecoderConfig(device="gpu")


def test_the_forward_keeps_every_tensor_on_the_models_device(loaded_model):
    """Weights, rope tables, the pool and the step metadata all land on the model's device, and a
    whole forward (two decodes and a verify block) runs there: on the meta device, shapes only.
    (Meta tolerates some mixed-device ops, so the placement is asserted tensor by tensor.)"""
    cfg = loaded_model.config
    meta = torch.device("meta")
    model = LlamaModel(cfg, loaded_model.weights, device=meta, max_positions=256)
    tensors = [model.embed_tokens, model.final_norm, model.rope.cos, model.rope.sin, model.lm_head.weight]
    for layer in model.layers:
        tensors += [t for t in (layer.input_norm, layer.post_norm, layer.q_norm, layer.k_norm) if t is not None]
        tensors += [lin.weight for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down)]
        tensors += [lin.bias for lin in (layer.qkv, layer.o_proj, layer.gate_up, layer.down) if lin.bias is not None]
    assert {t.device for t in tensors} == {meta}
    pool = HotPool(cfg.num_layers, 8, 16, cfg.num_kv_heads, cfg.head_dim, device=meta)
    # two decoding requests (contexts of 20 and 33 tokens) and a 5-token verify block
    groups = [build_group(0, [[19], [32]], [[0, 1], [2, 3, 4]], [20, 33], 16),
              build_group(2, [[40, 41, 42, 43, 44]], [[5, 6, 7]], [45], 16)]
    positions = torch.tensor([19, 32, 40, 41, 42, 43, 44])
    write_rows = torch.tensor([1 * 16 + 3, 4 * 16 + 0] + [7 * 16 + 8 + i for i in range(5)])  # slot * page + offset

    step = AttentionMetadata(positions, write_rows, groups).to(meta)
    moved = [step.positions, step.write_rows] + [t for g in step.groups for t in (g.read_rows, g.attn_mask)]
    assert all(t is not None and t.device == meta for t in moved)  # both groups need a mask here
    attention = PagedAttention(pool, cfg.num_heads, model.scale)
    logits = model.forward(torch.zeros(7, dtype=torch.int64, device=meta), step, attention,
                           logit_rows=torch.tensor([0, 1, 6], device=meta))
    assert logits.device == meta and tuple(logits.shape) == (3, cfg.vocab_size)


def test_cuda_greedy_decoding_equals_cpu(loaded_model):
    """On a machine without CUDA the engine says so; with CUDA, fp32 greedy decoding of a few
    concurrent prompts (n-gram speculation on, so verify blocks run too) gives the CPU's tokens."""
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            LLM(loaded=loaded_model, device="cuda")
        return
    prompts = ["The capital of France is", "def fib(n):\n    if n < 2:\n        return n\n    return",
               "One, two, three, four, five, one, two,"]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    cpu = [o.token_ids for o in LLM(loaded=loaded_model).generate(prompts, params)]
    gpu = LLM(loaded=loaded_model, device="cuda", spec="ngram", spec_tokens=4).generate(prompts, params)
    # fp32 on both (no TF32: torch's default for fp32 matmuls); reductions are ordered differently,
    # so only a near-tie between two logits could flip a token
    assert [o.token_ids for o in gpu] == cpu
