"""Load-adaptive residency: which requests keep every page hot (FULL) and which keep only their
working set (SPARSE), decided each step from the hot pool's free slots.

Policies:
  - ``always-full``: the dense baseline. A request is admitted only when its whole context
    fits (prompt pages + 1); under pressure requests are preempted (and swapped back in later).
  - ``always-sparse`` (HiSparse-style): every request is SPARSE from admission on.
  - ``adaptive`` (default with a host tier): admitted FULL while the pool's free slots after
    the admission stay at or above the low watermark, else SPARSE. Under pressure (a running
    request needs a slot, a waiting request cannot be admitted even as SPARSE, or free slots fall
    below the low watermark) the FULL request with the
    most releasable pages is demoted: the one whose demotion frees the most slots, so the fewest
    requests lose their FULL speed. Demotion copies nothing: its sealed pages are already on the
    host. While free slots stay above the high watermark, the SPARSE request with the fewest
    cold pages is promoted, at most ``promote_pages_per_step`` pages fetched per step; a
    promotion is only started if, once done, free slots would still be at or above the high
    watermark, so it cannot itself trigger a demotion (hysteresis: low < high).

SPARSE bookkeeping: ``Request.slots[page]`` is the pinned slot (-1: cold, only on the host);
pinned = sink pages, the recent window of the next query token, and every page not yet written
back; ``Request.buffer`` holds ``buffer_pages`` slots for the per-layer LRU buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.decoder.engine.request import Request, Residency
from services.decoder.kv.slot_allocator import OutOfSlotsError, SlotAllocator
from services.decoder.kv.sparse_buffer import SparseBuffer

Policy = Literal["adaptive", "always-sparse", "always-full"]


@dataclass(frozen=True)
class ResidencySettings:
    policy: Policy
    page_size: int
    num_layers: int
    sink_pages: int
    recent_pages: int
    buffer_pages: int  # LRU buffer slots per SPARSE request
    low_watermark_slots: int
    high_watermark_slots: int
    promote_pages_per_step: int


class ResidencyController:
    def __init__(self, settings: ResidencySettings, allocator: SlotAllocator):
        if settings.low_watermark_slots >= settings.high_watermark_slots:
            raise ValueError("the low watermark must be below the high watermark (hysteresis)")
        self.settings = settings
        self.allocator = allocator
        self.num_fetched_pages = 0  # promotion traffic

    # ---- page arithmetic ------------------------------------------------------------------
    def _pages(self, num_tokens: int) -> int:
        return -(-num_tokens // self.settings.page_size)

    def _recent_start(self, request: Request) -> int:
        """First page of the recent window of the request's next query token."""
        return max(request.num_computed_tokens // self.settings.page_size - self.settings.recent_pages + 1, 0)

    def _releasable(self, request: Request) -> list[int]:
        """Pinned pages the request need not keep hot: sealed, written back, not sink, older
        than the next token's recent window (for a FULL request: what demotion releases)."""
        end = min(self._recent_start(request), request.num_host_pages, len(request.slots))
        return [p for p in range(self.settings.sink_pages, end) if request.slots[p] >= 0]

    def _max_pages(self, request: Request) -> int:
        return self._pages(request.max_total_len)

    # ---- admission ------------------------------------------------------------------------
    def admit(self, request: Request, num_new_tokens: int) -> int:
        """Chooses the mode of a waiting request and gives it the slots of its next chunk (and,
        if SPARSE, its buffer). Returns the chunk's tokens (a SPARSE chunk is cut to the free
        slots), or 0, changing nothing, if the request must wait."""
        s = self.settings
        end_pages = self._pages(request.num_computed_tokens + num_new_tokens)
        host_pages = request.num_host_pages if request.num_computed_tokens else 0
        free = self.allocator.num_free_slots
        if s.policy == "always-full":
            if free < self._pages(request.num_tokens + 1):
                return 0  # admission waits until the whole context fits
            return num_new_tokens if self._admit_full(request, end_pages, host_pages) else 0
        if s.policy == "adaptive" and free - end_pages >= s.low_watermark_slots:
            return num_new_tokens if self._admit_full(request, end_pages, host_pages) else 0
        return self._admit_sparse(request, num_new_tokens, host_pages)

    def chunk_room(self, request: Request) -> int:
        """Tokens the request can compute next without a slot it cannot get: room in its last
        page plus every free slot."""
        held_tokens = len(request.slots) * self.settings.page_size - request.num_computed_tokens
        return max(held_tokens, 0) + self.allocator.num_free_slots * self.settings.page_size

    def _admit_full(self, request: Request, end_pages: int, host_pages: int) -> bool:
        try:
            request.slots = self.allocator.allocate(end_pages)
        except OutOfSlotsError:
            return False
        request.mode = Residency.FULL
        request.pending_fetch = list(range(host_pages))
        return True

    def _admit_sparse(self, request: Request, num_new_tokens: int, host_pages: int) -> int:
        s = self.settings
        recent_start = self._recent_start(request)
        start_page = request.num_computed_tokens // s.page_size
        keep = [p for p in range(start_page) if p < s.sink_pages or p >= recent_start or p >= host_pages]
        free_for_chunk = self.allocator.num_free_slots - s.buffer_pages - len(keep)
        room = free_for_chunk * s.page_size - request.num_computed_tokens % s.page_size
        num_tokens = min(num_new_tokens, room)
        if num_tokens <= 0:
            return 0
        end_pages = self._pages(request.num_computed_tokens + num_tokens)
        pinned = keep + list(range(start_page, end_pages))
        slots = self.allocator.allocate(len(pinned) + s.buffer_pages)
        request.mode = Residency.SPARSE
        request.buffer = SparseBuffer(slots[len(pinned):], s.num_layers, self._max_pages(request))
        request.slots = [-1] * end_pages
        for page, slot in zip(pinned, slots):
            request.slots[page] = slot
            request.buffer.pin(page, slot)
        request.pending_fetch = [p for p in pinned if p < host_pages]
        return num_tokens

    def grow(self, request: Request, num_tokens: int) -> bool:
        """Slots for the request's new pages up to ``num_tokens`` tokens (pinned if SPARSE).
        Returns False, changing nothing, if too few slots are free."""
        needed = self._pages(num_tokens) - len(request.slots)
        if needed <= 0:
            return True
        try:
            slots = self.allocator.allocate(needed)
        except OutOfSlotsError:
            return False
        for slot in slots:
            if request.buffer is not None:
                request.buffer.pin(len(request.slots), slot)
            request.slots.append(slot)
        return True

    def release(self, request: Request) -> None:
        """Frees every slot the request holds (pinned and buffer)."""
        self.allocator.free(request.hot_slots())
        request.slots = []
        request.buffer = None
        request.mode = Residency.FULL
        request.promoting = False

    # ---- under pressure and after each step ----------------------------------------------
    def demote_one(self, running: list[Request]) -> bool:
        """Adaptive only: demotes the FULL request whose demotion frees the most slots.
        Returns False when no demotion frees anything."""
        if self.settings.policy != "adaptive":
            return False
        best, best_gain = None, 0
        for request in running:
            if request.mode is Residency.FULL:
                gain = len(self._releasable(request)) - self.settings.buffer_pages
                if gain > best_gain:
                    best, best_gain = request, gain
        if best is None:
            return False
        self._demote(best)
        return True

    def _demote(self, request: Request) -> None:
        release = self._releasable(request)
        freed = [request.slots[p] for p in release]
        buffer_slots, surplus = freed[: self.settings.buffer_pages], freed[self.settings.buffer_pages :]
        for p in release:
            request.slots[p] = -1
        request.buffer = SparseBuffer(buffer_slots, self.settings.num_layers, self._max_pages(request))
        for page, slot in enumerate(request.slots):
            if slot >= 0:
                request.buffer.pin(page, slot)
        request.mode = Residency.SPARSE
        request.promoting = False
        request.stats.num_demotions += 1
        self.allocator.free(surplus)

    def trim(self, request: Request) -> None:
        """After a step's write-back: a SPARSE request unpins pages that left its recent window."""
        if request.mode is not Residency.SPARSE or request.promoting:
            return
        pages = self._releasable(request)
        for p in pages:
            self.allocator.free([request.slots[p]])
            request.slots[p] = -1
            request.buffer.unpin(p)

    def relieve(self, running: list[Request]) -> None:
        """Before scheduling: below the low watermark, stop promotions, then demote."""
        s = self.settings
        if self.allocator.num_free_slots >= s.low_watermark_slots:
            return
        for request in running:
            if request.promoting:
                request.promoting = False
                self.trim(request)
        while self.allocator.num_free_slots < s.low_watermark_slots and self.demote_one(running):
            pass

    def promotion_step(self, running: list[Request], num_waiting: int = 0) -> list[tuple[Request, list[int]]]:
        """Adaptive only, above the high watermark and with nobody waiting (room goes to new
        requests first): gives cold pages of one SPARSE request new slots (at most
        ``promote_pages_per_step``) and returns (request, pages) to fetch; the request turns FULL
        once it has no cold page. Mutates: slots, buffer pins, modes."""
        s = self.settings
        if s.policy != "adaptive" or num_waiting:
            return []
        free = self.allocator.num_free_slots
        if free - s.promote_pages_per_step < s.low_watermark_slots:
            return []
        candidates = [r for r in running if r.mode is Residency.SPARSE]
        promoting = [r for r in candidates if r.promoting]
        if not promoting:
            affordable = [r for r in candidates
                          if free - self._num_cold(r) + s.buffer_pages >= s.high_watermark_slots]
            if not affordable or free < s.high_watermark_slots:
                return []
            promoting = [min(affordable, key=self._num_cold)]
            promoting[0].promoting = True
        request = promoting[0]
        cold = [p for p, slot in enumerate(request.slots) if slot < 0][: s.promote_pages_per_step]
        slots = self.allocator.allocate(len(cold))
        for page, slot in zip(cold, slots):
            request.slots[page] = slot
            request.buffer.pin(page, slot)
        self.num_fetched_pages += len(cold)
        return [(request, cold)]

    def finish_promotion(self, request: Request) -> None:
        """Called once the promoted pages are fetched: a request with no cold page turns FULL."""
        if request.promoting and all(slot >= 0 for slot in request.slots):
            self.allocator.free(request.buffer.slots)
            request.buffer = None
            request.mode = Residency.FULL
            request.promoting = False
            request.stats.num_promotions += 1

    @staticmethod
    def _num_cold(request: Request) -> int:
        return sum(1 for slot in request.slots if slot < 0)
