"""Attention of each query token over exactly its own selected pages of the hot pool."""

from kernels.sparse_paged_attention.api import sparse_paged_attention

__all__ = ["sparse_paged_attention"]
