"""benchmarks/gpu_decode.py, on CPU: its SmolLM2 shape is the default model's, the exported
tokenizer is the GGUF's, and a random-weight directory it writes decodes identically in our
engine and in transformers (the oracle), so the GPU figures compare the same model."""

import pytest
import torch

from benchmarks import gpu_decode

TINY = {**gpu_decode.SMOLLM2_COMMON, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def tokenizer_dir(gguf_path, tmp_path_factory):
    return gpu_decode.export_tokenizer(gguf_path, tmp_path_factory.mktemp("tokenizer"))


def test_the_135m_shape_is_the_default_models(loaded_model):
    cfg, shape = loaded_model.config, gpu_decode.SHAPES["smollm2-135m"]
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads,
            cfg.vocab_size, cfg.rope_theta, cfg.tie_word_embeddings, cfg.max_position_embeddings) == (
        shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"], shape["num_attention_heads"],
        shape["num_key_value_heads"], shape["vocab_size"], shape["rope_theta"], shape["tie_word_embeddings"],
        shape["max_position_embeddings"])
    from services.decoder.model.loader import expected_weight_shapes
    from services.decoder.model.safetensors_loader import config_from_hf

    assert expected_weight_shapes(config_from_hf(shape)) == expected_weight_shapes(cfg)


def test_the_exported_tokenizer_is_the_ggufs(loaded_model, tokenizer_dir):
    from services.decoder.model.tokenizer import Tokenizer

    exported = Tokenizer.from_pretrained_dir(tokenizer_dir)
    text = "Hello world! def f(x):\n    return x ** 2  # ünïcode"
    assert exported.encode(text) == loaded_model.tokenizer.encode(text)
    assert exported.eos_token_ids[0] == loaded_model.tokenizer.eos_token_ids[0]
    chat = [{"role": "user", "content": "hi"}]
    assert exported.apply_chat_template(chat) == loaded_model.tokenizer.apply_chat_template(chat)


def test_a_random_model_decodes_the_same_in_our_engine_and_transformers(tokenizer_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    # std 0.2: logits far enough apart that fp32 summation order cannot flip a greedy token
    model_dir = gpu_decode.write_random_model(TINY, tokenizer_dir, tmp_path / "tiny", torch.float32, seed=3, std=0.2)
    prompt = list(range(100, 140))
    ours = gpu_decode.greedy_tokens(model_dir, "cpu", [prompt], 12)[0]
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref
    figures = gpu_decode.bench_shape(model_dir, "cpu", "float32", decode_tokens=6, concurrency=[2],
                                     skip_transformers=False)
    ours_b1 = figures["ours"]["batch1_prompt128_tokens_per_s"]
    assert ours_b1 > 0 and figures["ours"]["concurrent2_aggregate_decode_tokens_per_s"] > 0
    assert figures["ratios"]["batch1_vs_transformers"] == pytest.approx(
        ours_b1 / figures["transformers"]["batch1_prompt128_tokens_per_s"])
