"""Triton page copy: one program per (copy lane), looping over the page in element blocks.

Pages are copied as same-size integers (bit-exact). On CUDA either side may be a page-locked
host tensor (``pin_memory()`` or a ``cudaHostRegister``-ed shared-memory segment): with unified
addressing its host pointer is valid on the device, so the kernel reads (or writes) host memory
zero-copy over PCIe/C2C, with no staging copy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.gather_pages.reference import as_bits


@triton.jit
def _gather_pages_kernel(
    src_ptr, dst_ptr, src_idx_ptr, dst_idx_ptr,
    page_elems, stride_src, stride_dst,
    BLOCK: tl.constexpr,
):
    lane = tl.program_id(0)
    src_row = tl.load(src_idx_ptr + lane).to(tl.int64)
    dst_row = tl.load(dst_idx_ptr + lane).to(tl.int64)
    if src_row >= 0:
        src_base = src_ptr + src_row * stride_src
        dst_base = dst_ptr + dst_row * stride_dst
        for start in range(0, page_elems, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < page_elems
            tl.store(dst_base + offs, tl.load(src_base + offs, mask=mask), mask=mask)


def gather_pages(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_idx: torch.Tensor,
    dst_idx: torch.Tensor,
    *,
    block_elems: int = 2048,
) -> torch.Tensor:
    """Launch the copy kernel; contract in ``kernels.gather_pages.api``. Returns dst.

    Each page of src and dst must be contiguous (stride 1 over the flattened page); the page
    stride itself is free.
    """
    num_copies = src_idx.shape[0]
    if num_copies == 0:
        return dst
    page_elems = src[0].numel()
    grid = (num_copies,)
    _gather_pages_kernel[grid](
        as_bits(src), as_bits(dst), src_idx.contiguous(), dst_idx.contiguous(),
        page_elems, src.stride(0), dst.stride(0),
        BLOCK=min(block_elems, triton.next_power_of_2(max(page_elems, 1))),
    )
    return dst
