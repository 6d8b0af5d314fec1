"""Triton sparse paged attention, split over the selection (flash-decoding style).

1. ``_partial_kernel``, one program per (query token, kv head, split). Split ``s`` owns entries
   ``[s * pages_per_split, (s + 1) * pages_per_split)`` of the token's selection. The program
   holds the GQA group of query heads of its kv head as a ``[BLOCK_G, BLOCK_D]`` tile (padded to
   16 rows for ``tl.dot``), walks its entries ``PAGES_PER_BLOCK`` pages at a time (each page's
   slot read from ``token_slots``; padding lanes and positions after ``token_pos`` masked) and
   writes its fp32 online-softmax state (running max ``m``, sum ``l``, unnormalised ``acc``).
2. ``_combine_kernel``, one program per (query token, query head), merges the splits in order.
The split boundaries depend only on ``pages_per_split``, never on the batch or ``max_sel``, and an
empty split contributes exactly zero, so a token's output is bitwise independent of its batch.

Numerics: fp32 inputs use fp32 dots (``input_precision="ieee"``, no TF32). bf16/fp16 inputs use
tensor-core dots with fp32 accumulation: q.k of two 16-bit values is exact in fp32, so scores equal
the cast-to-fp32 computation up to summation order; probabilities are split into a 16-bit high
part plus a 16-bit residual (two dots) so p.v keeps ~16 more mantissa bits than a plain cast.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _partial_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, page_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr,
    scale, max_sel, page_size, head_dim, group, num_heads, num_splits,
    stride_qt, stride_qh, stride_qd,
    stride_ks, stride_kt, stride_kh, stride_kd,
    stride_vs, stride_vt, stride_vh, stride_vd,
    stride_st, stride_ss, stride_pt, stride_ps,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, PAGE_PAD: tl.constexpr,
    PAGES_PER_BLOCK: tl.constexpr, PAGES_PER_SPLIT: tl.constexpr, LOW_PRECISION: tl.constexpr,
):
    tok = tl.program_id(0)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv * group + offs_g  # [BLOCK_G] query heads of this kv head
    mask_q = (offs_g[:, None] < group) & (offs_d[None, :] < head_dim)
    q_tile = tl.load(
        q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=mask_q, other=0.0,
    )  # [BLOCK_G, BLOCK_D]
    if not LOW_PRECISION:
        q_tile = q_tile.to(tl.float32)

    offs_n = tl.arange(0, PAGES_PER_BLOCK * PAGE_PAD)  # [BLOCK_N] key lane in the block
    lane_page = offs_n // PAGE_PAD
    lane_tok = offs_n % PAGE_PAD
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    split_start = split * PAGES_PER_SPLIT
    split_end = tl.minimum(split_start + PAGES_PER_SPLIT, max_sel)
    for sel0 in range(split_start, split_end, PAGES_PER_BLOCK):
        sel = sel0 + lane_page  # [BLOCK_N] index into the token's selection
        in_sel = sel < split_end
        slot = tl.load(slot_ptr + tok * stride_st + sel * stride_ss, mask=in_sel, other=-1).to(tl.int64)
        page = tl.load(page_ptr + tok * stride_pt + sel * stride_ps, mask=in_sel, other=0).to(tl.int64)
        key_pos = page * page_size + lane_tok
        visible = (slot >= 0) & (lane_tok < page_size) & (key_pos <= pos)  # [BLOCK_N]
        kv_mask = visible[:, None] & (offs_d[None, :] < head_dim)
        k_tile = tl.load(
            k_ptr + slot[:, None] * stride_ks + lane_tok[:, None] * stride_kt + kv * stride_kh
            + offs_d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        v_tile = tl.load(
            v_ptr + slot[:, None] * stride_vs + lane_tok[:, None] * stride_vt + kv * stride_vh
            + offs_d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        if LOW_PRECISION:
            scores = tl.dot(q_tile, tl.trans(k_tile)) * scale  # [BLOCK_G, BLOCK_N] fp32
        else:
            scores = tl.dot(q_tile, tl.trans(k_tile.to(tl.float32)), input_precision="ieee") * scale
        scores = tl.where(visible[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet
        alpha = tl.exp(m_i - m_safe)
        probs = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(probs, axis=1)
        if LOW_PRECISION:
            p_hi = probs.to(v_tile.dtype)
            p_lo = (probs - p_hi.to(tl.float32)).to(v_tile.dtype)
            pv = tl.dot(p_hi, v_tile) + tl.dot(p_lo, v_tile)
        else:
            pv = tl.dot(probs, v_tile.to(tl.float32), input_precision="ieee")
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    row = (tok * num_heads + heads) * num_splits + split  # [BLOCK_G] rows of [T, H, S]
    mask_g = offs_g < group
    tl.store(m_ptr + row, m_i, mask=mask_g)
    tl.store(l_ptr + row, l_i, mask=mask_g)
    tl.store(acc_ptr + row[:, None] * BLOCK_D + offs_d[None, :], acc, mask=mask_g[:, None])


@triton.jit
def _combine_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, num_splits, head_dim,
    stride_ot, stride_oh, stride_od,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    base = (tok * tl.num_programs(1) + head) * num_splits
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    m_run = tl.full((1,), float("-inf"), dtype=tl.float32)
    l_run = tl.zeros((1,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        in_s = s0 + offs_s < num_splits
        m_s = tl.load(m_ptr + base + s0 + offs_s, mask=in_s, other=float("-inf"))  # [BLOCK_S]
        l_s = tl.load(l_ptr + base + s0 + offs_s, mask=in_s, other=0.0)
        a_s = tl.load(acc_ptr + (base + s0 + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
                      mask=in_s[:, None], other=0.0)  # [BLOCK_S, BLOCK_D]
        m_new = tl.maximum(m_run, tl.max(m_s, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_run - m_safe)
        w = tl.exp(m_s - m_safe)  # [BLOCK_S]; an empty split (m = -inf) weighs exactly 0
        l_run = l_run * alpha + tl.sum(w * l_s, axis=0)
        acc = acc * alpha + tl.sum(w[:, None] * a_s, axis=0)
        m_run = m_new
    out = acc / tl.where(l_run > 0, l_run, 1.0)  # zeros when no key was visible
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + offs_d * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=offs_d < head_dim)


def _tensor_core_dots(dtype: torch.dtype) -> bool:
    """16-bit dots for 16-bit inputs. Not bf16 under ``TRITON_INTERPRET=1``: the interpreter's
    bf16 ``tl.dot`` returns garbage (triton 3.9: errors of 1e10 on a 16x16 product), so the CPU
    tests run bf16 through the fp32 dots; ``kernels.gpu_check`` checks the bf16 path on CUDA."""
    if dtype == torch.bfloat16:
        return os.environ.get("TRITON_INTERPRET") != "1"
    return dtype == torch.float16


def sparse_paged_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    token_slots: torch.Tensor,
    token_pages: torch.Tensor,
    token_pos: torch.Tensor,
    *,
    scale: float,
    page_size: int,
    pages_per_block: int = 4,
    pages_per_split: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """Launch the kernels; contract in ``kernels.sparse_paged_attention.api``.

    ``pages_per_block`` (a power of two) is the number of selected pages folded per loop step;
    ``pages_per_split`` (a multiple of it) the selection entries one program owns.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    max_sel = token_slots.shape[1]
    if num_tokens == 0:
        return out
    page_pad = triton.next_power_of_2(page_size)
    pages_per_block = max(pages_per_block, 16 // page_pad)  # tl.dot wants >= 16 key lanes
    pages_per_split = max(pages_per_block, pages_per_split // pages_per_block * pages_per_block)
    num_splits = max(1, triton.cdiv(max_sel, pages_per_split))
    block_d = max(16, triton.next_power_of_2(head_dim))
    part_m = torch.empty((num_tokens, num_heads, num_splits), dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((num_tokens, num_heads, num_splits, block_d), dtype=torch.float32, device=q.device)
    _partial_kernel[(num_tokens, num_kv_heads, num_splits)](
        q, k_pool, v_pool, token_slots, token_pages, token_pos.contiguous(), part_m, part_l, part_acc,
        float(scale), max_sel, page_size, head_dim, group, num_heads, num_splits,
        *q.stride(), *k_pool.stride(), *v_pool.stride(), *token_slots.stride(), *token_pages.stride(),
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, PAGE_PAD=page_pad,
        PAGES_PER_BLOCK=pages_per_block, PAGES_PER_SPLIT=pages_per_split,
        LOW_PRECISION=_tensor_core_dots(q.dtype), num_warps=num_warps,
    )
    _combine_kernel[(num_tokens, num_heads)](
        part_m, part_l, part_acc, out, num_splits, head_dim, *out.stride(),
        BLOCK_S=min(16, triton.next_power_of_2(num_splits)), BLOCK_D=block_d,
    )
    return out
