"""Torch reference for page copies (oracle and CPU serving path)."""

from __future__ import annotations

import torch

from kernels.memory_budget import rows_per_chunk

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """Same-size integer view of ``t`` so that copies move bits, never values (NaN payloads)."""
    return t.view(_INT_OF_SIZE[t.element_size()])


def gather_pages(
    src: torch.Tensor, dst: torch.Tensor, src_idx: torch.Tensor, dst_idx: torch.Tensor
) -> torch.Tensor:
    """Copy ``src[src_idx[i]] -> dst[dst_idx[i]]`` in place on dst; lanes with -1 are skipped.

    src: [num_src_pages, *page_shape]; dst: [num_dst_pages, *page_shape]; src_idx, dst_idx:
    [num_copies]. Copies in chunks of about the memory budget (index_select + index_copy_).
    """
    keep = src_idx >= 0
    src_rows = src_idx[keep].long()  # [num_valid]
    dst_rows = dst_idx[keep].long()
    src_bits, dst_bits = as_bits(src), as_bits(dst)
    page_bytes = max(1, src[0].numel() * src.element_size()) if src.shape[0] else 1
    chunk = rows_per_chunk(page_bytes)
    for start in range(0, src_rows.numel(), chunk):
        pages = src_bits.index_select(0, src_rows[start : start + chunk])  # [c, *page_shape]
        dst_bits.index_copy_(0, dst_rows[start : start + chunk], pages)
    return dst
