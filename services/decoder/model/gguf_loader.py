"""Read a GGUF file into (ModelConfig, Hugging Face named fp32 tensors, tokenizer pieces).

Supported GGUF architectures: ``llama`` (Llama 2/3, SmolLM2, and Mistral, which GGUF also calls
``llama``), ``qwen2`` (q/k/v bias) and ``qwen3`` (per-head q/k RMSNorm, explicit head_dim).
Mixture-of-experts files (``{arch}.expert_count`` > 0) are rejected.

Permutation convention (the one subtle part): llama.cpp's ``llama`` graph applies RoPE to
*interleaved* pairs (x0,x1),(x2,x3)... whereas Hugging Face Llama rotates the two *halves* of a
head. llama.cpp's converter therefore permutes the rows of ``q_proj``/``k_proj`` for the llama
architecture (only; ``LlamaModel.modify_tensors``), and we undo it per head:
``w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)``.
Qwen2 and Qwen3 run with the NEOX (rotate-half) RoPE in llama.cpp, exactly like Hugging Face, so
their converter does not permute and neither do we. (transformers' GGUF loader agrees: its only
un-permuting tensor processor is the llama one.)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf.quants import dequantize

from services.decoder.model.config import ModelConfig
from services.decoder.model.errors import ModelLoadError, UnsupportedArchitectureError


GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# GGUF per-layer tensor stem -> HF module path under ``model.layers.{i}.``
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


@dataclass(frozen=True)
class GGUFTokenizerData:
    """The ``tokenizer.ggml.*`` metadata of a GGUF file, as stored (ids index ``tokens``)."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece-style BPE with scores)
    pre: str | None  # pre-tokenizer name, e.g. "smollm", "llama-bpe", "qwen2", "gpt2"
    tokens: list[str]
    token_types: list[int] | None  # 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
    scores: list[float] | None
    merges: list[str] | None  # "left right" pairs, highest priority first
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None  # end of turn (Llama 3 <|eot_id|>), also stops generation
    eom_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos_token: bool | None  # None: not stated in the file
    add_eos_token: bool | None
    add_space_prefix: bool | None
    chat_template: str | None


def _open_reader(path: Path):
    try:
        size_bytes = path.stat().st_size
    except OSError as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    if size_bytes == 0:
        raise ModelLoadError(f"GGUF file {path} is empty")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as exc:  # the reader raises ValueError/struct.error/IndexError... on bad input
        raise ModelLoadError(f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}") from exc
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size_bytes or t.data.nbytes != int(t.n_bytes):
            raise ModelLoadError(
                f"GGUF file {path} is truncated: tensor {t.name} needs bytes up to {end}, "
                f"file has {size_bytes}"
            )
    return reader


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        value = f.contents()
    except Exception as exc:
        raise ModelLoadError(f"GGUF metadata {key!r} is unreadable: {exc}") from exc
    return default if value is None else value


def _float_field(reader, key: str, path: Path, default=None) -> float | None:
    """A float metadata value; float32 values are returned as their shortest decimal (1e-05, not
    9.999999747378752e-06), i.e. the number the converter was given."""
    value = _field(reader, key, default)
    if value is None:
        return None
    f = reader.fields.get(key)
    if f is not None and f.types and f.types[0] == gguf.GGUFValueType.FLOAT32:
        return float(str(np.float32(value)))
    return float(value)


def _int_field(reader, key: str, path: Path, default=None) -> int | None:
    value = _field(reader, key, default)
    if isinstance(value, list):
        if len(set(value)) != 1:
            raise UnsupportedArchitectureError(
                f"{path}: per-layer varying {key!r} ({value[:4]}...) is not supported"
            )
        value = value[0]
    return None if value is None else int(value)


def read_tokenizer_data(reader) -> GGUFTokenizerData:
    """Extract ``tokenizer.ggml.*`` fields from an open ``gguf.GGUFReader``."""

    def opt_int(key):
        v = _field(reader, key)
        return None if v is None else int(v)

    def opt_bool(key):
        v = _field(reader, key)
        return None if v is None else bool(v)

    model = _field(reader, "tokenizer.ggml.model")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if model is None or tokens is None:
        raise ModelLoadError("GGUF file has no tokenizer (tokenizer.ggml.model/tokens missing)")
    types = _field(reader, "tokenizer.ggml.token_type")
    scores = _field(reader, "tokenizer.ggml.scores")
    return GGUFTokenizerData(
        model=str(model),
        pre=_field(reader, "tokenizer.ggml.pre"),
        tokens=list(tokens),
        token_types=None if types is None else [int(x) for x in types],
        scores=None if scores is None else [float(x) for x in scores],
        merges=_field(reader, "tokenizer.ggml.merges"),
        bos_token_id=opt_int("tokenizer.ggml.bos_token_id"),
        eos_token_id=opt_int("tokenizer.ggml.eos_token_id"),
        eot_token_id=opt_int("tokenizer.ggml.eot_token_id"),
        eom_token_id=opt_int("tokenizer.ggml.eom_token_id"),
        unk_token_id=opt_int("tokenizer.ggml.unknown_token_id"),
        pad_token_id=opt_int("tokenizer.ggml.padding_token_id"),
        add_bos_token=opt_bool("tokenizer.ggml.add_bos_token"),
        add_eos_token=opt_bool("tokenizer.ggml.add_eos_token"),
        add_space_prefix=opt_bool("tokenizer.ggml.add_space_prefix"),
        chat_template=_field(reader, "tokenizer.chat_template"),
    )


