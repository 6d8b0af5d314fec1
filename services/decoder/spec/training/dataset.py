"""Training and held-out sequences: distillation records joined with their stored features."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from services.decoder.spec.training.distill import read_records
from services.decoder.spec.training.features import load_features


@dataclass
class Sequence:
    key: str
    kind: str  # chat | code | doc | text
    split: str  # train | heldout
    token_ids: torch.Tensor  # [T] int64: prompt + answer
    features: torch.Tensor  # [T, len(layers) * hidden] (fp16 on disk and in memory)
    answer_start: int  # first answer position; anchors lie at or after it

    def to(self, device: torch.device | str) -> Sequence:
        """The same sequence with its tensors on ``device`` (training on a GPU keeps every
        sequence there: a few GB of fp16 features)."""
        return Sequence(self.key, self.kind, self.split, self.token_ids.to(device), self.features.to(device),
                        self.answer_start)

    def num_anchors(self, block_size: int) -> int:
        """Anchors ``a`` with ``answer_start <= a``, ``a >= 1`` and ``a + block_size - 1 < T``."""
        return max(0, len(self.token_ids) - block_size + 1 - max(self.answer_start, 1))


def load_dataset(data_dir: str | Path, layers: tuple[int, ...], block_size: int) -> tuple[list[Sequence], list[Sequence]]:
    """``(train, heldout)``: every distilled sequence whose features are extracted and that has
    at least one anchor for ``block_size``, in cache order."""
    records = read_records(data_dir)
    feats = load_features(data_dir, layers, {r.key for r in records})
    train, heldout = [], []
    for r in records:
        if r.key not in feats:
            continue
        features = feats[r.key]
        ids = torch.tensor(r.token_ids, dtype=torch.int64)
        if features.shape[0] != len(ids):
            raise ValueError(f"features of {r.key} cover {features.shape[0]} positions, the sequence has {len(ids)}")
        seq = Sequence(r.key, r.kind, r.split, ids, features, r.answer_start)
        if seq.num_anchors(block_size) > 0:
            (heldout if r.split == "heldout" else train).append(seq)
    return train, heldout
