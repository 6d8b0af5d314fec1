"""Triton residency resolution: one program per request, sequential passes over its lists.

Membership goes through a zeroed scratch table ``marks [batch, max_pages]`` int32 (bit 0: page
in the LRU buffer, bit 1: page in the working set). Ordered lists are packed with ``tl.cumsum``
inside a block plus a running count across blocks, so every output matches the reference
exactly. Passes that read what an earlier pass stored through global memory are separated by
``tl.debug_barrier()`` (a block-wide barrier: the stores are visible to the whole program).

Passes (W = working set, C = LRU / free lists):
  A  LRU: mark bit 0; count resident pages.      F  free list: count free slots.
  B  W: hit/miss, pack misses, mark bit 1, count buffered working pages.   -- overflow check
  C  LRU: evictables LRU-first; the first ``num_victims`` are victims (their slot goes to miss
     ``num_from_free + rank``); the others survive in order into the new LRU.
  D  free list: the first ``num_from_free`` slots go to the first misses; the rest shift left.
  E  W: misses take their slot, ws_slots, touched pages appended to the new LRU in page order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.resolve_residency.plan import ResidencyPlan


@triton.jit
def _resolve_residency_kernel(
    ws_ptr, slot_ptr, lru_ptr, free_ptr, marks_ptr,
    hit_ptr, ws_slot_ptr, miss_page_ptr, miss_slot_ptr, victim_ptr,
    new_lru_ptr, new_free_ptr, new_slot_ptr, num_miss_ptr, num_victim_ptr, overflow_ptr,
    max_ws, max_pages, capacity,
    BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr,
):
    req = tl.program_id(0).to(tl.int64)
    ws_row = ws_ptr + req * max_ws
    slot_row = slot_ptr + req * max_pages
    marks_row = marks_ptr + req * max_pages
    lru_row = lru_ptr + req * capacity
    free_row = free_ptr + req * capacity
    miss_slot_row = miss_slot_ptr + req * max_ws
    new_lru_row = new_lru_ptr + req * capacity
    new_slot_row = new_slot_ptr + req * max_pages
    offs_w = tl.arange(0, BLOCK_W)
    offs_c = tl.arange(0, BLOCK_C)

    num_lru = 0
    num_free = 0
    for c0 in range(0, capacity, BLOCK_C):  # pass A + F
        idx = c0 + offs_c
        lru = tl.load(lru_row + idx, mask=idx < capacity, other=-1).to(tl.int64)
        tl.store(marks_row + lru, tl.full((BLOCK_C,), 1, tl.int32), mask=lru >= 0)
        num_lru += tl.sum((lru >= 0).to(tl.int32), axis=0)
        free = tl.load(free_row + idx, mask=idx < capacity, other=-1)
        num_free += tl.sum((free >= 0).to(tl.int32), axis=0)
    tl.debug_barrier()

    num_misses = 0
    num_buffered = 0
    for w0 in range(0, max_ws, BLOCK_W):  # pass B
        idx = w0 + offs_w
        page = tl.load(ws_row + idx, mask=idx < max_ws, other=-1).to(tl.int64)
        valid = page >= 0
        old_slot = tl.load(slot_row + page, mask=valid, other=-1)
        hit = valid & (old_slot >= 0)
        miss = valid & (old_slot < 0)
        mark = tl.load(marks_row + page, mask=valid, other=0)
        tl.store(marks_row + page, mark | 2, mask=valid)
        tl.store(hit_ptr + req * max_ws + idx, hit.to(tl.int8), mask=idx < max_ws)
        rank = num_misses + tl.cumsum(miss.to(tl.int32), axis=0) - 1
        tl.store(miss_page_ptr + req * max_ws + rank, page.to(tl.int32), mask=miss)
        num_misses += tl.sum(miss.to(tl.int32), axis=0)
        num_buffered += tl.sum((valid & ((mark & 1) != 0)).to(tl.int32), axis=0)
    overflow = num_buffered + num_misses > num_lru + num_free
    tl.store(overflow_ptr + req, overflow.to(tl.int32))
    tl.debug_barrier()

    if num_buffered + num_misses <= num_lru + num_free:
        num_from_free = tl.minimum(num_misses, num_free)
        num_victims = num_misses - num_from_free
        num_evictable = 0
        num_survivors = 0
        for c0 in range(0, capacity, BLOCK_C):  # pass C + D
            idx = c0 + offs_c
            lru = tl.load(lru_row + idx, mask=idx < capacity, other=-1).to(tl.int64)
            valid = lru >= 0
            mark = tl.load(marks_row + lru, mask=valid, other=0)
            evictable = valid & ((mark & 2) == 0)
            rank = num_evictable + tl.cumsum(evictable.to(tl.int32), axis=0) - 1
            victim = evictable & (rank < num_victims)
            old_slot = tl.load(slot_row + lru, mask=victim, other=-1)
            tl.store(victim_ptr + req * max_ws + rank, lru.to(tl.int32), mask=victim)
            tl.store(miss_slot_row + num_from_free + rank, old_slot.to(tl.int32), mask=victim)
            tl.store(new_slot_row + lru, tl.full((BLOCK_C,), -1, tl.int32), mask=victim)
            survivor = evictable & (rank >= num_victims)
            s_rank = num_survivors + tl.cumsum(survivor.to(tl.int32), axis=0) - 1
            tl.store(new_lru_row + s_rank, lru.to(tl.int32), mask=survivor)
            num_evictable += tl.sum(evictable.to(tl.int32), axis=0)
            num_survivors += tl.sum(survivor.to(tl.int32), axis=0)
            free = tl.load(free_row + idx, mask=idx < capacity, other=-1)
            take = (free >= 0) & (idx < num_from_free)
            tl.store(miss_slot_row + idx, free.to(tl.int32), mask=take)
            tl.store(new_free_ptr + req * capacity + idx - num_from_free, free.to(tl.int32),
                     mask=(free >= 0) & (idx >= num_from_free))
        tl.store(num_miss_ptr + req, num_misses)
        tl.store(num_victim_ptr + req, num_victims)
        tl.debug_barrier()

        seen_misses = 0
        num_touched = 0
        for w0 in range(0, max_ws, BLOCK_W):  # pass E
            idx = w0 + offs_w
            page = tl.load(ws_row + idx, mask=idx < max_ws, other=-1).to(tl.int64)
            valid = page >= 0
            old_slot = tl.load(slot_row + page, mask=valid, other=-1)
            miss = valid & (old_slot < 0)
            rank = seen_misses + tl.cumsum(miss.to(tl.int32), axis=0) - 1
            new_slot = tl.load(miss_slot_row + rank, mask=miss, other=-1)
            tl.store(new_slot_row + page, new_slot, mask=miss)
            ws_slot = tl.where(miss, new_slot, old_slot)
            tl.store(ws_slot_ptr + req * max_ws + idx, ws_slot.to(tl.int32), mask=idx < max_ws)
            mark = tl.load(marks_row + page, mask=valid, other=0)
            touched = valid & (((mark & 1) != 0) | miss)
            t_rank = num_survivors + num_touched + tl.cumsum(touched.to(tl.int32), axis=0) - 1
            tl.store(new_lru_row + t_rank, page.to(tl.int32), mask=touched)
            seen_misses += tl.sum(miss.to(tl.int32), axis=0)
            num_touched += tl.sum(touched.to(tl.int32), axis=0)


def resolve_residency(
    working_pages: torch.Tensor,
    slot_of_page: torch.Tensor,
    lru_pages: torch.Tensor,
    free_slots: torch.Tensor,
    *,
    block: int = 128,
) -> tuple[ResidencyPlan, torch.Tensor]:
    """Launch the kernel; same contract and ``(plan, overflow [B] bool)`` as the reference.

    ``block`` (a power of two) is the list chunk each pass handles per iteration.
    """
    batch, max_ws = working_pages.shape
    max_pages = slot_of_page.shape[1]
    capacity = lru_pages.shape[1]
    device = working_pages.device
    i32 = torch.int32
    ws = working_pages.to(i32).contiguous()
    slots = slot_of_page.to(i32).contiguous()
    lru = lru_pages.to(i32).contiguous()
    free = free_slots.to(i32).contiguous()
    marks = torch.zeros((batch, max_pages), dtype=i32, device=device)  # scratch

    def padded(*shape: int) -> torch.Tensor:
        return torch.full(shape, -1, dtype=i32, device=device)

    hit = torch.zeros((batch, max_ws), dtype=torch.int8, device=device)
    ws_slots, miss_pages, miss_slots, victim_pages = (padded(batch, max_ws) for _ in range(4))
    new_lru, new_free = padded(batch, capacity), padded(batch, capacity)
    new_slot = slots.clone()
    num_misses, num_victims, overflow = (torch.zeros(batch, dtype=i32, device=device) for _ in range(3))
    if batch:
        _resolve_residency_kernel[(batch,)](
            ws, slots, lru, free, marks,
            hit, ws_slots, miss_pages, miss_slots, victim_pages,
            new_lru, new_free, new_slot, num_misses, num_victims, overflow,
            max_ws, max_pages, capacity,
            BLOCK_W=block, BLOCK_C=block,
        )
    plan = ResidencyPlan(
        hit=hit.bool(),
        ws_slots=ws_slots,
        miss_pages=miss_pages,
        miss_slots=miss_slots,
        num_misses=num_misses,
        victim_pages=victim_pages,
        num_victims=num_victims,
        new_lru_pages=new_lru,
        new_free_slots=new_free,
        new_slot_of_page=new_slot,
    )
    return plan, overflow.bool()
