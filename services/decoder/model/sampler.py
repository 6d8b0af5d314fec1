"""Token sampling: greedy, temperature, top-k, top-p, with a per-request seeded generator.

Reproducibility: a request with a seed draws from its own ``torch.Generator``, so its tokens do
not depend on what else is in the batch.
"""

from __future__ import annotations

import torch


def sample_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None) -> int:
    """``logits: [vocab]`` fp32 -> one token id."""
    if temperature == 0.0:
        return int(torch.argmax(logits))
    probs = sampling_probs(logits, temperature, top_k, top_p)
    return int(torch.multinomial(probs, 1, generator=generator))


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """The distribution actually sampled from: ``[vocab]`` probabilities after temperature,
    top-k and top-p (nucleus) truncation, renormalized. Also what speculative rejection sampling
    must compare against."""
    scaled = logits.float() / temperature
    if top_k and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p (keeps >= 1 token)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.softmax(scaled, dim=-1)
