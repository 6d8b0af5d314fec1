"""Sparse-attention kernels: one subpackage per op, each with ``api.py`` (validation and explicit
dispatch: CUDA -> Triton, CPU -> torch reference), ``reference.py`` and ``triton.py``.
Importing this package never imports triton; only a CUDA call loads an op's ``triton.py``.
"""

from kernels.gather_pages import gather_pages
from kernels.page_digest import page_digest, page_digest_into
from kernels.page_select import page_select
from kernels.resolve_residency import ResidencyPlan, resolve_residency
from kernels.sparse_paged_attention import sparse_paged_attention

__all__ = [
    "ResidencyPlan",
    "gather_pages",
    "page_digest",
    "page_digest_into",
    "page_select",
    "resolve_residency",
    "sparse_paged_attention",
]
