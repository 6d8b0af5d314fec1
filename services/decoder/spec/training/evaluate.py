"""Held-out acceptance length of a drafter on self-distilled sequences.

For an anchor ``a`` inside an answer (``answer_start <= a`` and ``a + S - 1 < T`` for block size
``S``), the drafter proposes ``S - 1`` tokens after ``a`` from what precedes it; since the answer
*is* the target's greedy output, greedy verification would accept the longest prefix of the draft
that equals ``tokens[a + 1 : a + S]`` and then commit one bonus token, so the acceptance length
is ``1 + leading matches`` (between 1 and ``S``). The draft network and the n-gram
prompt-lookup drafter are scored on the same anchors.

Two means of those lengths:
- ``mean_acceptance_length``: along the decoding walk (``walk_lengths``): the first anchor of the
  answer, then the anchor after what that step committed, and so on; committed tokens / verify
  steps, pooled over sequences. That is what greedy decoding with this drafter measures (tokens
  committed per verify step, bonus included, as DFlash and DSpark report it; the engine's
  ``mean_acceptance_length`` on the same sequence equals it).
- ``per_anchor_mean_acceptance_length``: every anchor weighted alike. Inside a run the walk
  accepts in one step, the anchors it skips tend to have long lengths too (8, 7, 6, ... for a copy), so this mean
  overstates what decoding measures wherever acceptance varies along the text (copy-heavy
  stretches most). Earlier checkpoints' cards reported it; it stays for comparison.
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


def walk_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """``lengths: [N]`` acceptance lengths at consecutive anchors of one sequence -> the lengths
    greedy decoding meets: it verifies at anchor 0, commits ``lengths[0]`` tokens, verifies next
    at anchor ``lengths[0]``, and so on while an anchor is left."""
    values = lengths.tolist()
    walk, i = [], 0
    while i < len(values):
        walk.append(values[i])
        i += values[i]
    return torch.tensor(walk, dtype=lengths.dtype)


def eval_anchors(length: int, answer_start: int, block_size: int) -> torch.Tensor:
    """Every anchor of the answer region whose whole block lies inside the sequence."""
    return torch.arange(max(answer_start, 1), length - block_size + 1, dtype=torch.int64)


def _truth(token_ids: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    return token_ids[anchors[:, None] + torch.arange(1, block_size, device=anchors.device)]


def summarise_lengths(per_kind: dict[str, list[torch.Tensor]]) -> dict:
    """``per_kind``: each sequence's acceptance lengths at its consecutive anchors, by prompt kind."""
    walked = {kind: [(s, walk_lengths(s)) for s in seqs] for kind, seqs in per_kind.items()}

    def means(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        every = torch.cat([s for s, _ in pairs]) if pairs else torch.zeros(0)
        walks = torch.cat([w for _, w in pairs]) if pairs else torch.zeros(0)
        nan = float("nan")
        return {"mean_acceptance_length": float(walks.float().mean()) if walks.numel() else nan,
                "verify_steps": int(walks.numel()),
                "per_anchor_mean_acceptance_length": float(every.float().mean()) if every.numel() else nan,
                "anchors": int(every.numel())}

    out = means([pair for pairs in walked.values() for pair in pairs])
    out["by_kind"] = {kind: means(pairs) for kind, pairs in sorted(walked.items())}
    return out


@torch.no_grad()
def draft_acceptance(net, embed: torch.Tensor, sequences: list[Sequence], *, anchors_per_pass: int = 64,
                     vocab: torch.Tensor | None = None) -> dict:
    """Greedy drafts of the network (the inference heads: ``net.choose``) at every answer anchor,
    from the draft vocabulary ``vocab`` when given."""
    was_training = net.training
    net.eval()
    per_kind: dict[str, list[torch.Tensor]] = {}
    try:
        for seq in sequences:
            lengths = anchor_lengths(net, embed, seq, anchors_per_pass=anchors_per_pass, vocab=vocab)
            if len(lengths):
                per_kind.setdefault(seq.kind, []).append(lengths)
    finally:
        net.train(was_training)
    return summarise_lengths(per_kind)


@torch.no_grad()
def anchor_lengths(net, embed: torch.Tensor, seq: Sequence, *, anchors_per_pass: int = 64,
                   vocab: torch.Tensor | None = None) -> torch.Tensor:
    """``[N]``: the network's acceptance length at each of ``seq``'s answer anchors
    (``eval_anchors``), its greedy drafts from ``vocab`` when given (the network in eval mode).
    The network, ``embed``, ``vocab`` and the sequence's tensors share a device; the lengths come
    back on the CPU."""
    head = embed if vocab is None else embed[vocab]
    size = net.cfg.block_size
    anchors = eval_anchors(len(seq.token_ids), seq.answer_start, size).to(seq.token_ids.device)
    features = seq.features.to(embed.dtype)
    lengths = [torch.empty(0, dtype=torch.int64, device=anchors.device)]
    for start in range(0, len(anchors), anchors_per_pass):
        part = anchors[start : start + anchors_per_pass]
        hidden = net.sequence_blocks(features, seq.token_ids, part, embed)
        drafts, _ = net.choose(hidden, seq.token_ids[part], head, vocab)
        lengths.append(acceptance_lengths(drafts, _truth(seq.token_ids, part, size)))
    return torch.cat(lengths).cpu()


def ngram_acceptance(sequences: list[Sequence], block_size: int, drafter: NgramDrafter | None = None) -> dict:
    """Prompt lookup over prompt + answer so far, on the same anchors as ``draft_acceptance``."""
    drafter = drafter or NgramDrafter()
    per_kind: dict[str, list[torch.Tensor]] = {}
    for seq in sequences:
        anchors = eval_anchors(len(seq.token_ids), seq.answer_start, block_size)
        if not len(anchors):
            continue
        token_ids = seq.token_ids.cpu()
        ids = token_ids.tolist()
        drafts = torch.full((len(anchors), block_size - 1), -1, dtype=torch.int64)
        for row, a in enumerate(anchors.tolist()):
            proposal = drafter.propose(ids[: a + 1], block_size - 1)
            if proposal:
                drafts[row, : len(proposal)] = torch.tensor(proposal, dtype=torch.int64)
        per_kind.setdefault(seq.kind, []).append(acceptance_lengths(drafts, _truth(token_ids, anchors, block_size)))
    return summarise_lengths(per_kind)
