"""Torch modules of the draft network (parameter names follow z-lab's DFlash checkpoints).

A draft layer is a Qwen3-style block whose attention takes its queries from the block only
(the anchor token plus mask tokens) and its keys/values from the projected target features of
the context followed by the block itself; there is no causal mask inside the block. DFlash2's
grouped dynamic causal convolution, when configured, wraps the attention and the MLP.

Shapes: ``B`` blocks (requests at inference, sampled anchors in training) of ``S`` positions,
hidden ``H``; attention runs in ``G`` groups of ``Q`` queries (``G * Q == B * S``) over ``C``
context keys each, with a boolean mask ``[G, Q, C + Q]`` (True = visible).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.decoder.model.linear import Linear
from services.decoder.spec.dflash.config import DraftConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # in fp32 whatever ``x`` is (a bf16 autocast training forward's activations): the
        # statistics keep fp32's precision and the fused kernel gets one dtype (no-ops for fp32)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions: [...]`` -> ``cos, sin: [..., head_dim]`` ("rotate half" layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim))
    angles = positions.to(torch.float64)[..., None] * inv_freq  # [..., head_dim // 2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x: [..., heads, head_dim]``, ``cos, sin: [..., head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


class PackedLinear(nn.Module):
    """An ``nn.Linear`` (bias-free) for serving: same parameter name and tensor, but a call
    without autograd goes through the decoder's ``Linear`` (``model/linear.py``) with the kernel
    that ``gemm_plan`` (``model/gemm_plan.py``; None: the default kernel) picks for the call's
    rows: a block's 8 rows per request cost about what one row does, where plain sgemm may pay
    2-4x. The weight copies are rebuilt whenever the weight changed in place (its version counter moved), and
    a call that needs gradients takes ``F.linear``, so training through it stays exact.
    ``gemm_dtype`` (e.g. bf16): the fast path's copy of the weight is in that dtype, inputs are
    rounded to it and results come back in the input's dtype (model/linear.py)."""

    def __init__(self, linear: nn.Linear, gemm_dtype: torch.dtype | None = None, gemm_plan=None):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("PackedLinear wraps bias-free layers only")
        self.weight = linear.weight
        self.gemm_dtype = gemm_dtype or linear.weight.dtype
        self.gemm_plan = gemm_plan
        self._fast: Linear | None = None
        self._version = -1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:
            return F.linear(x, self.weight)
        if self._fast is None or self._version != self.weight._version:
            self._fast = Linear(self.weight.detach().to(self.gemm_dtype), plan=self.gemm_plan)
            self._version = self.weight._version
        return self._fast(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], self.weight.shape[0])


def pack_linears(module: nn.Module, gemm_dtype: torch.dtype | None = None, gemm_plan=None) -> None:
    """Replaces every bias-free ``nn.Linear`` inside ``module`` by a ``PackedLinear`` (in place;
    the state dict's names and tensors stay the same)."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(module, name, PackedLinear(child, gemm_dtype, gemm_plan))
        else:
            pack_linears(child, gemm_dtype, gemm_plan)


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ctx: [..., H]`` projected target features -> rotated ``k, v: [..., kv_heads, head_dim]``.
        Depends on the context alone, so inference caches it per request."""
        shape = (*ctx.shape[:-1], self.cfg.num_kv_heads, self.cfg.head_dim)
        k = apply_rope(self.k_norm(self.k_proj(ctx).view(shape)), cos, sin)
        return k, self.v_proj(ctx).view(shape)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        """``x: [B, S, H]``, ``cos, sin: [B, S, head_dim]``, ``ctx_k, ctx_v: [G, C, kv_heads,
        head_dim]``, ``mask: [G, Q, C + Q]`` -> ``[B, S, H]``."""
        cfg = self.cfg
        blocks, size = x.shape[:2]
        groups = ctx_k.shape[0]
        hd = cfg.head_dim
        q = apply_rope(self.q_norm(self.q_proj(x).view(blocks, size, cfg.num_heads, hd)), cos, sin)
        k, v = self.context_kv(x, cos, sin)  # the block's own keys, same projection as the context's
        q = q.reshape(groups, -1, cfg.num_heads, hd).transpose(1, 2)  # [G, heads, Q, hd]
        k = torch.cat([ctx_k, k.reshape(groups, -1, cfg.num_kv_heads, hd)], dim=1).transpose(1, 2)
        v = torch.cat([ctx_v, v.reshape(groups, -1, cfg.num_kv_heads, hd)], dim=1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(blocks, size, cfg.num_heads * hd))


class DynamicCausalConv(nn.Module):
    """DFlash2's grouped dynamic depthwise convolution along the block's positions: a static
    kernel ``base_kernel[stage]: [kernel, H]`` plus a per-position, per-group kernel projected
    from the hidden state, causal within the block (position ``i`` sees ``i - kernel + 1 .. i``).
    Stage 0 runs before the wrapped op (``prepare``), stage 1 after it (``finish``) with the
    dynamic kernel computed from the op's input."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.group_size = group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def _convolve(self, x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """``x: [B, S, H]``, ``dynamic: [B, S, kernel, groups]``, ``base: [kernel, H]``."""
        blocks, size, hidden = x.shape
        grouped = x.view(blocks, size, self.groups, self.group_size)
        out = torch.zeros_like(grouped)
        for shift in range(self.kernel_size):
            shifted = grouped if shift == 0 else F.pad(grouped[:, : size - shift], (0, 0, 0, 0, shift, 0))
            weight = base[shift].view(self.groups, self.group_size) + dynamic[:, :, shift, :, None]
            out = out + weight * shifted
        return out.view(blocks, size, hidden)

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dynamic = self.kernel_projection(x).view(*x.shape[:2], 2, self.kernel_size, self.groups)
        return self._convolve(x, dynamic[:, :, 0], self.base_kernel[0]), dynamic[:, :, 1]

    def finish(self, x: torch.Tensor, dynamic: torch.Tensor) -> torch.Tensor:
        return self._convolve(x, dynamic, self.base_kernel[1])


class MLP(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.self_attn = DraftAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attention_conv = self.mlp_conv = None
        if cfg.conv_kernel_size is not None:
            self.attention_conv = DynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = DynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    @staticmethod
    def _wrapped(conv: DynamicCausalConv | None, op, x: torch.Tensor) -> torch.Tensor:
        if conv is None:
            return op(x)
        x, dynamic = conv.prepare(x)
        return conv.finish(op(x), dynamic)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        """``x: [B, S, H]`` -> ``[B, S, H]``; the rest as in ``DraftAttention.forward``."""
        h = self.input_layernorm(x)
        x = x + self._wrapped(self.attention_conv, lambda t: self.self_attn(t, cos, sin, ctx_k, ctx_v, mask), h)
        h = self.post_attention_layernorm(x)
        return x + self._wrapped(self.mlp_conv, self.mlp, h)
