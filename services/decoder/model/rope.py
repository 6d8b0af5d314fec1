"""Rotary position embedding (non-interleaved, Hugging Face "rotate half" convention).

Frequencies follow the rope_scaling configs that llama-family checkpoints use: none/default,
linear, dynamic (applied statically at the model's full context, as vLLM does, because cached
keys cannot be re-rotated), llama3 and yarn.
"""

from __future__ import annotations

import math

import torch

from services.decoder.model.config import ModelConfig


def _inv_freq_and_scale(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Returns ``inv_freq: [head_dim // 2]`` (float64) and the attention scaling factor that
    multiplies cos and sin (1.0 except for yarn)."""
    dim = config.head_dim
    base = config.rope_theta
    scaling = dict(config.rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    factor = float(scaling.get("factor", 1.0))
    exponent = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # [dim // 2]
    if rope_type == "dynamic":
        max_len = config.max_position_embeddings
        original = float(scaling.get("original_max_position_embeddings", max_len))
        base = base * ((factor * max_len / original) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base**exponent)
    if rope_type in ("default", "dynamic"):
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / factor, 1.0
    if rope_type == "llama3":
        low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
        high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
        original = float(scaling["original_max_position_embeddings"])
        low_freq_wavelen = original / low_freq_factor
        high_freq_wavelen = original / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled), 1.0
    if rope_type == "yarn":
        original = float(scaling.get("original_max_position_embeddings", config.max_position_embeddings))
        beta_fast = float(scaling.get("beta_fast", 32.0))
        beta_slow = float(scaling.get("beta_slow", 1.0))
        attention_factor = scaling.get("attention_factor")
        if attention_factor is None:
            attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

        def correction_dim(num_rotations: float) -> float:
            return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extrapolation_weight = 1 - ramp
        inv_freq = (inv_freq / factor) * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
        return inv_freq, float(attention_factor)
    raise ValueError(f"unsupported rope_scaling type {rope_type!r} (supported: default, linear, dynamic, llama3, yarn)")


class RotaryEmbedding:
    """Precomputed cos/sin tables ``[max_positions, head_dim // 2]`` applied by position index."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32, max_positions: int | None = None,
                 device: torch.device | str = "cpu"):
        inv_freq, scale = _inv_freq_and_scale(config)
        max_positions = max_positions or config.max_position_embeddings
        positions = torch.arange(max_positions, dtype=torch.float64)
        angles = torch.outer(positions, inv_freq)  # [max_positions, head_dim // 2]
        self.cos = (angles.cos() * scale).to(device=device, dtype=dtype)
        self.sin = (angles.sin() * scale).to(device=device, dtype=dtype)
        self.max_positions = max_positions

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-step tables for ``positions: [num_tokens]``, shared by every layer:
        ``cos_full = [cos, cos]`` and ``sin_signed = [-sin, sin]``, each ``[num_tokens, 1, head_dim]``."""
        cos = torch.index_select(self.cos, 0, positions)  # [num_tokens, head_dim // 2]
        sin = torch.index_select(self.sin, 0, positions)
        return torch.cat([cos, cos], dim=-1).unsqueeze(1), torch.cat([-sin, sin], dim=-1).unsqueeze(1)

    @staticmethod
    def rotate(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Returns ``x: [num_tokens, num_heads, head_dim]`` rotated: x * cos + rotate_half(x) * sin,
        with rotate_half(x) = [x2, x1] and the sign folded into ``sin_signed``."""
        cos_full, sin_signed = tables
        half = x.shape[-1] // 2
        swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
        return torch.addcmul(x * cos_full, swapped, sin_signed)

    def apply_(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotates ``x: [num_tokens, num_heads, head_dim]`` in place by ``positions: [num_tokens]``."""
        x.copy_(self.rotate(x, self.tables(positions)))
        return x
