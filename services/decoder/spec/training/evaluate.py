"""Held-out acceptance length of a drafter on self-distilled sequences.

For an anchor ``a`` inside an answer (``answer_start <= a`` and ``a + S - 1 < T`` for block size
``S``), the drafter proposes ``S - 1`` tokens after ``a`` from what precedes it; since the answer
*is* the target's greedy output, greedy verification would accept the longest prefix of the draft
that equals ``tokens[a + 1 : a + S]`` and then commit one bonus token, so the acceptance length
is ``1 + leading matches`` (between 1 and ``S``), as DFlash and DSpark report it. The draft
network and the n-gram prompt-lookup drafter are scored on the same anchors.
"""

from __future__ import annotations

import torch

from services.decoder.spec.ngram import NgramDrafter
from services.decoder.spec.training.dataset import Sequence


def acceptance_lengths(drafts: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``drafts, truth: [N, P]`` -> ``[N]``: 1 + the number of leading positions where they agree.
    A draft shorter than ``P`` is padded by the caller with ``-1`` (never a token)."""
    if drafts.shape != truth.shape:
        raise ValueError(f"drafts {tuple(drafts.shape)} and truth {tuple(truth.shape)} differ in shape")
    return 1 + torch.cumprod((drafts == truth).to(torch.int64), dim=1).sum(dim=1)


def eval_anchors(length: int, answer_start: int, block_size: int) -> torch.Tensor:
    """Every anchor of the answer region whose whole block lies inside the sequence."""
    return torch.arange(max(answer_start, 1), length - block_size + 1, dtype=torch.int64)


def _truth(token_ids: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    return token_ids[anchors[:, None] + torch.arange(1, block_size)]


def _summarise(per_kind: dict[str, list[torch.Tensor]]) -> dict:
    every = torch.cat([t for ts in per_kind.values() for t in ts]) if per_kind else torch.zeros(0)
    out = {"mean_acceptance_length": float(every.float().mean()) if every.numel() else float("nan"),
           "anchors": int(every.numel()), "by_kind": {}}
    for kind, ts in sorted(per_kind.items()):
        cat = torch.cat(ts)
        out["by_kind"][kind] = {"mean_acceptance_length": float(cat.float().mean()), "anchors": int(cat.numel())}
    return out


@torch.no_grad()
def draft_acceptance(net, embed: torch.Tensor, sequences: list[Sequence], *, anchors_per_pass: int = 64,
                     vocab: torch.Tensor | None = None) -> dict:
    """Greedy drafts of the network (the inference heads: ``net.choose``) at every answer anchor,
    from the draft vocabulary ``vocab`` when given."""
    head = embed if vocab is None else embed[vocab]
    size = net.cfg.block_size
    was_training = net.training
    net.eval()
    per_kind: dict[str, list[torch.Tensor]] = {}
    try:
        for seq in sequences:
            anchors = eval_anchors(len(seq.token_ids), seq.answer_start, size)
            features = seq.features.to(embed.dtype)
            for start in range(0, len(anchors), anchors_per_pass):
                part = anchors[start : start + anchors_per_pass]
                hidden = net.sequence_blocks(features, seq.token_ids, part, embed)
                drafts, _ = net.choose(hidden, seq.token_ids[part], head, vocab)
                per_kind.setdefault(seq.kind, []).append(acceptance_lengths(drafts, _truth(seq.token_ids, part, size)))
    finally:
        net.train(was_training)
    return _summarise(per_kind)


def ngram_acceptance(sequences: list[Sequence], block_size: int, drafter: NgramDrafter | None = None) -> dict:
    """Prompt lookup over prompt + answer so far, on the same anchors as ``draft_acceptance``."""
    drafter = drafter or NgramDrafter()
    per_kind: dict[str, list[torch.Tensor]] = {}
    for seq in sequences:
        anchors = eval_anchors(len(seq.token_ids), seq.answer_start, block_size)
        if not len(anchors):
            continue
        ids = seq.token_ids.tolist()
        drafts = torch.full((len(anchors), block_size - 1), -1, dtype=torch.int64)
        for row, a in enumerate(anchors.tolist()):
            proposal = drafter.propose(ids[: a + 1], block_size - 1)
            if proposal:
                drafts[row, : len(proposal)] = torch.tensor(proposal, dtype=torch.int64)
        per_kind.setdefault(seq.kind, []).append(acceptance_lengths(drafts, _truth(seq.token_ids, anchors, block_size)))
    return _summarise(per_kind)
