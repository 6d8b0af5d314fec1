"""Torch reference for sparse paged attention (oracle and CPU serving path)."""

from __future__ import annotations

import torch

from kernels.memory_budget import rows_per_chunk


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
) -> torch.Tensor:
    """Masked softmax attention in fp32 over each token's gathered pages.

    q: [num_tokens, num_heads, head_dim]; k_pool, v_pool: [num_slots, page_size, num_kv_heads,
    head_dim]; token_slots, token_pages: [num_tokens, max_sel] (-1 padding); token_pos:
    [num_tokens]. Returns [num_tokens, num_heads, head_dim] in q's dtype; zeros for a token with
    no valid key. Tokens are processed in chunks whose gathered K/V stay near the memory budget.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, _, num_kv_heads, _ = k_pool.shape
    group = num_heads // num_kv_heads
    max_sel = token_slots.shape[1]
    num_keys = max_sel * page_size
    if num_tokens == 0 or num_keys == 0:
        return torch.zeros_like(q)
    out = torch.empty_like(q)
    in_page = torch.arange(page_size, device=q.device)  # [page_size]
    # per token: gathered K and V (pool dtype and fp32), scores and probabilities
    bytes_per_token = num_keys * (
        num_kv_heads * head_dim * 2 * (k_pool.element_size() + 4) + num_heads * 4 * 2
    )
    chunk = rows_per_chunk(bytes_per_token)
    for start in range(0, num_tokens, chunk):
        rows = slice(start, start + chunk)
        slots = token_slots[rows].long()  # [c, max_sel]
        count = slots.shape[0]
        flat_slots = slots.clamp(min=0).flatten()
        # [c, num_keys, num_kv_heads, head_dim], contiguous fp32
        keys = k_pool.index_select(0, flat_slots).float().view(count, num_keys, num_kv_heads, head_dim)
        values = v_pool.index_select(0, flat_slots).float().view(count, num_keys, num_kv_heads, head_dim)
        key_pos = token_pages[rows].long()[:, :, None] * page_size + in_page  # [c, max_sel, page_size]
        visible = (slots[:, :, None] >= 0) & (key_pos <= token_pos[rows].long()[:, None, None])
        hidden = ~visible.view(count, 1, num_keys)
        # grouped GQA: each kv head serves its group of query heads (h = kv * group + g)
        q_grouped = q[rows].float().view(count, num_kv_heads, group, head_dim)
        scores = torch.matmul(q_grouped, keys.transpose(1, 2).transpose(-1, -2)) * scale  # [c, KVH, group, num_keys]
        scores.masked_fill_(hidden.view(count, 1, 1, num_keys), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, values.transpose(1, 2))  # [c, KVH, group, head_dim]
        any_visible = visible.view(count, num_keys).any(dim=-1)
        ctx = torch.where(any_visible[:, None, None, None], ctx, 0.0)  # no visible key: zeros, not NaN
        out[rows] = ctx.view(count, num_heads, head_dim).to(q.dtype)
    return out
