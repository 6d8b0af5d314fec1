"""Read a Hugging Face model directory: ``config.json`` + ``*.safetensors`` (one file, or shards
listed by ``model.safetensors.index.json``) -> (ModelConfig, HF-named tensors).

Supported ``model_type``: llama, mistral, qwen2 (q/k/v bias), qwen3 (q/k RMSNorm, explicit
``head_dim``). Both the transformers 4.x config layout (``rope_theta``, ``rope_scaling``) and the
5.x one (``rope_parameters``) are understood. Features this runtime does not implement are
rejected with ``UnsupportedArchitectureError`` rather than silently ignored: an output-projection
or MLP bias, a sliding attention window shorter than the context, per-layer differences.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch

from services.decoder.model.config import SUPPORTED_ARCHITECTURES, ModelConfig
from services.decoder.model.errors import ModelLoadError, UnsupportedArchitectureError

INDEX_FILE = "model.safetensors.index.json"
# Buffers some old checkpoints carry that are recomputed at run time, not weights.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def read_config_json(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{directory} has no config.json (not a Hugging Face model directory)")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path} does not hold a JSON object")
    return cfg


def _rope(cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, HF rope_scaling dict or None) from a 4.x or 5.x config."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta = cfg.get("rope_theta")
    if isinstance(params, dict):
        if "rope_theta" in params:
            theta = params["rope_theta"]
        if params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict):
        scaling = dict(scaling)
        if "rope_type" not in scaling and "type" in scaling:
            scaling["rope_type"] = scaling.pop("type")
        if scaling.get("rope_type") == "default":
            scaling = None
    elif scaling is not None:
        raise ModelLoadError(f"rope_scaling must be a JSON object, got {scaling!r}")
    return float(10000.0 if theta is None else theta), scaling


def config_from_hf(cfg: dict, name: str = "") -> ModelConfig:
    """``ModelConfig`` from a parsed ``config.json``. Raises ``UnsupportedArchitectureError`` for
    other model types or unimplemented features, ``ModelLoadError`` for missing fields."""
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )

    def need(key):
        if cfg.get(key) is None:
            raise ModelLoadError(f"config.json of this {model_type} model lacks {key!r}")
        return cfg[key]

    hidden = int(need("hidden_size"))
    num_heads = int(need("num_attention_heads"))
    num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
    head_dim = int(cfg.get("head_dim") or hidden // num_heads)
    max_pos = int(cfg.get("max_position_embeddings") or 2048)

    if cfg.get("mlp_bias"):
        raise UnsupportedArchitectureError(f"{model_type} with mlp_bias=true is not supported")
    # Qwen2 always has q/k/v bias (no o bias). For llama/mistral/qwen3 attention_bias also adds an
    # o_proj bias, which this runtime does not implement.
    if model_type != "qwen2" and cfg.get("attention_bias"):
        raise UnsupportedArchitectureError(f"{model_type} with attention_bias=true is not supported")
    window = cfg.get("sliding_window")
    window_on = cfg.get("use_sliding_window", model_type == "mistral")
    if window_on and window is not None and int(window) < max_pos:
        raise UnsupportedArchitectureError(
            f"{model_type} with a {window}-token sliding attention window (< {max_pos} context) "
            "is not supported"
        )
    if cfg.get("layer_types") and len(set(cfg["layer_types"])) > 1:
        raise UnsupportedArchitectureError(f"mixed layer_types {sorted(set(cfg['layer_types']))} are not supported")
    if cfg.get("pretraining_tp", 1) not in (1, None):
        raise UnsupportedArchitectureError("pretraining_tp > 1 is not supported")

    rope_theta, rope_scaling = _rope(cfg)
    eos = cfg.get("eos_token_id")
    eos_ids = tuple(int(i) for i in (eos if isinstance(eos, list) else [] if eos is None else [eos]))
    return ModelConfig(
        architecture=model_type,
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        rope_theta=rope_theta,
        rms_norm_eps=float(cfg.get("rms_norm_eps") or 1e-6),
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        rope_scaling=rope_scaling,
        bos_token_id=cfg.get("bos_token_id") if isinstance(cfg.get("bos_token_id"), int) else None,
        eos_token_ids=eos_ids,
        name=name or str(cfg.get("_name_or_path") or ""),
    )


def _shard_files(directory: Path) -> list[Path]:
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = [directory / f for f in dict.fromkeys(weight_map.values())]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{index} lists shards that do not exist: {missing}")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory} has no *.safetensors weight files")
    return files


def load_safetensors_weights(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of the directory's safetensors files, by name, in their stored dtype."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for shard in _shard_files(directory):
        try:
            tensors = load_file(str(shard), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelLoadError(f"{shard} is not a readable safetensors file (truncated or corrupt?): {exc}") from exc
        for name, tensor in tensors.items():
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name in weights:
                raise ModelLoadError(f"tensor {name!r} appears in more than one shard ({shard.name})")
            weights[name] = tensor
    return weights


def load_safetensors_dir(directory: str | os.PathLike) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(ModelConfig, HF-named tensors in stored dtype) for a Hugging Face model directory.

    ``config.eos_token_ids`` holds ``config.json``'s and ``generation_config.json``'s eos ids; the
    tokenizer adds its own in ``loader.load_model``.
    """
    directory = Path(directory)
    config = config_from_hf(read_config_json(directory), name=directory.name)
    gen_path = directory / "generation_config.json"
    if gen_path.is_file():
        try:
            gen_eos = json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"{gen_path} is not valid JSON: {exc}") from exc
        extra = gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
        config = replace(config, eos_token_ids=tuple(dict.fromkeys([*config.eos_token_ids, *map(int, extra)])))
    weights = load_safetensors_weights(directory)
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)  # some exporters write the tied copy too
    return config, weights
