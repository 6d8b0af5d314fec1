"""Public entry point of sparse paged attention."""

from __future__ import annotations

import torch

from kernels.sparse_paged_attention import reference
from kernels.validation import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_index_range,
    check_positive_int,
    check_rows_distinct,
    check_same_device,
    check_tensor,
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
    page_size: int = 16,
    check_indices: bool = True,
) -> torch.Tensor:
    """Attention of each query token over exactly its own selected pages.

    Entry ``j`` of a token's row names selected logical page ``token_pages[t, j]``, resident in
    hot-pool slot ``token_slots[t, j]``. Its key ``i`` sits at logical position
    ``token_pages[t, j] * page_size + i`` and is attended iff that position is ``<=
    token_pos[t]`` (causal inside the partial last page and inside a multi-token verify block).
    Query head h reads kv head ``h // (num_heads // num_kv_heads)``. Softmax of
    ``scale * q.k`` over the attended keys, accumulated in fp32.

    Args:
        q: [num_tokens, num_heads, head_dim] fp32/fp16/bf16.
        k_pool, v_pool: [num_slots, page_size, num_kv_heads, head_dim], q's dtype.
        token_slots: [num_tokens, max_sel] int32/int64 slot per selected page, -1 = padding.
        token_pages: [num_tokens, max_sel] int32/int64 logical page per entry; -1 exactly where
            token_slots is -1; the valid pages of a row must be distinct (order is free).
        token_pos: [num_tokens] int32/int64 absolute position of each query token.
        scale: softmax scale, typically ``head_dim ** -0.5``.
        page_size: tokens per page; must equal k_pool.shape[1].
        check_indices: check slot range, padding agreement and distinct pages (reads the
            tensors; syncs on CUDA).

    Returns:
        [num_tokens, num_heads, head_dim] in q's dtype. A token with no attended key gets
        zeros (cannot happen with ``page_select`` output, which always holds the token's page).

    Dispatch: CUDA -> Triton kernel (one program per token and kv head); CPU -> torch reference.
    """
    check_tensor("q", q, shape=(None, None, None), shape_doc="[num_tokens, num_heads, head_dim]", dtypes=FLOAT_DTYPES)
    num_tokens, num_heads, head_dim = q.shape
    check_positive_int("page_size", page_size)
    pool_doc = f"[num_slots, page_size={page_size}, num_kv_heads, head_dim={head_dim}]"
    check_tensor("k_pool", k_pool, shape=(None, page_size, None, head_dim), shape_doc=pool_doc)
    num_slots, _, num_kv_heads, _ = k_pool.shape
    check_tensor(
        "v_pool", v_pool, shape=tuple(k_pool.shape),
        shape_doc=f"[num_slots={num_slots}, page_size={page_size}, num_kv_heads={num_kv_heads}, head_dim={head_dim}]",
    )
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        if pool.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {pool.dtype}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"q's num_heads ({num_heads}) must be a multiple of k_pool's num_kv_heads ({num_kv_heads})")
    check_tensor(
        "token_slots", token_slots, shape=(num_tokens, None),
        shape_doc=f"[num_tokens={num_tokens}, max_sel]", dtypes=INDEX_DTYPES,
    )
    max_sel = token_slots.shape[1]
    check_tensor(
        "token_pages", token_pages, shape=(num_tokens, max_sel),
        shape_doc=f"[num_tokens={num_tokens}, max_sel={max_sel}]", dtypes=INDEX_DTYPES,
    )
    check_tensor(
        "token_pos", token_pos, shape=(num_tokens,), shape_doc=f"[num_tokens={num_tokens}]", dtypes=INDEX_DTYPES
    )
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    check_same_device(
        q=q, k_pool=k_pool, v_pool=v_pool, token_slots=token_slots, token_pages=token_pages, token_pos=token_pos
    )
    if check_indices and token_slots.numel():
        check_index_range("token_slots", token_slots, high=num_slots, allow_padding=True, what="slots of k_pool")
        if bool(((token_slots < 0) != (token_pages < 0)).any()):
            raise ValueError("token_pages must be -1 exactly where token_slots is -1 (padding lanes)")
        if bool((token_pages < -1).any()):
            raise ValueError("token_pages entries must be >= 0 or -1 (padding)")
        check_rows_distinct("token_pages", token_pages)
    if q.is_cuda:
        from kernels.sparse_paged_attention import triton as triton_impl

        return triton_impl.sparse_paged_attention(
            q, k_pool, v_pool, token_slots, token_pages, token_pos, scale=scale, page_size=page_size
        )
    return reference.sparse_paged_attention(
        q, k_pool, v_pool, token_slots, token_pages, token_pos, scale=scale, page_size=page_size
    )
