"""Page copies between pools: ``dst[dst_idx[i]] = src[src_idx[i]]``."""

from kernels.gather_pages.api import gather_pages

__all__ = ["gather_pages"]
