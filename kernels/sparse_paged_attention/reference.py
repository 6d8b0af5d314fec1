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
        q_f32 = q[rows].float().view(count, num_kv_heads, group, head_dim) * scale
        ctx = torch.empty((count, num_kv_heads, group, head_dim), dtype=torch.float32, device=q.device)
        for kv in range(num_kv_heads):
            # strided per-head views go to BLAS as they are: no transposed copy of the gather
            scores = torch.bmm(q_f32[:, kv], keys[:, :, kv].transpose(1, 2))  # [c, group, num_keys]
            scores.masked_fill_(hidden, float("-inf"))
            row_max = scores.amax(dim=-1, keepdim=True)
            row_max = torch.where(torch.isinf(row_max), 0.0, row_max)  # all hidden: exp(-inf) = 0
            probs = torch.exp_(scores.sub_(row_max))
            denom = probs.sum(dim=-1, keepdim=True)
            torch.bmm(probs, values[:, :, kv], out=ctx[:, kv])  # [c, group, head_dim]
            ctx[:, kv] /= torch.where(denom > 0, denom, 1.0)
        out[rows] = ctx.view(count, num_heads, head_dim).to(q.dtype)
    return out
