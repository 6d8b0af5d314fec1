"""Model loading: GGUF and safetensors against transformers, synthetic architectures, bad input."""

from __future__ import annotations

import json
import math

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers

from services.decoder.model.errors import ModelLoadError, UnsupportedArchitectureError
from services.decoder.model.gguf_loader import load_gguf
from services.decoder.model.loader import expected_weight_shapes, load_model

# ---- the default model vs transformers ---------------------------------------------------------


def test_gguf_config_fields(loaded_model):
    cfg = loaded_model.config
    assert (cfg.architecture, cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == ("llama", 49152, 576, 1536)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert cfg.rope_theta == 100000.0 and cfg.rms_norm_eps == 1e-5  # float32 metadata, shortest repr
    assert cfg.max_position_embeddings == 8192 and cfg.tie_word_embeddings
    assert not cfg.attention_bias and not cfg.qk_norm and cfg.rope_scaling is None
    assert cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)  # <|im_end|>
    assert loaded_model.tokenizer.id_to_token(2) == "<|im_end|>"
    assert "lm_head.weight" not in loaded_model.weights
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in loaded_model.weights.values())


def test_gguf_weights_equal_transformers(loaded_model, hf_oracle):
    # Both dequantize the same blocks with the same gguf code and un-permute q/k identically,
    # so the tensors are bit-identical (atol 0).
    hf = hf_oracle.state_dict()
    ours = loaded_model.weights
    assert set(hf) - set(ours) == {"lm_head.weight"}  # tied: transformers lists the shared tensor
    assert set(ours) <= set(hf)
    for name, tensor in ours.items():
        assert torch.equal(tensor, hf[name]), name
    assert torch.equal(hf["lm_head.weight"], ours["model.embed_tokens.weight"])
    assert hf_oracle.config.head_dim == loaded_model.config.head_dim


def test_safetensors_dir_from_transformers_equals_gguf(loaded_model, hf_oracle, hf_tokenizer, tmp_path):
    hf_oracle.save_pretrained(tmp_path)
    hf_tokenizer.save_pretrained(tmp_path)
    model = load_model(tmp_path, dtype=torch.float32)
    ref = loaded_model.config
    cfg = model.config
    for field in ("architecture", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "rope_theta", "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(cfg, field) == getattr(ref, field), field
    assert math.isclose(cfg.rms_norm_eps, ref.rms_norm_eps, rel_tol=1e-6)
    assert 2 in cfg.eos_token_ids
    assert set(model.weights) == set(loaded_model.weights)
    for name, tensor in model.weights.items():
        assert torch.equal(tensor, loaded_model.weights[name]), name
    text = "Hello, world! <|im_start|>user\nsum 12 + 7"
    assert model.tokenizer.encode(text) == hf_tokenizer.encode(text)


# ---- tiny Hugging Face directories -------------------------------------------------------------


def _save_tiny_tokenizer(directory, vocab_size: int) -> None:
    """A byte-level tokenizer (256 byte pieces, no merges) plus eos, written as tokenizer.json."""
    byte_pieces = list(pre_tokenizers.ByteLevel.alphabet())
    vocab = {piece: i for i, piece in enumerate(sorted(byte_pieces))}
    vocab["</s>"] = len(vocab)
    assert len(vocab) <= vocab_size
    tok = BackendTokenizer(models.BPE(vocab, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "add_bos_token": False}))


def _tiny_hf_dir(tmp_path, config, max_shard_size=None):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    for p in model.parameters():  # norms start at exactly 1: randomize so a mix-up would show
        torch.nn.init.normal_(p, std=0.5)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(tmp_path, **kwargs)
    _save_tiny_tokenizer(tmp_path, config.vocab_size)
    return model.state_dict()


_TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def _assert_same_weights(loaded, state_dict, tied):
    expected = {k: v for k, v in state_dict.items() if not (tied and k == "lm_head.weight")}
    assert set(loaded.weights) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(loaded.weights[name], tensor), name


def test_tiny_qwen2_with_bias_sharded(tmp_path):
    import transformers

    sd = _tiny_hf_dir(tmp_path, transformers.Qwen2Config(**_TINY, tie_word_embeddings=True, eos_token_id=256),
                      max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    loaded = load_model(tmp_path)
    cfg = loaded.config
    assert cfg.architecture == "qwen2" and cfg.attention_bias and not cfg.qk_norm and cfg.tie_word_embeddings
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.num_layers) == (16, 2, 2)
    assert cfg.eos_token_ids == (256,)
    assert loaded.weights["model.layers.1.self_attn.k_proj.bias"].shape == (32,)
    _assert_same_weights(loaded, sd, tied=True)


