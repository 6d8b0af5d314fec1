"""Torch reference for residency resolution (oracle and CPU serving path), vectorized over
requests: membership tests go through ``[batch, max_pages + 1]`` marker tables (the extra
column swallows padding lanes) and every ordered list is packed with a cumsum + scatter.
"""

from __future__ import annotations

import torch

from kernels.resolve_residency.plan import ResidencyPlan


def _compact(values: torch.Tensor, keep: torch.Tensor, width: int) -> torch.Tensor:
    """Entries of ``values [B, N]`` where ``keep``, packed left in order into [B, width], -1 after.

    At most ``width`` entries per row may be kept; extra ones are dropped.
    """
    pos = torch.where(keep, torch.cumsum(keep, 1) - 1, width).clamp(max=width)
    out = torch.full((values.shape[0], width + 1), -1, dtype=torch.int64, device=values.device)
    out.scatter_(1, pos, values)
    return out[:, :width]


def _marks(rows: torch.Tensor, num_pages: int) -> torch.Tensor:
    """[B, num_pages + 1] bool: True at each page of ``rows [B, N]`` (padding lanes hold
    ``num_pages`` and land in the last column, which is reset to False)."""
    table = torch.zeros((rows.shape[0], num_pages + 1), dtype=torch.bool, device=rows.device)
    table.scatter_(1, rows, True)
    table[:, num_pages] = False
    return table


def resolve_residency(
    working_pages: torch.Tensor,
    slot_of_page: torch.Tensor,
    lru_pages: torch.Tensor,
    free_slots: torch.Tensor,
) -> tuple[ResidencyPlan, torch.Tensor]:
    """Reference resolution; contract in ``kernels.resolve_residency.api``.

    Returns ``(plan, overflow)`` where ``overflow: [B] bool`` marks requests whose working set
    does not fit their buffer (their plan rows are meaningless; the api raises on any).
    """
    batch, max_ws = working_pages.shape
    num_pages = slot_of_page.shape[1]
    capacity = lru_pages.shape[1]
    device = working_pages.device
    pad_col = torch.full((batch, 1), -1, dtype=torch.int64, device=device)
    wp = working_pages.long()
    lru = lru_pages.long()
    free = free_slots.long()
    slot_ext = torch.cat([slot_of_page.long(), pad_col], 1)  # [B, P + 1], column P = -1

    ws_valid = wp >= 0
    ws_rows = torch.where(ws_valid, wp, num_pages)  # [B, W] padding -> column P
    lru_valid = lru >= 0
    lru_rows = torch.where(lru_valid, lru, num_pages)  # [B, C]
    old_ws_slot = slot_ext.gather(1, ws_rows)  # [B, W]
    hit = ws_valid & (old_ws_slot >= 0)
    miss = ws_valid & ~hit
    ws_in_lru = _marks(lru_rows, num_pages).gather(1, ws_rows)  # [B, W]
    lru_in_ws = _marks(ws_rows, num_pages).gather(1, lru_rows)  # [B, C]
    evictable = lru_valid & ~lru_in_ws

    num_misses = miss.sum(1)
    num_free = (free >= 0).sum(1)
    overflow = ws_in_lru.sum(1) + num_misses > lru_valid.sum(1) + num_free
    num_from_free = torch.minimum(num_misses, num_free)  # misses served by free slots
    num_victims = num_misses - num_from_free
    evict_rank = torch.cumsum(evictable, 1) - 1
    victim = evictable & (evict_rank < num_victims[:, None])  # [B, C] LRU-first evictables

    victim_pages = _compact(lru, victim, max_ws)
    victim_slots = _compact(slot_ext.gather(1, lru_rows), victim, max_ws)
    miss_pages = _compact(wp, miss, max_ws)
    col_w = torch.arange(max_ws, device=device)[None, :]
    free_ext = torch.cat([free, pad_col], 1)  # [B, C + 1]
    from_free = free_ext.gather(1, col_w.clamp(max=capacity).expand(batch, -1))
    from_victim = victim_slots.gather(1, (col_w - num_from_free[:, None]).clamp(min=0))
    miss_slots = torch.where(
        col_w < num_from_free[:, None],
        from_free,
        torch.where(col_w < num_misses[:, None], from_victim, -1),
    )
    col_c = torch.arange(capacity, device=device)[None, :]
    new_free = free_ext.gather(1, (col_c + num_from_free[:, None]).clamp(max=capacity))

    new_slot = slot_ext.clone()
    new_slot.scatter_(1, torch.where(victim, lru_rows, num_pages), -1)
    new_slot.scatter_(1, torch.where(miss_pages >= 0, miss_pages, num_pages), miss_slots)
    new_slot[:, num_pages] = -1
    ws_slots = torch.where(ws_valid, new_slot.gather(1, ws_rows), -1)

    survivor = evictable & ~victim  # untouched pages that stay, in their LRU order
    touched = ws_valid & (ws_in_lru | miss)  # buffered working pages, ascending = MRU last
    num_survivors = survivor.sum(1, keepdim=True)
    pos_survivor = torch.where(survivor, torch.cumsum(survivor, 1) - 1, capacity)
    pos_touched = torch.where(touched, num_survivors + torch.cumsum(touched, 1) - 1, capacity)
    new_lru = torch.full((batch, capacity + 1), -1, dtype=torch.int64, device=device)
    new_lru.scatter_(1, pos_survivor.clamp(max=capacity), lru)
    new_lru.scatter_(1, pos_touched.clamp(max=capacity), wp)
    new_lru[:, capacity] = -1

    i32 = torch.int32
    plan = ResidencyPlan(
        hit=hit,
        ws_slots=ws_slots.to(i32),
        miss_pages=miss_pages.to(i32),
        miss_slots=miss_slots.to(i32),
        num_misses=num_misses.to(i32),
        victim_pages=victim_pages.to(i32),
        num_victims=num_victims.to(i32),
        new_lru_pages=new_lru[:, :capacity].to(i32),
        new_free_slots=new_free.to(i32),
        new_slot_of_page=new_slot[:, :num_pages].to(i32),
    )
    return plan, overflow
