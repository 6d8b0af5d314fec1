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
        self.fast = _FastWeights([linear.weight], self.gemm_dtype, gemm_plan)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fast(x)


class FusedLinear(nn.Module):
    """Several bias-free linears over the same input as one matmul (serving): the output is
    their outputs side by side, in the order given. It owns no parameters (the linears keep
    theirs, and the state dict its names), so a checkpoint reads the same. On the 2-core CPU,
    right after a target step (the caches cold), q, k and v of an 8-row block took ~260 us as
    three calls and ~90 us as one, gate and up ~230 against ~160, and the context's keys and
    values of both draft layers ~310 against ~80: each call's fixed part, not its bytes."""

    def __init__(self, linears: list[nn.Module], gemm_dtype: torch.dtype | None = None, gemm_plan=None):
        super().__init__()
        weights = [linear.weight for linear in linears]
        if any(getattr(linear, "bias", None) is not None for linear in linears):
            raise ValueError("FusedLinear joins bias-free layers only")
        self.sizes = [w.shape[0] for w in weights]
        self.fast = _FastWeights(weights, gemm_dtype or weights[0].dtype, gemm_plan)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x: [..., K]`` -> one ``[..., N_i]`` per joined linear."""
        return self.fast(x).split(self.sizes, dim=-1)


class _FastWeights:
    """The matmul of ``weights`` stacked along their outputs (``[sum N_i, K]``): without autograd
    through a ``Linear`` on a copy in ``gemm_dtype``, rebuilt whenever a weight changed in place
    (its version counter moved); with autograd ``F.linear`` on the weights themselves (exact)."""

    def __init__(self, weights: list[torch.Tensor], gemm_dtype: torch.dtype, gemm_plan):
        self.weights = weights
        self.gemm_dtype = gemm_dtype
        self.gemm_plan = gemm_plan
        self.linear: Linear | None = None
        self._versions: tuple[int, ...] = ()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.weights
        if torch.is_grad_enabled() and any(w.requires_grad for w in weights):
            return F.linear(x, weights[0] if len(weights) == 1 else torch.cat(weights))
        versions = tuple(w._version for w in weights)
        if self.linear is None or versions != self._versions:
            stacked = torch.cat([w.detach() for w in weights]) if len(weights) > 1 else weights[0].detach()
            self.linear = Linear(stacked.to(self.gemm_dtype), plan=self.gemm_plan)
            self._versions = versions
        out = self.linear(x.reshape(-1, x.shape[-1]))
        return out.view(*x.shape[:-1], out.shape[-1])


def pack_linears(module: nn.Module, gemm_dtype: torch.dtype | None = None, gemm_plan=None) -> None:
    """Replaces every bias-free ``nn.Linear`` inside ``module`` by a ``PackedLinear`` (in place;
    the state dict's names and tensors stay the same), and joins the projections that read the
    same input (``fuse``: a draft layer's q / k / v and gate / up)."""
    for child in list(module.modules()):
        fuse = getattr(child, "fuse", None)
        if fuse is not None:
            fuse(gemm_dtype, gemm_plan)
    _pack(module, gemm_dtype, gemm_plan)


def _pack(module: nn.Module, gemm_dtype, gemm_plan) -> None:
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and child.bias is None:
            setattr(module, name, PackedLinear(child, gemm_dtype, gemm_plan))
        else:
            _pack(child, gemm_dtype, gemm_plan)


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
        self.qkv: FusedLinear | None = None  # serving: q, k and v in one matmul (``fuse``)

    def fuse(self, gemm_dtype: torch.dtype | None = None, gemm_plan=None) -> None:
        self.qkv = FusedLinear([self.q_proj, self.k_proj, self.v_proj], gemm_dtype, gemm_plan)

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ctx: [..., H]`` projected target features -> rotated ``k, v: [..., kv_heads, head_dim]``.
        Depends on the context alone, so inference caches it per request."""
        return self.rotated_kv(self.k_proj(ctx), self.v_proj(ctx), cos, sin)

    def rotated_kv(self, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The projections ``k, v: [..., kv_heads * head_dim]`` -> normed, rotated keys and the
        values, each ``[..., kv_heads, head_dim]``."""
        shape = (*k.shape[:-1], self.cfg.num_kv_heads, self.cfg.head_dim)
        return apply_rope(self.k_norm(k.view(shape)), cos, sin), v.view(shape)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask) -> torch.Tensor:
        """``x: [B, S, H]``, ``cos, sin: [B, S, head_dim]``, ``ctx_k, ctx_v: [G, C, kv_heads,
        head_dim]``, ``mask: [G, Q, C + Q]`` -> ``[B, S, H]``."""
        cfg = self.cfg
        blocks, size = x.shape[:2]
        groups = ctx_k.shape[0]
        hd = cfg.head_dim
        q, k, v = self.qkv(x) if self.qkv is not None else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q = apply_rope(self.q_norm(q.view(blocks, size, cfg.num_heads, hd)), cos, sin)
        k, v = self.rotated_kv(k, v, cos, sin)  # the block's own keys, same projection as the context's
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
        self.gate_up: FusedLinear | None = None  # serving: gate and up in one matmul (``fuse``)

    def fuse(self, gemm_dtype: torch.dtype | None = None, gemm_plan=None) -> None:
        self.gate_up = FusedLinear([self.gate_proj, self.up_proj], gemm_dtype, gemm_plan)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x) if self.gate_up is not None else (self.gate_proj(x), self.up_proj(x))
        return self.down_proj(F.silu(gate) * up)


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
