"""Lossless verification of a draft block against the target's logits.

The target scores the last committed token plus ``g`` draft tokens in one pass, giving
``g + 1`` next-token distributions ``p_0 .. p_g`` (p_i conditions on the draft prefix d_1..d_i).

Greedy: accept the longest prefix of the draft that equals the target's argmax at each position,
then commit the target's own argmax at the first mismatch (or after the whole block: the bonus
token). Every committed token is exactly what plain greedy decoding would produce.

Sampling (temperature > 0): speculative rejection sampling with a point-mass proposal q = 1{d_i}.
Accept d_i with probability min(1, p_i(d_i) / q(d_i)) = p_i(d_i). On rejection, sample from the
residual max(p_i - q, 0) normalized, which is p_i with d_i's mass removed. If every draft token
is accepted, sample a bonus token from p_g. Each committed token is then distributed exactly as
under plain sampling from p (Leviathan et al. 2023; Chen et al. 2023). Here p is the truncated,
temperature-scaled distribution the plain sampler uses (``sampling_probs``).
"""

from __future__ import annotations

import torch

from services.decoder.model.sampler import sampling_probs


def accept_greedy(target_ids: list[int], draft: list[int]) -> list[int]:
    """``target_ids``: the target's argmax at each of the ``len(draft) + 1`` positions.
    Returns the committed tokens: accepted draft prefix + one target token."""
    committed = []
    for i, token in enumerate(draft):
        if target_ids[i] != token:
            break
        committed.append(token)
    committed.append(target_ids[len(committed)])
    return committed


def accept_sampled(
    logits: torch.Tensor,
    draft: list[int],
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> list[int]:
    """``logits: [len(draft) + 1, vocab]``. Returns the committed tokens (1 .. len(draft) + 1)."""
    committed = []
    for i, token in enumerate(draft):
        probs = sampling_probs(logits[i], temperature, top_k, top_p)  # [vocab]
        accept_prob = float(probs[token])
        if float(torch.rand((), generator=generator)) < accept_prob:
            committed.append(token)
            continue
        residual = probs.clone()
        residual[token] = 0.0
        committed.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return committed
    probs = sampling_probs(logits[len(draft)], temperature, top_k, top_p)
    committed.append(int(torch.multinomial(probs, 1, generator=generator)))
    return committed
