"""The hot buffer of one SPARSE request, and its per-layer residency state.

A SPARSE request keeps hot only:
  - its *pinned* pages: the sink pages, the recent window and every unsealed page, each in one
    slot shared by all layers (``Request.slots[page] >= 0``; the other entries are -1);
  - a buffer of ``capacity`` slots (the same slot ids in every layer) that holds, per layer, the
    top-k pages that layer selected lately, in LRU order (``resolve_residency``).
Every other page lives only in its kvtier host page; a miss is copied from there into a buffer
slot of that layer alone (``gather_pages``). Buffered pages are clean (sealed pages are written
back when they seal), so eviction never copies anything out.

State per layer ``l`` (int64, -1 = none), the exact form ``kernels.resolve_residency`` takes:
    slot_of_page[l, p]: slot holding page p in layer l (pinned or buffered)   [L, max_pages]
    lru[l]:  buffered pages, least recently used first, -1 padded at the end   [L, capacity]
    free[l]: buffer slots holding no page, in the order they will be used      [L, capacity]
"""

from __future__ import annotations

import torch


class SparseBuffer:
    def __init__(self, slots: list[int], num_layers: int, max_pages: int):
        if not slots:
            raise ValueError("a SPARSE buffer needs at least one slot")
        self.slots = list(slots)
        capacity = len(slots)
        self.slot_of_page = torch.full((num_layers, max_pages), -1, dtype=torch.int64)
        self.lru = torch.full((num_layers, capacity), -1, dtype=torch.int64)
        self.free = torch.tensor(slots, dtype=torch.int64).repeat(num_layers, 1)

    @property
    def capacity(self) -> int:
        return len(self.slots)

    def pin(self, page: int, slot: int) -> None:
        """Page ``page`` now lives in ``slot`` in every layer. Where a layer had it buffered, the
        buffer copy is dropped and its slot freed. Mutates: this layer state."""
        for layer in (self.lru == page).any(dim=1).nonzero().flatten().tolist():
            self._drop(layer, page)
        self.slot_of_page[:, page] = slot

    def unpin(self, page: int) -> None:
        """The pinned slot of ``page`` is going away (its bytes are on the host)."""
        self.slot_of_page[:, page] = -1

    def _drop(self, layer: int, page: int) -> None:
        lru = [p for p in self.lru[layer].tolist() if p >= 0 and p != page]
        free = [s for s in self.free[layer].tolist() if s >= 0] + [int(self.slot_of_page[layer, page])]
        self.lru[layer].fill_(-1)
        self.lru[layer, : len(lru)] = torch.tensor(lru, dtype=torch.int64)
        self.free[layer].fill_(-1)
        self.free[layer, : len(free)] = torch.tensor(free, dtype=torch.int64)
        self.slot_of_page[layer, page] = -1

    def buffered_pages(self, layer: int) -> list[int]:
        return [p for p in self.lru[layer].tolist() if p >= 0]

    def check_integrity(self, pinned: dict[int, int]) -> bool:
        """Per layer: buffered pages and free slots partition the buffer's slots; every buffered
        page maps to its slot; ``pinned`` (page -> slot) maps the same in every layer."""
        own = set(self.slots)
        for layer in range(self.lru.shape[0]):
            pages = self.buffered_pages(layer)
            held = [int(self.slot_of_page[layer, p]) for p in pages]
            free = [s for s in self.free[layer].tolist() if s >= 0]
            assert sorted(held + free) == sorted(own), f"layer {layer}: buffer slots leaked or doubled"
            assert not set(pages) & set(pinned), f"layer {layer}: a pinned page is also buffered"
            mapped = (self.slot_of_page[layer] >= 0).nonzero().flatten().tolist()
            assert set(mapped) == set(pages) | set(pinned), f"layer {layer}: stale slot_of_page entries"
            for page, slot in pinned.items():
                assert int(self.slot_of_page[layer, page]) == slot, f"layer {layer}: pinned page {page} moved"
        return True
