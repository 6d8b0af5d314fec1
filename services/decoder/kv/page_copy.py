"""Whole-page copies (every layer, K and V) between the hot pool and the host pool.

    hot:  storage [num_layers, 2, num_slots, page_size, num_kv_heads, head_dim]
    host: pool    [num_host_pages, num_layers, 2, page_size, num_kv_heads, head_dim]  (kvtier's shm)

CPU: one strided copy per page (its num_layers x 2 chunks in one call): measured 0.90 of a plain
memcpy of the same bytes on 2 cores, where one ``gather_pages`` call per layer and K/V reached
0.57 (``benchmarks/transfer.py``). CUDA: ``gather_pages`` (Triton) per layer and K/V, reading and
writing the CUDA-registered host pool zero-copy (0.90-0.93 of memcpy on an H200).
"""

from __future__ import annotations

import torch

from kernels import gather_pages


def to_host(storage: torch.Tensor, host: torch.Tensor, slots: list[int], host_ids: list[int]) -> None:
    """Copies hot ``slots`` into host pages ``host_ids`` (same length)."""
    _copy(storage, host, slots, host_ids, to_host=True)


def from_host(host: torch.Tensor, storage: torch.Tensor, host_ids: list[int], slots: list[int]) -> None:
    """Copies host pages ``host_ids`` into hot ``slots`` (same length)."""
    _copy(storage, host, slots, host_ids, to_host=False)


def _copy(storage: torch.Tensor, host: torch.Tensor, slots: list[int], host_ids: list[int], to_host: bool) -> None:
    if storage.is_cuda:
        hot_idx = torch.tensor(slots, dtype=torch.int64, device=storage.device)
        host_idx = torch.tensor(host_ids, dtype=torch.int64, device=storage.device)
        for layer in range(storage.shape[0]):
            for kv in (0, 1):
                hot_layer, host_layer = storage[layer, kv], host[:, layer, kv]
                if to_host:
                    gather_pages(hot_layer, host_layer, hot_idx, host_idx, check_indices=False)
                else:
                    gather_pages(host_layer, hot_layer, host_idx, hot_idx, check_indices=False)
        return
    for slot, host_id in zip(slots, host_ids):
        if to_host:
            host[host_id].copy_(storage[:, :, slot])
        else:
            storage[:, :, slot].copy_(host[host_id])