def test_tiny_qwen3_qk_norm_explicit_head_dim_rope_scaling(tmp_path):
    import transformers

    config = transformers.Qwen3Config(**_TINY, head_dim=32, tie_word_embeddings=False, rope_theta=1e6,
                                      rope_scaling={"rope_type": "linear", "factor": 2.0})
    sd = _tiny_hf_dir(tmp_path, config)
    loaded = load_model(tmp_path)
    cfg = loaded.config
    assert cfg.architecture == "qwen3" and cfg.qk_norm and not cfg.attention_bias
    assert cfg.head_dim == 32 and cfg.num_heads * cfg.head_dim == 128 != cfg.hidden_size
    assert cfg.rope_theta == 1e6 and cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert loaded.weights["model.layers.0.self_attn.q_norm.weight"].shape == (32,)
    assert loaded.weights["model.layers.0.self_attn.q_proj.weight"].shape == (128, 64)
    _assert_same_weights(loaded, sd, tied=False)


def test_tiny_mistral(tmp_path):
    import transformers

    sd = _tiny_hf_dir(tmp_path, transformers.MistralConfig(**_TINY, sliding_window=None))
    loaded = load_model(tmp_path)
    assert loaded.config.architecture == "mistral" and not loaded.config.tie_word_embeddings
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("héllo")) == "héllo"
    _assert_same_weights(loaded, sd, tied=False)
    as_bf16 = load_model(tmp_path, dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in as_bf16.weights.values())
    assert torch.equal(as_bf16.weights["model.norm.weight"], sd["model.norm.weight"].to(torch.bfloat16))


def test_mistral_sliding_window_is_rejected(tmp_path):
    import transformers

    _tiny_hf_dir(tmp_path, transformers.MistralConfig(**_TINY, sliding_window=128))
    with pytest.raises(UnsupportedArchitectureError, match="sliding attention window"):
        load_model(tmp_path)


def test_missing_misshapen_and_unexpected_tensors_are_named(tmp_path):
    import transformers
    from safetensors.torch import load_file, save_file

    _tiny_hf_dir(tmp_path, transformers.LlamaConfig(**_TINY))
    tensors = {k: v.clone() for k, v in load_file(str(tmp_path / "model.safetensors")).items()}  # unmap
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_model(tmp_path)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(96, 63)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"up_proj\.weight' has shape \[96, 63\], expected \[96, 64\]"):
        load_model(tmp_path)
    tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(96, 64)
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.extra_proj\.weight'"):
        load_model(tmp_path)


# ---- synthetic GGUF files ----------------------------------------------------------------------


def _write_gguf(path, arch, tensors=None, kv=None, tokenizer=True):
    """Write a GGUF file: ``tensors`` {gguf name: fp32 array in HF orientation}, ``kv`` {key: value}."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (kv or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    if tokenizer:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt2")
        writer.add_token_list(sorted(pre_tokenizers.ByteLevel.alphabet()))
        writer.add_token_merges([])
        writer.add_eos_token_id(0)
    for name, array in (tensors or {}).items():
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tiny_gguf_tensors(arch, hidden=32, heads=4, kv_heads=2, head_dim=8, inter=48, vocab=256, layers=1):
    rng = np.random.default_rng(0)

    def normal(shape):
        return rng.normal(size=shape).astype(np.float32)

    out = {"token_embd.weight": normal((vocab, hidden)), "output_norm.weight": normal(hidden)}
    for i in range(layers):
        shapes = {"attn_norm.weight": (hidden,), "ffn_norm.weight": (hidden,),
                  "attn_q.weight": (heads * head_dim, hidden), "attn_k.weight": (kv_heads * head_dim, hidden),
                  "attn_v.weight": (kv_heads * head_dim, hidden), "attn_output.weight": (hidden, heads * head_dim),
                  "ffn_gate.weight": (inter, hidden), "ffn_up.weight": (inter, hidden),
                  "ffn_down.weight": (hidden, inter)}
        if arch == "qwen2":
            shapes |= {"attn_q.bias": (heads * head_dim,), "attn_k.bias": (kv_heads * head_dim,),
                       "attn_v.bias": (kv_heads * head_dim,)}
        if arch == "qwen3":
            shapes |= {"attn_q_norm.weight": (head_dim,), "attn_k_norm.weight": (head_dim,)}
        out |= {f"blk.{i}.{k}": normal(s) for k, s in shapes.items()}
    kv = {f"{arch}.block_count": layers, f"{arch}.embedding_length": hidden, f"{arch}.feed_forward_length": inter,
          f"{arch}.attention.head_count": heads, f"{arch}.attention.head_count_kv": kv_heads,
          f"{arch}.attention.key_length": head_dim, f"{arch}.attention.value_length": head_dim,
          f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, f"{arch}.rope.freq_base": 1000000.0,
          f"{arch}.context_length": 4096}
    return out, kv


def _llama_cpp_permute(w, n_head):
    """llama.cpp's converter permutation (HF rotate-half rows -> interleaved rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_gguf_qwen_tensors_are_not_permuted(tmp_path, arch):
    tensors, kv = _tiny_gguf_tensors(arch)
    _write_gguf(tmp_path / "m.gguf", arch, tensors, kv)
    config, weights, _ = load_gguf(tmp_path / "m.gguf")
    assert config.architecture == arch and config.head_dim == 8 and config.hidden_size == 32
    assert config.attention_bias == (arch == "qwen2") and config.qk_norm == (arch == "qwen3")
    assert config.rope_theta == 1e6 and config.rms_norm_eps == 1e-6 and config.tie_word_embeddings
    for ours, theirs in [("q_proj", "attn_q"), ("k_proj", "attn_k")]:
        loaded = weights[f"model.layers.0.self_attn.{ours}.weight"].numpy()
        assert np.array_equal(loaded, tensors[f"blk.0.{theirs}.weight"])
    assert set(weights) == set(expected_weight_shapes(config))


