"""Paged attention for one engine step: where each new token's K/V is written in the hot pool
and which pool rows each query token reads.

The engine's model runner builds one ``AttentionMetadata`` per step; the model calls
``PagedAttention.forward`` once per layer. Requests with the same number of query tokens in a
step are attended together in one padded call (decode: 1 token each; a verify block: 1 + gamma);
a prefill chunk is its own group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.decoder.kv.hot_pool import HotPool


@dataclass
class AttentionGroup:
    """``num_reqs`` requests with ``num_query_tokens`` query tokens each, contiguous in the step's
    token dimension starting at ``token_start`` (request-major)."""

    token_start: int
    num_reqs: int
    num_query_tokens: int
    read_rows: torch.Tensor  # [num_reqs, max_context_len] int64 pool rows of positions 0..ctx-1 (padded with 0)
    attn_mask: torch.Tensor | None  # [num_reqs, 1, num_query_tokens, max_context_len] bool; None = attend all

    @property
    def token_end(self) -> int:
        return self.token_start + self.num_reqs * self.num_query_tokens


@dataclass
class AttentionMetadata:
    positions: torch.Tensor  # [num_tokens] int64 absolute position of each query token
    write_rows: torch.Tensor  # [num_tokens] int64 pool row receiving each token's K/V
    groups: list[AttentionGroup]

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])


def build_group(
    token_start: int,
    query_positions: list[list[int]],
    page_tables: list[list[int]],
    context_lens: list[int],
    page_size: int,
) -> AttentionGroup:
    """Builds one group. ``query_positions[r]``: positions of request r's query tokens (same
    count for every r); ``page_tables[r]``: its slots in logical page order; ``context_lens[r]``:
    tokens it holds after this step's writes."""
    num_reqs = len(query_positions)
    num_query_tokens = len(query_positions[0])
    max_len = max(context_lens)
    offsets = torch.arange(max_len, dtype=torch.int64)  # [max_len]
    read_rows = torch.zeros(num_reqs, max_len, dtype=torch.int64)
    for r in range(num_reqs):
        length = context_lens[r]
        num_pages = -(-length // page_size)
        slots = torch.tensor(page_tables[r][:num_pages], dtype=torch.int64)  # [num_pages]
        rows = (slots[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:length]
        read_rows[r, :length] = rows
    needs_mask = num_query_tokens > 1 or len(set(context_lens)) > 1
    attn_mask = None
    if needs_mask:
        q_pos = torch.tensor(query_positions, dtype=torch.int64)  # [num_reqs, num_query_tokens]
        lens = torch.tensor(context_lens, dtype=torch.int64)[:, None, None]
        key_pos = offsets[None, None, :]
        attn_mask = ((key_pos <= q_pos[:, :, None]) & (key_pos < lens)).unsqueeze(1)
    return AttentionGroup(token_start, num_reqs, num_query_tokens, read_rows, attn_mask)


SMALL_QUERY_TOKENS = 16  # decode / verify groups: two batched matmuls beat CPU flash SDPA by 20-40%


def _grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """GQA attention as two batched matmuls, each kv head serving its group of query heads.
    ``q: [B, num_heads, Q, D]``, ``keys, values: [B, num_kv_heads, L, D]``, ``mask: [B, 1, Q, L]``
    (True = attend) or None. Returns ``[B, num_heads, Q, D]``; softmax in fp32."""
    batch, num_heads, num_q, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    grouped_q = q.reshape(batch, num_kv_heads, group * num_q, head_dim)  # heads h = kv * group + g
    scores = torch.matmul(grouped_q, keys.transpose(-1, -2)).float() * scale  # [B, KVH, group * Q, L]
    if mask is not None:
        full_mask = mask.unsqueeze(2).expand(batch, 1, group, num_q, mask.shape[-1])
        scores = scores.masked_fill(~full_mask.reshape(batch, 1, group * num_q, -1), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).view(batch, num_heads, num_q, head_dim)


class PagedAttention:
    """Dense attention over the hot pool (every page of a request is read)."""

    def __init__(self, pool: HotPool, num_heads: int, scale: float):
        self.pool = pool
        self.num_heads = num_heads
        self.scale = scale

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """``q: [num_tokens, num_heads, head_dim]``, ``k, v: [num_tokens, num_kv_heads, head_dim]``.
        Writes k, v into the pool, then attends. Returns ``[num_tokens, num_heads * head_dim]``."""
        k_rows = self.pool.k_rows(layer)
        v_rows = self.pool.v_rows(layer)
        k_rows.index_copy_(0, meta.write_rows, k)
        v_rows.index_copy_(0, meta.write_rows, v)
        num_tokens, num_heads, head_dim = q.shape
        out = q.new_empty(num_tokens, num_heads, head_dim)
        for group in meta.groups:
            group_q = q[group.token_start : group.token_end].view(
                group.num_reqs, group.num_query_tokens, num_heads, head_dim
            ).transpose(1, 2)  # [num_reqs, num_heads, num_query_tokens, head_dim]
            rows = group.read_rows
            # index_select, not advanced indexing: ~4x faster for row gathers on CPU
            keys = torch.index_select(k_rows, 0, rows.view(-1)).view(*rows.shape, -1, head_dim).transpose(1, 2)
            values = torch.index_select(v_rows, 0, rows.view(-1)).view(*rows.shape, -1, head_dim).transpose(1, 2)
            # keys, values: [num_reqs, num_kv_heads, max_context_len, head_dim]
            if group.num_query_tokens <= SMALL_QUERY_TOKENS:
                attended = _grouped_attention(group_q, keys, values, group.attn_mask, self.scale)
            else:
                attended = F.scaled_dot_product_attention(
                    group_q, keys, values, attn_mask=group.attn_mask, scale=self.scale, enable_gqa=True
                )  # [num_reqs, num_heads, num_query_tokens, head_dim]
            out[group.token_start : group.token_end] = attended.transpose(1, 2).reshape(-1, num_heads, head_dim)
        return out.view(num_tokens, num_heads * head_dim)
