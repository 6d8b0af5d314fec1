"""Triton sparse paged attention: one program per (query token, kv head).

A program holds the whole GQA group of query heads of its kv head as a ``[BLOCK_G, BLOCK_D]``
tile (padded to 16 rows for ``tl.dot``) and walks the token's selected pages
``PAGES_PER_BLOCK`` at a time. Each step gathers ``PAGES_PER_BLOCK * PAGE_PAD`` keys (the page's
slot read from ``token_slots``; padding lanes and positions after ``token_pos`` masked),
and folds them into an fp32 online softmax. Dots use ``input_precision="ieee"`` (no TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _sparse_paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, page_ptr, pos_ptr, out_ptr,
    scale, max_sel, page_size, head_dim, group,
    stride_qt, stride_qh, stride_qd,
    stride_ks, stride_kt, stride_kh, stride_kd,
    stride_vs, stride_vt, stride_vh, stride_vd,
    stride_st, stride_ss, stride_pt, stride_ps,
    stride_ot, stride_oh, stride_od,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE_PAD: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr,
):
    tok = tl.program_id(0)
    kv = tl.program_id(1)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    heads = kv * group + offs_g  # [BLOCK_G] query heads of this kv head
    mask_q = (offs_g[:, None] < group) & (offs_d[None, :] < head_dim)
    q_tile = tl.load(
        q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=mask_q, other=0.0,
    ).to(tl.float32) * scale  # [BLOCK_G, BLOCK_D]

    offs_n = tl.arange(0, PAGES_PER_BLOCK * PAGE_PAD)  # [BLOCK_N] key lane in the block
    lane_page = offs_n // PAGE_PAD
    lane_tok = offs_n % PAGE_PAD
    m_i = tl.full((BLOCK_G,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    for sel0 in range(0, max_sel, PAGES_PER_BLOCK):
        sel = sel0 + lane_page  # [BLOCK_N] index into the token's selection
        in_sel = sel < max_sel
        slot = tl.load(slot_ptr + tok * stride_st + sel * stride_ss, mask=in_sel, other=-1).to(tl.int64)
        page = tl.load(page_ptr + tok * stride_pt + sel * stride_ps, mask=in_sel, other=0).to(tl.int64)
        key_pos = page * page_size + lane_tok
        visible = (slot >= 0) & (lane_tok < page_size) & (key_pos <= pos)  # [BLOCK_N]
        kv_mask = visible[:, None] & (offs_d[None, :] < head_dim)
        k_tile = tl.load(
            k_ptr + slot[:, None] * stride_ks + lane_tok[:, None] * stride_kt + kv * stride_kh
            + offs_d[None, :] * stride_kd,
            mask=kv_mask, other=0.0,
        ).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        scores = tl.dot(q_tile, tl.trans(k_tile), input_precision="ieee")  # [BLOCK_G, BLOCK_N]
        scores = tl.where(visible[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing visible yet
        alpha = tl.exp(m_i - m_safe)
        probs = tl.exp(scores - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(probs, axis=1)
        v_tile = tl.load(
            v_ptr + slot[:, None] * stride_vs + lane_tok[:, None] * stride_vt + kv * stride_vh
            + offs_d[None, :] * stride_vd,
            mask=kv_mask, other=0.0,
        ).to(tl.float32)  # [BLOCK_N, BLOCK_D]
        acc = acc * alpha[:, None] + tl.dot(probs, v_tile, input_precision="ieee")
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # zeros when no key was visible
    tl.store(
        out_ptr + tok * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty), mask=mask_q,
    )


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
) -> torch.Tensor:
    """Launch the kernel; contract in ``kernels.sparse_paged_attention.api``.

    ``pages_per_block`` (a power of two) is the number of selected pages folded per step.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    page_pad = triton.next_power_of_2(page_size)
    pages_per_block = max(pages_per_block, 16 // page_pad)  # tl.dot wants >= 16 key lanes
    grid = (num_tokens, num_kv_heads)
    _sparse_paged_attention_kernel[grid](
        q, k_pool, v_pool, token_slots, token_pages, token_pos.contiguous(), out,
        float(scale), token_slots.shape[1], page_size, head_dim, group,
        *q.stride(), *k_pool.stride(), *v_pool.stride(),
        *token_slots.stride(), *token_pages.stride(), *out.stride(),
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PAGE_PAD=page_pad,
        PAGES_PER_BLOCK=pages_per_block,
    )
    return out
