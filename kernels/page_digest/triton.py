"""Triton page digest: one program per (page, block of num_kv_heads*head_dim elements).

Each program loads the page's ``page_size`` tokens for its element block, reduces min and max
over tokens in fp32 (exact for fp16/bf16 inputs) and stores them in the digest dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _page_digest_kernel(
    k_ptr, slot_ptr, row_ptr, min_ptr, max_ptr,
    page_size, head_dim, num_elems,
    stride_ks, stride_kt, stride_kh, stride_kd,
    stride_mr, stride_mh, stride_md,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):
    page = tl.program_id(0)
    block = tl.program_id(1)
    slot = tl.load(slot_ptr + page).to(tl.int64)
    row = tl.load(row_ptr + page).to(tl.int64)
    if slot >= 0:
        offs_t = tl.arange(0, BLOCK_T)  # [BLOCK_T] token in page
        offs_e = block * BLOCK_E + tl.arange(0, BLOCK_E)  # [BLOCK_E] flat (kv_head, dim)
        head = offs_e // head_dim
        dim = offs_e % head_dim
        mask_e = offs_e < num_elems
        mask = (offs_t[:, None] < page_size) & mask_e[None, :]
        ptrs = (
            k_ptr + slot * stride_ks + offs_t[:, None].to(tl.int64) * stride_kt
            + head[None, :] * stride_kh + dim[None, :] * stride_kd
        )
        keys = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)  # [BLOCK_T, BLOCK_E]
        lo = tl.min(tl.where(mask, keys, float("inf")), axis=0)  # [BLOCK_E]
        hi = tl.max(tl.where(mask, keys, float("-inf")), axis=0)  # [BLOCK_E]
        out = row * stride_mr + head * stride_mh + dim * stride_md
        tl.store(min_ptr + out, lo.to(min_ptr.dtype.element_ty), mask=mask_e)
        tl.store(max_ptr + out, hi.to(max_ptr.dtype.element_ty), mask=mask_e)


def page_digest_into(
    k_pool: torch.Tensor,
    slot_ids: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    dst_rows: torch.Tensor,
    *,
    block_elems: int = 256,
) -> None:
    """Launch the digest kernel (same contract as ``reference.page_digest_into``).

    digest_min and digest_max must share strides. ``block_elems`` (a power of two) is the number
    of (kv_head, dim) elements per program.
    """
    num_pages = slot_ids.shape[0]
    _, page_size, num_kv_heads, head_dim = k_pool.shape
    if num_pages == 0:
        return
    assert digest_min.stride() == digest_max.stride()
    num_elems = num_kv_heads * head_dim
    block_e = min(block_elems, triton.next_power_of_2(num_elems))
    grid = (num_pages, triton.cdiv(num_elems, block_e))
    _page_digest_kernel[grid](
        k_pool, slot_ids.contiguous(), dst_rows.contiguous(), digest_min, digest_max,
        page_size, head_dim, num_elems,
        *k_pool.stride(), *digest_min.stride(),
        BLOCK_T=triton.next_power_of_2(page_size), BLOCK_E=block_e,
    )
