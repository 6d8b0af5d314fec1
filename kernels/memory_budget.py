"""How many rows of work fit in the reference path's temporary-memory budget.

The torch references gather per-token data (selected pages, candidate digests). They process
tokens in chunks so that one chunk's temporaries stay near ``TEMP_BUDGET_BYTES``; the chunk size
depends only on the per-token cost, never on how many tokens the batch holds.
"""

TEMP_BUDGET_BYTES = 64 * 2**20


def rows_per_chunk(bytes_per_row: int, budget_bytes: int = TEMP_BUDGET_BYTES) -> int:
    """Rows per chunk (at least 1) so that ``rows * bytes_per_row <= budget_bytes`` when possible."""
    return max(1, budget_bytes // max(1, bytes_per_row))