def read_gguf_tokenizer(path: str | os.PathLike) -> GGUFTokenizerData:
    """Only the tokenizer metadata of a GGUF file (no tensor is dequantized)."""
    return read_tokenizer_data(_open_reader(Path(path)))


def _llama3_rope_scaling(rope_factors: np.ndarray, head_dim: int, rope_theta: float) -> dict:
    """Recover a HF ``llama3`` rope_scaling dict from llama.cpp's ``rope_freqs.weight``.

    llama.cpp stores per-frequency divisors ``f_i`` ([head_dim // 2]): 1 for short wavelengths,
    ``factor`` for long ones, ``1 / ((1 - s) / factor + s)`` in between, where
    ``s = (orig_ctx / wavelen - low) / (high - low)``. Only the ratios of (orig_ctx, low, high)
    affect the frequencies, so ``low_freq_factor`` is fixed at 1 (Llama 3.x's value) and the other
    two solved from the smooth band; the result is checked by recomputing the divisors.
    """
    factors = rope_factors.astype(np.float64)
    factor = float(factors.max())
    inv_freq = rope_theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    band = (factors > 1 + 1e-4) & (factors < factor - 1e-4 * factor)
    if band.sum() < 2 or factor <= 1:
        raise UnsupportedArchitectureError(
            "GGUF rope_freqs.weight does not follow the llama3 rope scaling pattern"
        )
    smooth = (1 / factors[band] - 1 / factor) / (1 - 1 / factor)  # = a / wavelen - b
    a, neg_b = np.polyfit(1 / wavelen[band], smooth, 1)
    b = -neg_b
    low = 1.0
    high = low + 1 / b
    orig = a / b
    s_all = (orig / wavelen - low) / (high - low)
    with np.errstate(divide="ignore"):
        smooth_all = 1 / ((1 - s_all) / factor + s_all)
    rebuilt = np.where(s_all > 1, 1.0, np.where(s_all < 0, factor, smooth_all))
    if not np.allclose(rebuilt, factors, rtol=1e-3):
        raise UnsupportedArchitectureError(
            "GGUF rope_freqs.weight does not follow the llama3 rope scaling pattern"
        )
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": float(round(high, 4)),
        "original_max_position_embeddings": int(round(orig)),
    }


def _rope_scaling(reader, arch: str, path: Path) -> dict | None:
    kind = _field(reader, f"{arch}.rope.scaling.type")
    if kind is None or kind == "none":
        return None
    factor = _float_field(reader, f"{arch}.rope.scaling.factor", path)
    if factor is None:
        raise ModelLoadError(f"GGUF file {path} lacks required metadata '{arch}.rope.scaling.factor'")
    orig = _field(reader, f"{arch}.rope.scaling.original_context_length")
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        scaling: dict = {"rope_type": "yarn", "factor": factor}
        if orig is not None:
            scaling["original_max_position_embeddings"] = int(orig)
        attn_factor = _float_field(reader, f"{arch}.rope.scaling.attn_factor", path)
        if attn_factor is not None:
            scaling["attention_factor"] = attn_factor
        return scaling
    raise UnsupportedArchitectureError(
        f"{path}: rope scaling type {kind!r} is not supported (supported: linear, yarn, llama3)"
    )


def _to_fp32_tensor(t) -> torch.Tensor:
    """Dequantize one reader tensor to a torch fp32 tensor of HF shape (reversed GGUF dims)."""
    try:
        arr = dequantize(t.data, t.tensor_type)
    except NotImplementedError as exc:
        raise ModelLoadError(f"tensor {t.name}: quantization {t.tensor_type.name} is not supported") from exc
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGUF lists dims innermost first
    arr = np.asarray(arr, dtype=np.float32).reshape(shape)
    if t.tensor_type == gguf.GGMLQuantizationType.F32 or not arr.flags.writeable:
        arr = arr.copy()  # F32 is a view of the read-only memory map
    return torch.from_numpy(arr)


def _unpermute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation. ``w``: [n_head * head_dim, in_features]."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape).contiguous()


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{parts[3]}"
    return None


