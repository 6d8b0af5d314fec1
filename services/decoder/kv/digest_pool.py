"""Page digests: per sealed page, per layer, per kv head, what page selection scores the page by.
The digest of every page of every live request stays in fast memory, whether or not the page
itself is hot: a SPARSE request scores all its pages by digest and fetches the winners.

What a row holds follows the page score (``kernels.page_select``): ``"quest"`` keeps the
elementwise min and max of the page's keys (tables ``digest_min``, ``digest_max``); ``"center"``
keeps only their box center ``(min + max) / 2`` (table ``digest_center``), computed once at seal
time, so a decode step reads one table and adds nothing.

Layout per table and layer: ``[num_rows, num_kv_heads, head_dim]``. Rows belong to (request,
logical page) pairs, not to hot slots: ``Request.digest_rows[page]`` names the row. The pool
grows (doubling) when a request needs rows and none is free; rows come back when a request
finishes. A digest row is ``page_size`` (center) or ``page_size / 2`` (quest) times smaller than
the page it summarises.
"""

from __future__ import annotations

import torch

from kernels import page_digest, page_digest_into
from kernels.page_select.reference import box_center

TABLES = {"quest": ("digest_min", "digest_max"), "center": ("digest_center",)}


class DigestPool:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, num_rows: int = 256,
                 page_score: str = "center"):
        if num_rows <= 0:
            raise ValueError(f"num_rows must be positive, got {num_rows}")
        if page_score not in TABLES:
            raise ValueError(f"page_score must be one of {tuple(TABLES)}; got {page_score!r}")
        shape = (num_rows, num_kv_heads, head_dim)
        self.page_score = page_score
        # table name (a page_select keyword) -> per layer [num_rows, num_kv_heads, head_dim]
        self.tables = {name: [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
                       for name in TABLES[page_score]}
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self._free: list[int] = list(range(num_rows - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._is_free = bytearray(b"\x01") * num_rows

    @property
    def num_rows(self) -> int:
        return next(iter(self.tables.values()))[0].shape[0]

    @property
    def num_free_rows(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        """``count`` free rows, growing every layer's tensors first if too few are free."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if count > len(self._free):
            self._grow(max(self.num_rows * 2, self.num_rows + count - len(self._free)))
        rows = [self._free.pop() for _ in range(count)]
        for row in rows:
            self._is_free[row] = 0
        return rows

    def free(self, rows: list[int]) -> None:
        """Returns ``rows``; raises ``ValueError`` (changing nothing) on a free or foreign row."""
        if len(set(rows)) != len(rows) or any(not 0 <= r < self.num_rows or self._is_free[r] for r in rows):
            raise ValueError(f"free() of rows that are not all allocated and distinct: {rows}")
        for row in rows:
            self._is_free[row] = 1
        self._free.extend(reversed(rows))

    def _grow(self, num_rows: int) -> None:
        old = self.num_rows
        for table in self.tables.values():
            for layer, tensor in enumerate(table):
                grown = tensor.new_zeros((num_rows, self.num_kv_heads, self.head_dim))
                grown[:old] = tensor
                table[layer] = grown
        self._is_free.extend(b"\x01" * (num_rows - old))
        self._free[:0] = range(num_rows - 1, old - 1, -1)  # new rows after the old free ones

    def seal(self, layer: int, k_source: torch.Tensor, pages: torch.Tensor, rows: torch.Tensor) -> None:
        """Digests the full pages ``pages: [n]`` of ``k_source: [num_pages, page_size, KVH, D]``
        (a layer of the hot pool, or of the host pool) into ``rows: [n]``. Mutates: this layer's rows."""
        if self.page_score == "quest":
            tables = self.tables
            page_digest_into(k_source, pages, tables["digest_min"][layer], tables["digest_max"][layer], rows,
                             check_indices=False)
            return
        center = self.tables["digest_center"][layer]
        k_min, k_max = page_digest(k_source, pages, check_indices=False)  # [n, KVH, D]
        center.index_copy_(0, rows.to(center.device).long(), box_center(k_min, k_max).to(center.dtype))

    def gather(self, layer: int, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """``rows: [batch, max_pages]`` digest rows in logical page order -> ``page_select``'s
        digest keywords (``digest_min``/``digest_max``, or ``digest_center``), each
        ``[batch, max_pages, KVH, D]``."""
        flat = rows.reshape(-1)
        shape = (*rows.shape, self.num_kv_heads, self.head_dim)
        return {name: torch.index_select(table[layer], 0, flat).view(shape) for name, table in self.tables.items()}

    def check_integrity(self, held: list[int]) -> bool:
        """``held`` (rows of live requests) and the free rows partition the pool exactly."""
        assert len(held) == len(set(held)), "a digest row is held twice"
        assert len(self._free) == len(set(self._free)), "a digest row is free twice"
        assert set(held).isdisjoint(self._free), "a held digest row is also free"
        assert len(held) + len(self._free) == self.num_rows, "digest rows leaked"
        return True
