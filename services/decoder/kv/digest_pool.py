"""Page digests (Quest): per sealed page, per layer, per kv head, the elementwise min and max of
its keys. Digests of every page of every request stay in fast memory.

Layout per layer: ``min[layer], max[layer]: [num_rows, num_kv_heads, head_dim]``. While every page
is hot (this pool is indexed like the hot pool) a digest row is the page's slot.
"""

from __future__ import annotations

import torch

from kernels import page_digest_into


class DigestPool:
    def __init__(self, num_layers: int, num_rows: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype):
        shape = (num_rows, num_kv_heads, head_dim)
        self.min = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.max = [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim

    def seal(self, layer: int, k_pool_layer: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Digests the full pages at ``slots: [n]`` of ``k_pool_layer: [num_slots, page_size, KVH, D]``
        into ``rows: [n]``. Mutates: this layer's digest rows."""
        page_digest_into(k_pool_layer, slots, self.min[layer], self.max[layer], rows, check_indices=False)

    def gather(self, layer: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows: [batch, max_pages]`` digest rows in logical page order -> min, max
        ``[batch, max_pages, KVH, D]``."""
        flat = rows.reshape(-1)
        shape = (*rows.shape, self.num_kv_heads, self.head_dim)
        return (
            torch.index_select(self.min[layer], 0, flat).view(shape),
            torch.index_select(self.max[layer], 0, flat).view(shape),
        )
