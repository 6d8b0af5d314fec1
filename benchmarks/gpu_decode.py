"""End-to-end decode on a GPU: our engine vs transformers on the same weights, one run.

No model file reaches a lent GPU machine (the working tree that travels is capped at 64 MiB; the
default GGUF is 98 MB), so the model is built there: the real SmolLM2 architectures (135M and
1.7B; both use the 49,152-token tokenizer) with seeded random weights (normal, std 0.02; norms 1),
written as a Hugging Face directory that both engines load. Decode speed does not depend on the
weights' values (generation ignores EOS). The tokenizer is the real one, exported beforehand from
the default GGUF (``python -m benchmarks.gpu_decode --export-tokenizer .device/tokenizer`` on a
machine that has the model; ``scripts/device_prep.sh`` does it) and carried along.

Per shape and dtype: our batch-1 decode tok/s (128-token prompt), our aggregate decode tok/s with
8 and 64 concurrent requests, transformers' batch-1 and batch-8 decode tok/s on the same
directory, and the bandwidth bound (measured device read bandwidth / weight bytes per step).
Agreement: our GPU greedy tokens vs our CPU greedy tokens on the 135M fp32 model (same weights),
recorded (fp32 reductions run in another order on the GPU; a flip on a near-tie is possible).
Writes ``<out>/gpu_decode.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

from benchmarks.decode import (
    _prompts,
    bench_ours,
    bench_ours_concurrent,
    bench_transformers,
)
from benchmarks.machine import (
    machine_info,
    measured_read_bandwidth_bytes_per_s,
    write_json,
)
from benchmarks.progress import echo

# config.json of HuggingFaceTB/SmolLM2-135M-Instruct and SmolLM2-1.7B-Instruct (Hugging Face hub);
# the 135M one is checked against the default GGUF's metadata in tests/benchmarks/test_gpu_decode.py
SMOLLM2_COMMON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                  "vocab_size": 49152, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
                  "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "attention_bias": False,
                  "mlp_bias": False}
SHAPES = {
    "smollm2-135m": {**SMOLLM2_COMMON, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "rope_theta": 100000.0},
    "smollm2-1.7b": {**SMOLLM2_COMMON, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
                     "num_attention_heads": 32, "num_key_value_heads": 32, "rope_theta": 130000.0},
}
WEIGHT_STD = 0.02  # the initializer_range of both configs
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def export_tokenizer(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Writes the GGUF's tokenizer as ``tokenizer.json`` + ``tokenizer_config.json``."""
    from services.decoder.model.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(gguf_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.backend.save(str(out / "tokenizer.json"))
    cfg = {"add_bos_token": tok.add_bos_token, "add_eos_token": False, "chat_template": tok.chat_template,
           "bos_token": tok.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None else None,
           "eos_token": tok.id_to_token(tok.eos_token_ids[0]) if tok.eos_token_ids else None}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return out


def write_random_model(cfg: dict, tokenizer_dir: str | Path, out_dir: str | Path, dtype: torch.dtype,
                       seed: int = 0, std: float = WEIGHT_STD) -> Path:
    """A Hugging Face directory: ``cfg`` as config.json, the tokenizer files, and seeded random
    weights (norm weights 1, every matrix normal with ``std``) in ``dtype``."""
    from safetensors.torch import save_file

    from services.decoder.model.loader import expected_weight_shapes
    from services.decoder.model.safetensors_loader import config_from_hf

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in expected_weight_shapes(config_from_hf(cfg)).items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, dtype=dtype)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * std).to(dtype)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps({**cfg, "torch_dtype": str(dtype).removeprefix("torch.")}, indent=1))
    for name in TOKENIZER_FILES:
        shutil.copy(Path(tokenizer_dir) / name, out / name)
    return out


def greedy_tokens(model_dir: Path, device: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from dhisparse import LLM, SamplingParams
    from services.decoder.model.loader import load_model

    llm = LLM(loaded=load_model(model_dir), device=device, kv_cache_tokens=4096, max_model_len=1024)
    return [o.token_ids for o in llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))]


