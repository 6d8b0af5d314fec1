"""The decoder's hot KV pool: bounded fast memory holding pages, one tensor pair per layer.

Layout: one tensor ``storage: [num_layers, 2 (K, V), num_slots, page_size, num_kv_heads,
head_dim]``; per layer the views ``k[layer], v[layer]: [num_slots, page_size, num_kv_heads,
head_dim]`` (each contiguous).
A token's row is addressed by its flat row index ``slot * page_size + offset``.
"""

from __future__ import annotations

import torch


class HotPool:
    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        self.num_layers = num_layers
        self.num_slots = num_slots
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        # one allocation (CUDA: exportable to kvtier through one IPC handle), per-layer views
        self.storage = torch.zeros((num_layers, 2, num_slots, page_size, num_kv_heads, head_dim),
                                   dtype=dtype, device=device)
        self.k = [self.storage[layer, 0] for layer in range(num_layers)]
        self.v = [self.storage[layer, 1] for layer in range(num_layers)]

    @property
    def bytes_per_slot(self) -> int:
        element_bytes = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * element_bytes

    def k_rows(self, layer: int) -> torch.Tensor:
        """Flat row view of layer keys: ``[num_slots * page_size, num_kv_heads, head_dim]``."""
        return self.k[layer].view(-1, self.num_kv_heads, self.head_dim)

    def v_rows(self, layer: int) -> torch.Tensor:
        return self.v[layer].view(-1, self.num_kv_heads, self.head_dim)
