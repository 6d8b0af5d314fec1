"""Prompt-lookup drafting: find the most recent earlier occurrence of the context's last n
tokens (n from ``max_n`` down to ``min_n``) in prompt + output, and propose what followed it."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from services.decoder.spec.drafter import Draft, Drafter, DraftRequest


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n

    def propose_batch(self, requests: list[DraftRequest]) -> list[Draft]:
        return [Draft(self.propose(r.token_ids, r.max_tokens)) for r in requests]

    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        length = len(token_ids)
        if max_tokens <= 0 or length < self.min_n + 1:
            return []
        ids = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = ids[length - n :]
            # windows starting at 0 .. length - n - 1: each is followed by at least one token
            windows = sliding_window_view(ids[: length - 1], n)  # [length - n, n]
            matches = np.flatnonzero((windows == suffix).all(axis=1))
            if matches.size:
                start = int(matches[-1]) + n
                return token_ids[start : start + max_tokens]
        return []