def load_gguf(path: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor], GGUFTokenizerData]:
    """Read a GGUF model: config, HF-named fp32 tensors (``[out_features, in_features]``), tokenizer data.

    ``config.eos_token_ids`` / ``bos_token_id`` come from the tokenizer metadata (eos, eot, eom).
    Raises ``UnsupportedArchitectureError`` for another architecture, MoE or partial RoPE, and
    ``ModelLoadError`` for a missing, truncated or corrupt file or missing metadata.
    """
    path = Path(path)
    reader = _open_reader(path)
    arch = _field(reader, "general.architecture")
    if arch is None:
        raise ModelLoadError(f"GGUF file {path} has no general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{path}: GGUF architecture {arch!r} is not supported (supported: {', '.join(GGUF_ARCHITECTURES)})"
        )
    if (_int_field(reader, f"{arch}.expert_count", path) or 0) > 0:
        raise UnsupportedArchitectureError(f"{path}: mixture-of-experts {arch} models are not supported")

    hidden = _int_field(reader, f"{arch}.embedding_length", path)
    num_layers = _int_field(reader, f"{arch}.block_count", path)
    num_heads = _int_field(reader, f"{arch}.attention.head_count", path)
    intermediate = _int_field(reader, f"{arch}.feed_forward_length", path)
    for key, value in [("embedding_length", hidden), ("block_count", num_layers),
                       ("attention.head_count", num_heads), ("feed_forward_length", intermediate)]:
        if value is None:
            raise ModelLoadError(f"GGUF file {path} lacks required metadata '{arch}.{key}'")
    num_kv_heads = _int_field(reader, f"{arch}.attention.head_count_kv", path, num_heads)
    head_dim = _int_field(reader, f"{arch}.attention.key_length", path, hidden // num_heads)
    value_dim = _int_field(reader, f"{arch}.attention.value_length", path, head_dim)
    rope_dim = _int_field(reader, f"{arch}.rope.dimension_count", path, head_dim)
    if value_dim != head_dim or rope_dim != head_dim:
        raise UnsupportedArchitectureError(
            f"{path}: key_length {head_dim}, value_length {value_dim}, rope.dimension_count {rope_dim} "
            "differ; only full-width RoPE with equal key/value head sizes is supported"
        )
    rope_theta = _float_field(reader, f"{arch}.rope.freq_base", path, 10000.0)
    rms_eps = _float_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", path)
    if rms_eps is None:
        raise ModelLoadError(f"GGUF file {path} lacks required metadata '{arch}.attention.layer_norm_rms_epsilon'")
    ctx_len = _int_field(reader, f"{arch}.context_length", path, 2048)

    tok = read_tokenizer_data(reader)
    by_name = {t.name: t for t in reader.tensors}
    rope_scaling = _rope_scaling(reader, arch, path)
    if "rope_freqs.weight" in by_name:
        factors = _to_fp32_tensor(by_name.pop("rope_freqs.weight")).numpy()
        if not np.allclose(factors, 1.0):
            rope_scaling = _llama3_rope_scaling(factors, head_dim, rope_theta)

    weights: dict[str, torch.Tensor] = {}
    for name, t in by_name.items():
        hf = _hf_name(name)
        if hf is None:
            raise ModelLoadError(f"{path}: unexpected tensor {name!r} for a {arch} model")
        w = _to_fp32_tensor(t)
        if arch == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
            w = _unpermute_rows(w, num_heads if ".attn_q." in name else num_kv_heads)
        elif arch == "llama" and name.endswith((".attn_q.bias", ".attn_k.bias")):
            raise UnsupportedArchitectureError(
                f"{path}: llama GGUF with q/k bias ({name}) has no defined permutation convention"
            )
        weights[hf] = w

    embed = weights.get("model.embed_tokens.weight")
    if embed is None:
        raise ModelLoadError(f"{path}: missing tensor 'token_embd.weight'")
    general_name = _field(reader, "general.name") or path.stem
    architecture = "mistral" if arch == "llama" and "mistral" in general_name.lower() else arch
    eos_ids = tuple(dict.fromkeys(
        i for i in (tok.eos_token_id, tok.eot_token_id, tok.eom_token_id) if i is not None
    ))
    config = ModelConfig(
        architecture=architecture,
        vocab_size=int(embed.shape[0]),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope_theta=rope_theta,
        rms_norm_eps=rms_eps,
        max_position_embeddings=ctx_len,
        tie_word_embeddings="lm_head.weight" not in weights,
        attention_bias="model.layers.0.self_attn.q_proj.bias" in weights,
        qk_norm="model.layers.0.self_attn.q_norm.weight" in weights,
        rope_scaling=rope_scaling,
        bos_token_id=tok.bos_token_id,
        eos_token_ids=eos_ids,
        name=str(general_name),
    )
    declared_vocab = _int_field(reader, f"{arch}.vocab_size", path)
    if declared_vocab is not None and declared_vocab != config.vocab_size:
        raise ModelLoadError(
            f"{path}: {arch}.vocab_size {declared_vocab} != token_embd rows {config.vocab_size}"
        )
    return config, weights, tok
