"""Public entry point of residency resolution for SPARSE requests (one layer per call).

State of request row r in this layer (the caller keeps it, one copy per layer):
  * ``slot_of_page[r, p]``: hot-pool slot holding logical page p, or -1. Covers the LRU buffer
    and any pinned pages (e.g. sink/tail kept hot outside the buffer).
  * ``lru_pages[r]``: the pages held by the request's hot buffer, least recently used first.
  * ``free_slots[r]``: slots of the buffer that hold no page, in the order they will be used.
  The buffer's capacity is ``num_lru + num_free`` (at most ``capacity`` = the row width), so
  rows of one batch may have different capacities.

Resolution of the step's working set ``working_pages[r]`` (exact and deterministic):
  1. hit = the page has a slot (LRU or pinned); miss = it has none. Misses are taken in
     ascending page order.
  2. Buffer demand = working pages in the LRU buffer + misses (pinned hits need no buffer slot).
     If it exceeds the capacity of any request: ``ValueError``.
  3. Miss j (0-based, ascending) gets ``free_slots[r, j]`` while free slots last
     (``num_from_free = min(num_misses, num_free)``); the rest evict: the evictable pages are
     the LRU pages not in the working set, in LRU order, and miss ``num_from_free + i`` takes
     the slot of the i-th of them (``victim_pages[r, i]``). ``num_victims = num_misses -
     num_from_free``.
  4. New LRU order = the surviving untouched LRU pages in their old relative order, then the
     touched pages (working pages in the buffer after the step: buffered hits and misses) in
     ascending page order, as the most recently used. Pinned hits stay out of the LRU.
  5. New free list = the free slots not handed out, in their old order.

Victims need no copy-out: sealed pages are written back to their host pages when sealed, so a
buffered page is always clean. The unsealed tail page is never on the host: keep it pinned
(in ``slot_of_page``, not in ``lru_pages``) so that it is always a hit.
"""

from __future__ import annotations

import torch

from kernels.resolve_residency import reference
from kernels.resolve_residency.plan import ResidencyPlan
from kernels.validation import (
    INDEX_DTYPES,
    check_index_range,
    check_rows_distinct,
    check_rows_packed,
    check_same_device,
    check_tensor,
)


def _check_state(working_pages, slot_of_page, lru_pages, free_slots) -> None:
    batch, max_pages = slot_of_page.shape
    capacity = lru_pages.shape[1]
    check_index_range("working_pages", working_pages, high=max_pages, allow_padding=True, what="logical pages")
    check_rows_packed("working_pages", working_pages, ascending=True)
    check_index_range("lru_pages", lru_pages, high=max_pages, allow_padding=True, what="logical pages")
    check_rows_packed("lru_pages", lru_pages, ascending=False)
    check_rows_distinct("lru_pages", lru_pages)
    if bool((slot_of_page < -1).any()):
        raise ValueError("slot_of_page entries must be >= 0 (a slot) or -1 (not hot)")
    if bool((free_slots < -1).any()):
        raise ValueError("free_slots entries must be >= 0 (a slot) or -1 (padding)")
    check_rows_packed("free_slots", free_slots, ascending=False)
    check_rows_distinct("free_slots", free_slots)
    lru_slots = slot_of_page.gather(1, lru_pages.clamp(min=0).long())  # [B, C]
    if bool(((lru_pages >= 0) & (lru_slots < 0)).any()):
        raise ValueError("every page in lru_pages must have a slot in slot_of_page (it is hot)")
    num_held = (lru_pages >= 0).sum(1) + (free_slots >= 0).sum(1)
    if bool((num_held > capacity).any()):
        row = int((num_held > capacity).nonzero()[0, 0])
        raise ValueError(
            f"request row {row} holds {int(num_held[row])} LRU pages + free slots, more than "
            f"capacity {capacity} (the width of lru_pages and free_slots)"
        )


def resolve_residency(
    working_pages: torch.Tensor,
    slot_of_page: torch.Tensor,
    lru_pages: torch.Tensor,
    free_slots: torch.Tensor,
    *,
    check_indices: bool = True,
) -> ResidencyPlan:
    """Resolve each request's working set against its hot buffer (contract: module docstring).

    Args:
        working_pages: [batch, max_ws] int32/int64 the step's working set per request (union of
            its tokens' selections), strictly ascending, -1 padded at the end.
        slot_of_page: [batch, max_pages] int32/int64 slot of each logical page or -1.
        lru_pages: [batch, capacity] int32/int64 buffered pages, LRU-first, -1 padded at the end;
            each must have a slot.
        free_slots: [batch, capacity] int32/int64 free buffer slots, -1 padded at the end;
            distinct and not used by any page (the latter is the caller's invariant, unchecked).
        check_indices: check the state invariants above (reads the tensors; syncs on CUDA).

    Returns:
        A ``ResidencyPlan`` (int32 indices, -1 padded; see ``plan.py``). Inputs are not mutated;
        the caller installs ``new_lru_pages``, ``new_free_slots``, ``new_slot_of_page`` and
        copies ``miss_pages`` into ``miss_slots`` (e.g. with ``gather_pages``).

    Raises:
        ValueError: a request's buffer demand exceeds its capacity (always checked: it reads the
            overflow flags, one sync on CUDA), or a check_indices invariant fails.

    Dispatch: CUDA -> Triton kernel (one program per request); CPU -> torch reference.
    """
    check_tensor("working_pages", working_pages, shape=(None, None), shape_doc="[batch, max_ws]", dtypes=INDEX_DTYPES)
    batch = working_pages.shape[0]
    check_tensor(
        "slot_of_page", slot_of_page, shape=(batch, None), shape_doc=f"[batch={batch}, max_pages]", dtypes=INDEX_DTYPES
    )
    check_tensor(
        "lru_pages", lru_pages, shape=(batch, None), shape_doc=f"[batch={batch}, capacity]", dtypes=INDEX_DTYPES
    )
    capacity = lru_pages.shape[1]
    check_tensor(
        "free_slots", free_slots, shape=(batch, capacity),
        shape_doc=f"[batch={batch}, capacity={capacity}]", dtypes=INDEX_DTYPES,
    )
    check_same_device(
        working_pages=working_pages, slot_of_page=slot_of_page, lru_pages=lru_pages, free_slots=free_slots
    )
    if check_indices and batch:
        _check_state(working_pages, slot_of_page, lru_pages, free_slots)
    if working_pages.is_cuda:
        from kernels.resolve_residency import triton as triton_impl

        plan, overflow = triton_impl.resolve_residency(working_pages, slot_of_page, lru_pages, free_slots)
    else:
        plan, overflow = reference.resolve_residency(working_pages, slot_of_page, lru_pages, free_slots)
    if bool(overflow.any()):
        row = int(overflow.nonzero()[0, 0])
        ws = working_pages[row][working_pages[row] >= 0].long()
        buffered = lru_pages[row][lru_pages[row] >= 0]
        demand = int((torch.isin(ws, buffered) | (slot_of_page[row][ws] < 0)).sum())
        cap = int(buffered.numel() + (free_slots[row] >= 0).sum())
        raise ValueError(
            f"working set of request row {row} does not fit its hot buffer: it needs {demand} "
            f"buffer slots (working pages in the buffer + misses) but the capacity is {cap}"
        )
    return plan
