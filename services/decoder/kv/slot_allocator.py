"""Allocator of hot-pool slots (one slot = one page-sized place, same index in every layer).

Free slots form a FIFO queue: ``allocate`` takes from the front, ``free`` appends to the back in
the order given. At start the queue is ``0, 1, ..., num_slots - 1``. Allocation is all-or-nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class OutOfSlotsError(RuntimeError):
    """Not enough free slots for an all-or-nothing allocation; nothing was allocated."""


class SlotAllocator:
    def __init__(self, num_slots: int):
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self.num_slots = num_slots
        self._free: deque[int] = deque(range(num_slots))
        self._is_free = bytearray(b"\x01") * num_slots

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def num_used_slots(self) -> int:
        return self.num_slots - len(self._free)

    def allocate(self, num_slots: int) -> list[int]:
        """Takes ``num_slots`` slots from the front of the free queue. Mutates: the free queue.
        Raises ``OutOfSlotsError`` (and changes nothing) if fewer are free."""
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        if num_slots > len(self._free):
            raise OutOfSlotsError(f"asked for {num_slots} slots, {len(self._free)} free")
        slots = [self._free.popleft() for _ in range(num_slots)]
        for slot in slots:
            self._is_free[slot] = 0
        return slots

    def free(self, slots: Iterable[int]) -> None:
        """Returns ``slots`` to the back of the free queue, in order. Mutates: the free queue.
        Raises ``ValueError`` (and changes nothing) on an out-of-range, duplicate or already free slot."""
        slots = list(slots)
        if len(set(slots)) != len(slots):
            raise ValueError(f"duplicate slot in free(): {slots}")
        for slot in slots:
            if not 0 <= slot < self.num_slots:
                raise ValueError(f"slot {slot} out of range [0, {self.num_slots})")
            if self._is_free[slot]:
                raise ValueError(f"slot {slot} is already free (double free)")
        for slot in slots:
            self._is_free[slot] = 1
            self._free.append(slot)

    def free_slot_order(self) -> list[int]:
        return list(self._free)

    def check_integrity(self) -> bool:
        """Free queue holds distinct in-range slots exactly matching the free bitmap."""
        seen = set(self._free)
        assert len(seen) == len(self._free), "duplicate slot in free queue"
        assert all(0 <= s < self.num_slots for s in seen), "out-of-range slot in free queue"
        for slot in range(self.num_slots):
            assert bool(self._is_free[slot]) == (slot in seen), f"free bitmap disagrees for slot {slot}"
        return True