def test_gguf_llama_unpermutes_q_k_and_reads_llama3_rope_freqs(tmp_path):
    tensors, kv = _tiny_gguf_tensors("llama", head_dim=64)
    q_hf, k_hf = tensors["blk.0.attn_q.weight"], tensors["blk.0.attn_k.weight"]
    tensors["blk.0.attn_q.weight"] = _llama_cpp_permute(q_hf, 4)
    tensors["blk.0.attn_k.weight"] = _llama_cpp_permute(k_hf, 2)
    # Llama 3.1 style rope scaling, as llama.cpp's converter stores it (per-frequency divisors).
    head_dim, theta, factor, low, high, orig = 64, 500000.0, 8.0, 1.0, 4.0, 8192
    inv_freq = theta ** (-np.arange(0, head_dim, 2) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    smooth = (orig / wavelen - low) / (high - low)
    divisors = np.where(wavelen < orig / high, 1.0,
                        np.where(wavelen > orig / low, factor, 1 / ((1 - smooth) / factor + smooth)))
    assert ((divisors > 1) & (divisors < factor)).sum() >= 2
    tensors["rope_freqs.weight"] = divisors
    tensors["output.weight"] = np.ones((256, 32))
    kv |= {"general.name": "Tiny Mistral", "llama.rope.freq_base": theta}
    _write_gguf(tmp_path / "m.gguf", "llama", tensors, kv)
    config, weights, _ = load_gguf(tmp_path / "m.gguf")
    assert np.array_equal(weights["model.layers.0.self_attn.q_proj.weight"].numpy(), q_hf)
    assert np.array_equal(weights["model.layers.0.self_attn.k_proj.weight"].numpy(), k_hf)
    assert config.architecture == "mistral" and not config.tie_word_embeddings
    scaling = config.rope_scaling
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == factor and scaling["low_freq_factor"] == low
    assert scaling["high_freq_factor"] == pytest.approx(high, rel=1e-3)
    assert scaling["original_max_position_embeddings"] == orig
    assert "rope_freqs.weight" not in weights


def test_gguf_yarn_rope_scaling_metadata(tmp_path):
    tensors, kv = _tiny_gguf_tensors("qwen2")
    kv |= {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
           "qwen2.rope.scaling.original_context_length": 1024}
    _write_gguf(tmp_path / "m.gguf", "qwen2", tensors, kv)
    config, _, _ = load_gguf(tmp_path / "m.gguf")
    assert config.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


# ---- bad input ---------------------------------------------------------------------------------


def test_nonexistent_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist.*nope.gguf"):
        load_model(tmp_path / "nope.gguf")


def test_empty_gguf(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty"):
        load_model(tmp_path / "empty.gguf")


def test_truncated_gguf(tmp_path, gguf_path):
    data = gguf_path.read_bytes()
    (tmp_path / "half.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        load_model(tmp_path / "half.gguf")


def test_random_bytes_gguf(tmp_path):
    (tmp_path / "noise.gguf").write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(ModelLoadError, match="not a readable GGUF"):
        load_model(tmp_path / "noise.gguf")


def test_unsupported_gguf_architecture(tmp_path):
    _write_gguf(tmp_path / "gpt2.gguf", "gpt2", {"token_embd.weight": np.zeros((4, 4))}, {"gpt2.block_count": 1})
    with pytest.raises(UnsupportedArchitectureError, match="'gpt2'.*llama, qwen2, qwen3"):
        load_model(tmp_path / "gpt2.gguf")


def test_unsupported_config_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(UnsupportedArchitectureError, match="'bert'.*llama, mistral, qwen2, qwen3"):
        load_model(tmp_path)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)
