"""Allocator of host pages (one host page id = one page of one request, every layer, K and V).

Free pages form a FIFO queue: ``allocate`` takes from the front, ``free`` appends to the back in
the order given. A fresh pool's queue is ``0, 1, ..., num_host_pages - 1``; a pool restored after a
restart (``used_pages`` given) queues its free pages in ascending order. Allocation is
all-or-nothing; every method that raises changes nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class OutOfHostPagesError(RuntimeError):
    """Not enough free host pages for an all-or-nothing allocation; nothing was allocated."""


class HostPageAllocator:
    def __init__(self, num_host_pages: int, used_pages: Iterable[int] = ()):
        if num_host_pages <= 0:
            raise ValueError(f"num_host_pages must be positive, got {num_host_pages}")
        self.num_host_pages = num_host_pages
        self._is_free = bytearray(b"\x01") * num_host_pages
        for page in used_pages:
            if not 0 <= page < num_host_pages:
                raise ValueError(f"used host page {page} out of range [0, {num_host_pages})")
            if not self._is_free[page]:
                raise ValueError(f"host page {page} is used twice")
            self._is_free[page] = 0
        self._free: deque[int] = deque(p for p in range(num_host_pages) if self._is_free[p])

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    @property
    def num_used_pages(self) -> int:
        return self.num_host_pages - len(self._free)

    def peek(self, num_pages: int) -> list[int]:
        """The ids that ``allocate(num_pages)`` would return now. Mutates nothing."""
        self._check_count(num_pages)
        return [self._free[i] for i in range(num_pages)]

    def allocate(self, num_pages: int) -> list[int]:
        """Takes ``num_pages`` pages from the front of the free queue. Mutates: the free queue.
        Raises ``OutOfHostPagesError`` (and changes nothing) if fewer are free."""
        self._check_count(num_pages)
        pages = [self._free.popleft() for _ in range(num_pages)]
        for page in pages:
            self._is_free[page] = 0
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Returns ``pages`` to the back of the free queue, in order. Mutates: the free queue.
        Raises ``ValueError`` (and changes nothing) on an out-of-range, duplicate or free page."""
        pages = list(pages)
        if len(set(pages)) != len(pages):
            raise ValueError(f"duplicate host page in free(): {pages}")
        for page in pages:
            if not 0 <= page < self.num_host_pages:
                raise ValueError(f"host page {page} out of range [0, {self.num_host_pages})")
            if self._is_free[page]:
                raise ValueError(f"host page {page} is already free (double free)")
        for page in pages:
            self._is_free[page] = 1
            self._free.append(page)

    def is_free(self, page: int) -> bool:
        return bool(self._is_free[page])

    def free_page_order(self) -> list[int]:
        return list(self._free)

    def check_integrity(self) -> bool:
        """The free queue holds distinct in-range pages exactly matching the free bitmap."""
        seen = set(self._free)
        assert len(seen) == len(self._free), "duplicate page in free queue"
        assert all(0 <= p < self.num_host_pages for p in seen), "out-of-range page in free queue"
        for page in range(self.num_host_pages):
            assert bool(self._is_free[page]) == (page in seen), f"free bitmap disagrees for host page {page}"
        return True

    def _check_count(self, num_pages: int) -> None:
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if num_pages > len(self._free):
            raise OutOfHostPagesError(f"asked for {num_pages} host pages, {len(self._free)} free")
