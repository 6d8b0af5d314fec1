"""Public entry point of page copies (host pool <-> hot pool, or within one pool)."""

from __future__ import annotations

import torch

from kernels.gather_pages import reference
from kernels.validation import INDEX_DTYPES, check_index_range, check_no_duplicates, check_tensor


def _page_is_contiguous(t: torch.Tensor) -> bool:
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _compute_device(src: torch.Tensor, dst: torch.Tensor) -> torch.device:
    """CPU when both are CPU; else the CUDA device, with any host side page-locked."""
    if not (src.is_cuda or dst.is_cuda):
        if src.device.type != "cpu" or dst.device.type != "cpu":
            raise ValueError(f"src and dst must be CPU or CUDA tensors, got {src.device} and {dst.device}")
        return src.device
    if src.is_cuda and dst.is_cuda and src.device != dst.device:
        raise ValueError(f"src and dst are on different CUDA devices ({src.device}, {dst.device})")
    for name, t in (("src", src), ("dst", dst)):
        if not t.is_cuda and not (t.device.type == "cpu" and t.is_pinned()):
            raise ValueError(
                f"{name} is host memory but not page-locked: pin it (pin_memory()) or register it "
                "with cudaHostRegister so the kernel can address it"
            )
    return src.device if src.is_cuda else dst.device


def gather_pages(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_idx: torch.Tensor,
    dst_idx: torch.Tensor,
    *,
    check_indices: bool = True,
) -> torch.Tensor:
    """Copy page ``src[src_idx[i]]`` to ``dst[dst_idx[i]]`` for every lane i; returns dst.

    Bit-exact copy (pages move as same-size integers), in place on dst. Lanes where both
    indices are -1 are padding and skipped. src and dst must not share memory unless no page is
    both read and written.

    Args:
        src: [num_src_pages, *page_shape], any dtype; each page contiguous.
        dst: [num_dst_pages, *page_shape], src's dtype; each page contiguous; mutated.
        src_idx: [num_copies] int32/int64 in [0, num_src_pages) or -1.
        dst_idx: [num_copies] int32/int64 in [0, num_dst_pages) or -1, distinct over valid lanes.
        check_indices: check ranges, padding agreement and distinctness (reads the index
            tensors; syncs on CUDA).

    Devices: both on CPU -> torch reference (index_select/index_copy_). Otherwise the Triton
    kernel runs on the CUDA device of src or dst; the other side may be a page-locked CPU tensor
    (``pin_memory()`` or a ``cudaHostRegister``-ed shared-memory mapping), which the kernel reads
    or writes zero-copy. The index tensors must be on that compute device.
    """
    for name, t, doc in (("src", src, "[num_src_pages, *page_shape]"), ("dst", dst, "[num_dst_pages, *page_shape]")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of shape {doc}, got {type(t).__name__}")
        if t.dim() == 0:
            raise ValueError(f"{name} must have shape {doc}, got a 0-d tensor")
    if src.dtype != dst.dtype:
        raise TypeError(f"dst must have src's dtype {src.dtype}, got {dst.dtype}")
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError(
            f"src and dst must share page_shape: src is {tuple(src.shape)}, dst is {tuple(dst.shape)}"
        )
    for name, t in (("src", src), ("dst", dst)):
        if not _page_is_contiguous(t):
            raise ValueError(f"each page of {name} must be contiguous, got strides {t.stride()}")
    check_tensor("src_idx", src_idx, shape=(None,), shape_doc="[num_copies]", dtypes=INDEX_DTYPES)
    num_copies = src_idx.shape[0]
    check_tensor("dst_idx", dst_idx, shape=(num_copies,), shape_doc=f"[num_copies={num_copies}]", dtypes=INDEX_DTYPES)
    device = _compute_device(src, dst)
    for name, idx in (("src_idx", src_idx), ("dst_idx", dst_idx)):
        if idx.device != device:
            raise ValueError(f"{name} must be on the compute device {device}, got {idx.device}")
    if check_indices and num_copies:
        check_index_range("src_idx", src_idx, high=src.shape[0], allow_padding=True, what="pages of src")
        check_index_range("dst_idx", dst_idx, high=dst.shape[0], allow_padding=True, what="pages of dst")
        if bool(((src_idx < 0) != (dst_idx < 0)).any()):
            raise ValueError("src_idx and dst_idx must be -1 on the same lanes (padding)")
        check_no_duplicates("dst_idx", dst_idx)
    if device.type == "cuda":
        from kernels.gather_pages import triton as triton_impl

        return triton_impl.gather_pages(src, dst, src_idx, dst_idx)
    return reference.gather_pages(src, dst, src_idx, dst_idx)