def bench_shape(model_dir: Path, device: str, dtype_name: str, decode_tokens: int, concurrency: list[int],
                skip_transformers: bool) -> dict:
    """Our engine's and transformers' decode figures for one model directory on ``device``."""
    from dhisparse import LLM
    from services.decoder.config import DTYPES
    from services.decoder.model.loader import load_model

    dtype = DTYPES[dtype_name]
    loaded = load_model(model_dir, dtype=dtype)
    most = max(concurrency)
    max_len = 128 + decode_tokens + 32
    llm = LLM(loaded=loaded, dtype=dtype_name, device=device, max_num_seqs=most, max_num_batched_tokens=4096,
              kv_cache_tokens=most * max_len, max_model_len=max_len)
    weight_bytes = llm.engine.model.weight_bytes_per_step
    short = _prompts(llm.tokenizer, 1, 128)[0]
    batch8 = _prompts(llm.tokenizer, 8, 128)  # equal lengths: transformers decodes them unpadded
    bench_ours(llm, short, 8, 1)  # warm-up
    ours = {"batch1_prompt128_tokens_per_s": bench_ours(llm, short, decode_tokens, 2)}
    for count in concurrency:
        figures = bench_ours_concurrent(llm, _prompts(llm.tokenizer, count, 128), decode_tokens)
        ours[f"concurrent{count}_aggregate_decode_tokens_per_s"] = figures["aggregate_decode_tokens_per_s"]
    del llm, loaded
    peer = {}
    if not skip_transformers:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval().to(device)
        peer = {"batch1_prompt128_tokens_per_s": bench_transformers(hf, [short], decode_tokens, 2),
                "batch8_decode_tokens_per_s": bench_transformers(hf, batch8, decode_tokens, 1)}
        del hf
    bound = measured_read_bandwidth_bytes_per_s(device) / weight_bytes
    ratios = {"batch1_vs_transformers": ours["batch1_prompt128_tokens_per_s"] / peer["batch1_prompt128_tokens_per_s"]
              if peer else None,
              "batch1_fraction_of_bandwidth_bound": ours["batch1_prompt128_tokens_per_s"] / bound}
    return {"dtype": dtype_name, "weight_bytes_per_step": weight_bytes, "bandwidth_bound_tokens_per_s": bound,
            "ours": ours, "transformers": peer, "ratios": ratios}


def run(args: argparse.Namespace) -> dict:
    runs = [(shape, dtype) for shape in args.shapes.split(",") for dtype in args.dtypes.split(",")]
    result = {"benchmark": "gpu_decode", "machine": machine_info(), "device": args.device,
              "model": "SmolLM2 architectures with seeded random weights (see the module docstring)",
              "settings": {"decode_tokens": args.decode_tokens, "concurrency": args.concurrency,
                           "weight_std": WEIGHT_STD, "seed": args.seed},
              "shapes": {name: SHAPES[name] for name in args.shapes.split(",")}, "runs": [], "agreement": None}
    from services.decoder.config import DTYPES

    with tempfile.TemporaryDirectory(prefix="gpu-decode-") as tmp:
        for shape, dtype in runs:
            model_dir = write_random_model(SHAPES[shape], args.tokenizer_dir, Path(tmp) / f"{shape}-{dtype}",
                                           DTYPES[dtype], args.seed)
            figures = bench_shape(model_dir, args.device, dtype, args.decode_tokens,
                                  [int(c) for c in args.concurrency.split(",")], args.skip_transformers)
            result["runs"].append({"shape": shape, **figures})
            echo(f"{shape} {dtype}: ours {figures['ours']}  transformers {figures['transformers']}")
            shutil.rmtree(model_dir)  # one model on disk at a time
        if args.agreement:
            small = write_random_model(SHAPES["smollm2-135m"], args.tokenizer_dir, Path(tmp) / "agree",
                                       torch.float32, args.seed)
            from services.decoder.model.tokenizer import Tokenizer

            tok = Tokenizer.from_pretrained_dir(small)
            prompts = [tok.encode(text) for text in ("The capital of France is", "def fib(n):\n    return",
                                                       "One, two, three, four,")]
            on_device = greedy_tokens(small, args.device, prompts, 32)
            on_cpu = greedy_tokens(small, "cpu", prompts, 32)
            same = sum(a == b for x, y in zip(on_device, on_cpu) for a, b in zip(x, y))
            result["agreement"] = {"prompts": len(prompts), "tokens": sum(map(len, on_cpu)), "equal_tokens": same,
                                   "identical_sequences": on_device == on_cpu}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "gpu_decode.json", result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_decode", description=__doc__.split("\n")[0])
    parser.add_argument("--export-tokenizer", metavar="DIR", default=None,
                        help="only write the default model's tokenizer files to DIR (run where the model is)")
    parser.add_argument("--tokenizer-dir", default=".device/tokenizer")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="smollm2-135m,smollm2-1.7b")
    parser.add_argument("--dtypes", default="bfloat16")
    parser.add_argument("--concurrency", default="8,64")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--no-agreement", dest="agreement", action="store_false")
    parser.add_argument("--out", default="results/gpu")
    args = parser.parse_args(argv)
    if args.export_tokenizer:
        from services.decoder.model.model_store import resolve_model_path

        print(export_tokenizer(resolve_model_path(None), args.export_tokenizer))
        return 0
    for name in args.shapes.split(","):
        if name not in SHAPES:
            parser.error(f"unknown shape {name!r} (known: {', '.join(SHAPES)})")
    for name in TOKENIZER_FILES:
        if not (Path(args.tokenizer_dir) / name).is_file():
            parser.error(f"{args.tokenizer_dir}/{name} is missing: run --export-tokenizer {args.tokenizer_dir} "
                         "where the default model is (scripts/device_prep.sh)")
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
