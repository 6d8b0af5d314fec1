"""Token heads on top of the draft hidden states. All of them score with the target's own LM
head (shared, frozen) and then pick one token per drafted position, left to right:

- plain DFlash: argmax of the head's logits at each position, independently;
- DFlash2 ``CandidateSelector``: top-K candidates per position from those logits, re-scored with
  a low-rank transition term between the previous pick and each candidate (a path selector);
- DSpark ``MarkovHead``: a low-rank bilinear term over the previous token added to the logits of
  the whole vocabulary, and ``ConfidenceHead``: per position, the probability that the drafted
  token survives verification given that every earlier one did.

Shapes: ``hidden: [B, P, H]`` for ``P = block_size - 1`` drafted positions, ``logits: [B, P, V]``,
``prev: [B]`` token ids.
"""

from __future__ import annotations

import torch
from torch import nn


class LowRankTransition(nn.Module):
    """``score(prev, h, cand) = <pred[prev] * proj(h), succ[cand]>``; parameter names follow
    z-lab's DFlash2 checkpoints (codebooks stored without a ``.weight`` suffix)."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)

    def query(self, prev: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """``prev: [...]``, ``hidden: [..., H]`` -> ``[..., rank]``."""
        return self.projected_query(prev, self.hidden_projection(hidden))

    def projected_query(self, prev: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
        """``query`` from ``hidden_projection(hidden)`` already computed (``[..., rank]``)."""
        return self.predecessor_codebook[prev] * projected


class CandidateSelector(LowRankTransition):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int):
        super().__init__(vocab_size, hidden_size, rank)
        self.top_k = top_k

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor,
               vocab: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy path over ``logits: [B, P, N]`` (``N`` = V, or the ids in ``vocab``): returns
        token ids ``[B, P]`` and their probabilities under ``softmax(logits)``."""
        unary, local = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1)  # [B, P, K]
        candidates = local if vocab is None else vocab[local]
        prev = anchor_ids
        path, picks = [], []
        for pos in range(hidden.shape[1]):
            query = self.query(prev, hidden[:, pos])  # [B, rank]
            pairwise = torch.einsum("br,bkr->bk", query, self.successor_codebook[candidates[:, pos]])
            pick = torch.argmax(unary[:, pos] + pairwise, dim=-1)  # [B]
            prev = candidates[:, pos].gather(1, pick[:, None])[:, 0]
            path.append(prev)
            picks.append(local[:, pos].gather(1, pick[:, None])[:, 0])
        top_prob = torch.softmax(logits, dim=-1).gather(-1, torch.stack(picks, dim=1)[..., None])[..., 0]
        return torch.stack(path, dim=1), top_prob

    def teacher_forced(self, hidden: torch.Tensor, prev: torch.Tensor, logits: torch.Tensor,
                       vocab: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Training: the scores ``select`` gives the top-K candidates when each position's
        predecessor is the true token. ``hidden: [N, P, H]``, ``prev: [N, P]`` token ids,
        ``logits: [N, P, M]`` (``M`` = V, or the ids in ``vocab``) -> ``(scores [N, P, K],
        local [N, P, K])``: unary + pairwise per candidate and the candidates' columns in ``logits``."""
        unary, local = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1)
        candidates = local if vocab is None else vocab[local]
        pairwise = torch.einsum("npr,npkr->npk", self.query(prev, hidden), self.successor_codebook[candidates])
        return unary + pairwise, local


class MarkovHead(LowRankTransition):
    def logits(self, hidden: torch.Tensor, prev: torch.Tensor, base_logits: torch.Tensor,
               vocab: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher-forced (training) or one position (inference): ``hidden: [..., H]``,
        ``prev: [...]``, ``base_logits: [..., N]`` -> ``[..., N]`` (``N`` = V, or the ids in
        ``vocab``)."""
        successors = self.successor_codebook if vocab is None else self.successor_codebook[vocab]
        return base_logits + self.query(prev, hidden) @ successors.T

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor,
               vocab: torch.Tensor | None = None, successors: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy left to right over ``logits: [B, P, N]`` (``N`` = V, or the ids in ``vocab``);
        returns ``tokens: [B, P]`` and the picked tokens' probabilities under the
        Markov-corrected distribution ``[B, P]``. ``successors``: ``successor_codebook[vocab]``
        when the caller keeps it (a serving drafter, whose weights do not change)."""
        if successors is None:
            successors = self.successor_codebook if vocab is None else self.successor_codebook[vocab]  # [N, rank]
        prev = anchor_ids
        tokens, probs = [], []
        projected = self.hidden_projection(hidden)  # [B, P, rank]: every position's in one matmul
        for pos in range(hidden.shape[1]):
            scores = logits[:, pos] + self.projected_query(prev, projected[:, pos]) @ successors.T  # [B, N]
            top_logit, pick = scores.max(dim=-1)
            probs.append(torch.exp(top_logit - torch.logsumexp(scores, dim=-1)))
            prev = pick if vocab is None else vocab[pick]
            tokens.append(prev)
        return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)


class ConfidenceHead(nn.Module):
    """``sigmoid(w . [h, p_top] + b)``: ``p_top`` is the drafted token's own probability."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size + 1))
        self.bias = nn.Parameter(torch.zeros(1))

    def logit(self, hidden: torch.Tensor, top_prob: torch.Tensor) -> torch.Tensor:
        """``hidden: [..., H]``, ``top_prob: [...]`` -> ``[...]`` (pre-sigmoid)."""
        features = torch.cat([hidden, top_prob[..., None].to(hidden.dtype)], dim=-1)
        return (features @ self.weight.T)[..., 0] + self.bias
