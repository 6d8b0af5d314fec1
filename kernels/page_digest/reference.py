"""Torch reference for the page digest (oracle and CPU serving path)."""

from __future__ import annotations

import torch

from kernels.memory_budget import rows_per_chunk


def page_digest_into(
    k_pool: torch.Tensor,
    slot_ids: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    dst_rows: torch.Tensor,
) -> None:
    """Write min/max over tokens of ``k_pool[slot_ids[i]]`` into row ``dst_rows[i]``.

    k_pool: [num_slots, page_size, num_kv_heads, head_dim]; slot_ids, dst_rows: [num_pages]
    (lanes with ``slot_ids == -1`` are skipped); digest_min/max: [num_rows, num_kv_heads, head_dim]
    in k_pool's dtype. Min/max are exact, so no fp32 detour is needed.
    """
    keep = slot_ids >= 0
    slots = slot_ids[keep].long()  # [num_valid]
    rows = dst_rows[keep].long()  # [num_valid]
    page_bytes = k_pool[0].numel() * k_pool.element_size() if k_pool.shape[0] else 1
    chunk = rows_per_chunk(page_bytes)
    for start in range(0, slots.numel(), chunk):
        pages = k_pool.index_select(0, slots[start : start + chunk])  # [c, page, kvh, hd]
        lo, hi = torch.aminmax(pages, dim=1)  # [c, kvh, hd] each
        digest_min.index_copy_(0, rows[start : start + chunk], lo)
        digest_max.index_copy_(0, rows[start : start + chunk], hi)
