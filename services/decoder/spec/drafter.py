"""The drafter interface: propose blocks of tokens that the target verifies in one pass.

Drafts are deterministic (point-mass proposals), so verification compares against the target's
distribution alone (see ``verify.py``) and stays lossless for greedy and sampled requests.

A drafter that conditions on the target (DFlash, DSpark) names the target layers whose outputs
it needs (``feature_layers``); the engine then hands it, after every step, the concatenated
hidden states of each request's newly committed positions (``observe``), never those of
rejected draft rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

LEARNED_DRAFTERS = ("dflash", "dflash2", "dspark")  # checkpoint drafters; each ships one for the default model
SPEC_METHODS = ("none", "ngram", *LEARNED_DRAFTERS)  # DecoderConfig.spec and every --spec flag


@dataclass
class DraftRequest:
    request_id: str
    token_ids: list[int]  # prompt + output so far; the last one is the anchor (not yet computed)
    max_tokens: int  # draft at most this many tokens

    @property
    def anchor_position(self) -> int:
        return len(self.token_ids) - 1


@dataclass
class Draft:
    tokens: list[int]
    # per-position probability that the token survives given its prefix did (DSpark), or None
    confidences: list[float] | None = None


class Drafter(ABC):
    name: str
    feature_layers: tuple[int, ...] = ()  # target layers whose outputs ``observe`` receives
    # per-position survival the adaptive budget assumes before it has measured any draft: a
    # guess here; a trained drafter replaces it with its measured held-out acceptance
    prior_acceptance: float = 0.7
    # whether its drafts carry per-position survival confidences (``Draft.confidences``)
    has_confidences: bool = False

    @abstractmethod
    def propose_batch(self, requests: list[DraftRequest]) -> list[Draft]:
        """One draft per request (possibly empty). Mutates nothing the target owns."""

    def observe(self, request_id: str, start: int, features: torch.Tensor) -> None:
        """``features: [n, len(feature_layers) * hidden]``: the target's hidden states after each
        of ``feature_layers`` at the committed positions ``start .. start + n``."""

    def observe_batch(self, features: torch.Tensor, items: list[tuple[str, int, int, int]]) -> None:
        """``observe`` for every request of a step: ``features``, the step's, and ``items``: (request
        id, start, first row, number of rows), the rows of its positions ``start ..``; drafters may
        batch it. ``features`` is a tensor the step made for this call (the engine never writes it
        again), so a drafter may keep it instead of copying."""
        for request_id, start, first_row, num_rows in items:
            self.observe(request_id, start, features[first_row : first_row + num_rows])

    def prepare(self, request_ids: list[str]) -> int:
        """Brings the requests' draft context up to date with what they observed (a drafter that
        defers that work until it drafts) and returns how many context positions that took in. The
        engine calls it just before ``propose_batch`` and prices the call without it (the backlog
        is owed whether this step drafts or a later one does); the start-up profile calls it
        before timing, for the same reason."""
        return 0

    def release(self, request_id: str) -> None:
        """Forgets a finished or aborted request."""


def make_drafter(kind: str, target=None, **kwargs) -> Drafter | None:
    """``none`` -> None; ``ngram`` -> ``NgramDrafter(**kwargs)``; ``dflash`` / ``dflash2`` /
    ``dspark`` -> ``DFlashDrafter`` on the checkpoint ``kwargs['checkpoint']`` for ``target`` (a
    LlamaModel), its matmuls in ``kwargs.get('gemm_dtype')`` (None: the target's)."""
    if kind == "none":
        return None
    if kind == "ngram":
        from services.decoder.spec.ngram import NgramDrafter

        return NgramDrafter(**kwargs)
    if kind in LEARNED_DRAFTERS:
        from services.decoder.spec.dflash.drafter import DFlashDrafter

        if target is None:
            raise ValueError(f"the {kind} drafter needs the target model")
        return DFlashDrafter.from_checkpoint(kwargs["checkpoint"], target, expected_kind=kind,
                                             gemm_dtype=kwargs.get("gemm_dtype"))
    raise ValueError(f"unknown drafter {kind!r} (available: {', '.join(SPEC_METHODS)})")
