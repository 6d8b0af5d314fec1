"""Model selection for drafter training: validation sequences and the best snapshot.

A small drafter trained on a few thousand distilled sequences overfits: its first-position
accuracy on training batches keeps rising while its acceptance on unseen prompts stalls or falls.
So the pipeline carves a validation set out of the *training* split (a fixed share of sequences,
chosen by a hash of their key, never trained on), scores the network on it every so often during
training (mean acceptance length, the same figure as the held-out evaluation), and ships the
best-scoring weights. The held-out split stays untouched by the selection, so the model card's
held-out figure is not chosen on the data it reports.
"""

from __future__ import annotations

import copy
import hashlib

import torch

from services.decoder.spec.dflash.model import DraftNet
from services.decoder.spec.training.dataset import Sequence


def validation_bucket(key: str) -> int:
    """A sequence key's bucket in ``[0, 10000)``: a hash, so every run splits alike."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:4], "big") % 10_000


def is_validation(key: str, percent: float) -> bool:
    """Whether the sequence ``key`` belongs to the validation share (``percent`` of keys)."""
    return validation_bucket(key) < percent * 100


def split_validation(train: list[Sequence], percent: float) -> tuple[list[Sequence], list[Sequence]]:
    """``(train, validation)``: the sequences of ``train`` whose key hashes into the ``percent``
    share move to validation; the split depends only on the keys (stable across runs)."""
    if not 0 <= percent < 100:
        raise ValueError(f"validation percent must be in [0, 100), got {percent}")
    keep, held = [], []
    for seq in train:
        (held if is_validation(seq.key, percent) else keep).append(seq)
    return keep, held


class BestSnapshot:
    """The validation scores seen so far (``history``: step, training minutes, score) and a copy
    of the weights that scored best (higher is better; the earliest wins ties)."""

    def __init__(self):
        self.history: list[dict] = []
        self.best_step: int | None = None
        self.best_score: float | None = None
        self.best_state: dict[str, torch.Tensor] | None = None

    def offer(self, step: int, train_minutes: float, score: float, net: DraftNet) -> bool:
        """Records a score for the weights of ``net`` at ``step``; True when they are the best."""
        self.history.append({"step": step, "train_minutes": round(train_minutes, 2), "score": round(score, 4)})
        if self.best_score is not None and score <= self.best_score:
            return False
        self.best_step, self.best_score = step, score
        self.best_state = copy.deepcopy(net.state_dict())
        return True

    def scored(self, step: int) -> bool:
        return any(h["step"] == step for h in self.history)

    def restore(self, net: DraftNet) -> None:
        if self.best_state is None:
            raise RuntimeError("no validation score was recorded")
        net.load_state_dict(self.best_state)

    def state_dict(self) -> dict:
        return {"history": self.history, "best_step": self.best_step, "best_score": self.best_score,
                "best_state": self.best_state}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state["history"])
        self.best_step, self.best_score, self.best_state = state["best_step"], state["best_score"], state["best_state"]
