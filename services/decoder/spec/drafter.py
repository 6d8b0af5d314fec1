"""The drafter interface: propose a block of tokens that the target verifies in one pass."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Drafter(ABC):
    """Proposes draft tokens for one request. Drafts are deterministic (point-mass proposals), so
    verification compares against the target's distribution alone (see ``verify.py``)."""

    name: str

    @abstractmethod
    def propose(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """``token_ids``: the request's prompt + output so far. Returns at most ``max_tokens``
        draft tokens continuing it (possibly none). Mutates nothing."""


def make_drafter(kind: str, **kwargs) -> Drafter | None:
    """``none`` -> None; ``ngram`` -> NgramDrafter(**kwargs)."""
    if kind == "none":
        return None
    if kind == "ngram":
        from services.decoder.spec.ngram import NgramDrafter

        return NgramDrafter(**kwargs)
    raise ValueError(f"unknown drafter {kind!r} (available: none, ngram)")
