"""The result of ``resolve_residency``: what to copy, where, and the buffer's next state."""

from __future__ import annotations

from typing import NamedTuple

import torch


class ResidencyPlan(NamedTuple):
    """One step's residency plan for one layer. All index tensors int32, -1 padded at the end.

    Fields (B = batch, W = max_ws, C = capacity, P = max_pages):
        hit: [B, W] bool, working page already hot (in the LRU buffer or pinned); False on padding.
        ws_slots: [B, W] slot of each working page after the step (-1 on padding).
        miss_pages: [B, W] the working pages that are not hot, ascending.
        miss_slots: [B, W] slot that ``miss_pages[r, j]`` is copied into.
        num_misses: [B].
        victim_pages: [B, W] pages evicted from the buffer, LRU-first; miss
            ``num_misses - num_victims + j`` takes the slot of ``victim_pages[r, j]``.
        num_victims: [B].
        new_lru_pages: [B, C] the buffer's LRU order after the step, LRU-first.
        new_free_slots: [B, C] the buffer's free slots after the step.
        new_slot_of_page: [B, P] slot_of_page after the step (victims -1, misses assigned).
    """

    hit: torch.Tensor
    ws_slots: torch.Tensor
    miss_pages: torch.Tensor
    miss_slots: torch.Tensor
    num_misses: torch.Tensor
    victim_pages: torch.Tensor
    num_victims: torch.Tensor
    new_lru_pages: torch.Tensor
    new_free_slots: torch.Tensor
    new_slot_of_page: torch.Tensor
