"""Model path -> ``LoadedModel`` (config, validated HF-named weights, tokenizer).

Weight names and shapes (``[out_features, in_features]``), whatever the file format::

    model.embed_tokens.weight                          [vocab_size, hidden_size]
    model.layers.{i}.input_layernorm.weight            [hidden_size]
    model.layers.{i}.self_attn.q_proj.weight           [num_heads * head_dim, hidden_size]
    model.layers.{i}.self_attn.k_proj.weight           [num_kv_heads * head_dim, hidden_size]
    model.layers.{i}.self_attn.v_proj.weight           [num_kv_heads * head_dim, hidden_size]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias       [rows of the weight]   (attention_bias)
    model.layers.{i}.self_attn.o_proj.weight           [hidden_size, num_heads * head_dim]
    model.layers.{i}.self_attn.{q,k}_norm.weight       [head_dim]             (qk_norm)
    model.layers.{i}.post_attention_layernorm.weight   [hidden_size]
    model.layers.{i}.mlp.{gate,up}_proj.weight         [intermediate_size, hidden_size]
    model.layers.{i}.mlp.down_proj.weight              [hidden_size, intermediate_size]
    model.norm.weight                                  [hidden_size]
    lm_head.weight                                     [vocab_size, hidden_size]  (only if not tied)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from services.decoder.host_allocator import keep_freed_memory_in_heap
from services.decoder.model.config import ModelConfig
from services.decoder.model.errors import ModelLoadError
from services.decoder.model.gguf_loader import load_gguf
from services.decoder.model.safetensors_loader import load_safetensors_dir
from services.decoder.model.tokenizer import Tokenizer

CHATML_END_OF_TURN = "<|im_end|>"


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF names -> contiguous tensors of the requested dtype
    tokenizer: Tokenizer
    source: Path


def expected_weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a model of ``config`` must have, with its shape (see the module docstring)."""
    h, hd, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q_rows, kv_rows = config.num_heads * hd, config.num_kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, h)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "self_attn.q_proj.weight"] = (q_rows, h)
        shapes[p + "self_attn.k_proj.weight"] = (kv_rows, h)
        shapes[p + "self_attn.v_proj.weight"] = (kv_rows, h)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_rows)
        if config.attention_bias:
            shapes[p + "self_attn.q_proj.bias"] = (q_rows,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_rows,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_rows,)
        if config.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, h)
        shapes[p + "mlp.up_proj.weight"] = (inter, h)
        shapes[p + "mlp.down_proj.weight"] = (h, inter)
    return shapes


def validate_weights(config: ModelConfig, weights: dict[str, torch.Tensor], source: Path) -> None:
    """Raise ``ModelLoadError`` naming the first missing, misshapen or unexpected tensor."""
    expected = expected_weight_shapes(config)
    for name, shape in expected.items():
        tensor = weights.get(name)
        if tensor is None:
            raise ModelLoadError(f"{source}: missing tensor {name!r} (expected shape {list(shape)})")
        if tuple(tensor.shape) != shape:
            raise ModelLoadError(
                f"{source}: tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)}"
            )
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        more = f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""
        raise ModelLoadError(
            f"{source}: unexpected tensor {unexpected[0]!r}{more} for this {config.architecture} model"
        )


def _merge_special_ids(config: ModelConfig, tokenizer: Tokenizer) -> ModelConfig:
    """eos ids = tokenizer's + config's, plus ``<|im_end|>`` for ChatML templates; bos from the
    tokenizer when the config has none."""
    eos = [*tokenizer.eos_token_ids, *config.eos_token_ids]
    im_end = tokenizer.token_to_id(CHATML_END_OF_TURN)
    if im_end is not None and CHATML_END_OF_TURN in (tokenizer.chat_template or ""):
        eos.append(im_end)
    eos = [i for i in dict.fromkeys(eos) if 0 <= i < max(config.vocab_size, tokenizer.vocab_size)]
    bos = config.bos_token_id if config.bos_token_id is not None else tokenizer.bos_token_id
    return replace(config, eos_token_ids=tuple(eos), bos_token_id=bos)


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a ``.gguf`` file or a Hugging Face directory (config.json + *.safetensors +
    tokenizer.json). Weights are validated, cast to ``dtype`` and made contiguous.

    Raises ``ModelLoadError`` (missing/corrupt/truncated/incomplete) or its subclass
    ``UnsupportedArchitectureError``.
    """
    keep_freed_memory_in_heap()  # before the first large allocation (host_allocator.py)
    source = Path(path).expanduser()
    if not source.exists():
        raise ModelLoadError(f"model path does not exist: {source}")
    if source.is_dir():
        config, weights = load_safetensors_dir(source)
        tokenizer = Tokenizer.from_pretrained_dir(source)
    elif source.suffix.lower() == ".gguf":
        config, weights, tok_data = load_gguf(source)
        tokenizer = Tokenizer.from_gguf_data(tok_data)
    else:
        raise ModelLoadError(f"{source} is neither a .gguf file nor a Hugging Face model directory")

    validate_weights(config, weights, source)
    # safetensors tensors are views of a memory map: copy them, so that replacing the files
    # under a running server cannot crash it (SIGBUS).
    weights = {name: t.to(dtype, copy=source.is_dir()).contiguous() for name, t in weights.items()}
    config = _merge_special_ids(config, tokenizer)
    return LoadedModel(config=config, weights=weights, tokenizer=tokenizer, source=source)
