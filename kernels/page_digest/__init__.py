"""Per-page key digest (Quest): elementwise min/max of keys over a sealed page."""

from kernels.page_digest.api import page_digest, page_digest_into

__all__ = ["page_digest", "page_digest_into"]
