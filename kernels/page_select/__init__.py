"""Quest page selection per query token: sink + top-k by digest upper bound + recent window."""

from kernels.page_select.api import page_select

__all__ = ["page_select"]
