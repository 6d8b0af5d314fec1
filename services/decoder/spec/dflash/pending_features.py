"""The DFlash drafter's observed, not yet projected target features (``drafter.py``: observation
is lazy, the ring is filled when a request next drafts).

Every request's pending rows live in one buffer ``[capacity, feature_size]`` shared by all
requests; a request holds the buffer rows of its contiguous positions up to ``end``, at most
the last ``window`` (what its ring would keep). The kept rows of a batch of steps (the drafter
hands them over every few steps) are written with one ``index_copy_`` for all their requests and
taken out per request with one ``index_select``: per request and step the store does Python
bookkeeping only. A ``clone`` per request per step cost a resting drafter ~0.23 ms of a 66 ms
c=16 step, about half of what an adaptive engine whose gate never drafts lost to no speculation.

The buffer grows (doubling) to the peak of rows held at once and keeps that size: about
``window`` rows per request that rests (1,024 x 1,728 fp32 features, 7 MB, for the shipped
drafters).
"""

from __future__ import annotations

from collections import deque

import torch


class _Held:
    """One request's pending positions: ``rows`` (buffer row ids) are positions ``end - len(rows) .. end``."""

    __slots__ = ("end", "rows")

    def __init__(self, start: int):
        self.end = start
        self.rows: deque[int] = deque()


class PendingFeatures:
    INITIAL_ROWS = 256

    def __init__(self, window: int):
        self.window = window
        self.buffer: torch.Tensor | None = None  # [capacity, feature_size], the first features' dtype
        self.free: list[int] = []  # buffer rows no request holds
        self.held: dict[str, _Held] = {}

    def add_step(self, features: torch.Tensor, items: list[tuple[str, int, int, int]]) -> list[tuple[str, int, bool]]:
        """``features: [rows, feature_size]``, one or more steps'; ``items``: (request, first
        position, first row, number of rows) in step order, the rows being its positions
        ``first .. first + n``. A request's first position other than its pending end starts its
        pending anew (a jump). Returns the chains started: (request, first position, whether it
        replaced pending rows). (A decode step's one row per request takes the short path.)"""
        window = self.window
        sources: list[int] = []
        for _, _, first_row, num_rows in items:
            if num_rows == 1:
                sources.append(first_row)
            else:
                sources.extend(range(first_row + max(num_rows - window, 0), first_row + num_rows))
        if not sources:
            return []
        targets = self._allocate(len(sources), features)
        if sources != list(range(len(features))):
            features = features.index_select(0, torch.tensor(sources))  # a decode step's rows are whole
        self.buffer.index_copy_(0, torch.tensor(targets), features)
        held_by, free = self.held, self.free
        offset, started = 0, []
        for request_id, start, _, num_rows in items:
            held = held_by.get(request_id)
            if held is None or held.end != start:
                started.append((request_id, start, held is not None))
                if held is not None:
                    free.extend(held.rows)
                held = held_by[request_id] = _Held(start)
            held.end = start + num_rows
            rows = held.rows
            if num_rows == 1:
                rows.append(targets[offset])
                offset += 1
                if len(rows) > window:
                    free.append(rows.popleft())
                continue
            kept = min(num_rows, window)
            if num_rows >= window:
                free.extend(rows)
                rows.clear()
            rows.extend(targets[offset : offset + kept])
            offset += kept
            while len(rows) > window:
                free.append(rows.popleft())
        return started

    def take(self, request_id: str) -> tuple[int, torch.Tensor] | None:
        """``(start, [n, feature_size])``: the request's pending rows, positions ``start .. end``
        (a copy); they leave the store. None: nothing pending."""
        held = self.held.pop(request_id, None)
        if held is None or not held.rows:
            return None
        rows = list(held.rows)
        self.free.extend(rows)
        return held.end - len(rows), self.buffer.index_select(0, torch.tensor(rows))

    def drop(self, request_id: str) -> None:
        held = self.held.pop(request_id, None)
        if held is not None:
            self.free.extend(held.rows)

    def num_rows(self, request_id: str) -> int:
        held = self.held.get(request_id)
        return 0 if held is None else len(held.rows)

    def _allocate(self, count: int, features: torch.Tensor) -> list[int]:
        """``count`` free buffer rows (the buffer doubles until they are there)."""
        if self.buffer is None:
            self.buffer = features.new_empty((0, features.shape[1]))
        capacity = self.buffer.shape[0]
        if len(self.free) < count:
            grown = max(2 * capacity, capacity + count - len(self.free), self.INITIAL_ROWS)
            self.buffer = torch.cat([self.buffer, self.buffer.new_empty((grown - capacity, self.buffer.shape[1]))])
            self.free.extend(range(grown - 1, capacity - 1, -1))  # low rows first out of ``pop``
        rows = self.free[-count:]
        del self.free[-count:]
        return rows
