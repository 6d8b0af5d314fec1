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
    if storage.is_cuda:
        src = torch.tensor(slots, dtype=torch.int64, device=storage.device)
        dst = torch.tensor(host_ids, dtype=torch.int64, device=storage.device)
        for layer in range(storage.shape[0]):
            for kv in (0, 1):
                gather_pages(storage[layer, kv], host[:, layer, kv], src, dst, check_indices=False)
        return
    for slot, host_id in zip(slots, host_ids):
        host[host_id].copy_(storage[:, :, slot])


def from_host(host: torch.Tensor, storage: torch.Tensor, host_ids: list[int], slots: list[int]) -> None:
    """Copies host pages ``host_ids`` into hot ``slots`` (same length)."""
    if storage.is_cuda:
        src = torch.tensor(host_ids, dtype=torch.int64, device=storage.device)
        dst = torch.tensor(slots, dtype=torch.int64, device=storage.device)
        for layer in range(storage.shape[0]):
            for kv in (0, 1):
                gather_pages(host[:, layer, kv], storage[layer, kv], src, dst, check_indices=False)
        return
    for host_id, slot in zip(host_ids, slots):
        storage[:, :, slot].copy_(host[host_id])
