"""Torch reference for page selection (oracle and CPU serving path).

Split into pieces that the Triton path reuses except for the per-page arithmetic:
``candidate_bounds`` (where sink, candidates and recent window lie), ``page_scores`` (the score
of every candidate page: ``quest_scores`` / ``center_scores``; the Triton path has its own
kernels for the Quest bound and the center logits, and ``center_mass`` for their softmax) and
``select_from_scores`` (deterministic top-k and assembly of the sorted union).

Two scores (``score=``):
- ``"quest"``: the Quest upper bound of ``q . k`` over the page's key bounding box, summed over
  all heads.
- ``"center"``: the estimated attention mass of the page: per query head, the logit of the
  bounding box's center ``(min + max) / 2`` scaled by ``1 / sqrt(head_dim)``, a softmax over the
  token's candidate pages, summed over heads. It reads only the box centers (a center digest
  the decoder keeps at seal time, or ``box_center(min, max)``). On SmolLM2-135M (8K stdlib documents, top-k 2048
  tokens) perplexity rises 0.89% over dense with it, 2.80% with ``quest``
  (``benchmarks/sparse_quality``): the bound is loose and unnormalized sums let a few heads
  with large logits choose for all.
"""

from __future__ import annotations

import math

import torch

from kernels.memory_budget import rows_per_chunk

SCORES = ("quest", "center")


def candidate_bounds(
    token_pos: torch.Tensor, *, sink_pages: int, recent_pages: int, page_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Page ranges of each token; all outputs [num_tokens] int64.

    Returns ``(sink_end, recent_start, cur)``: sink = ``[0, sink_end)``, candidates =
    ``[sink_end, recent_start)``, recent window = ``[recent_start, cur]``.
    """
    cur = token_pos.long() // page_size
    recent_start = (cur - recent_pages + 1).clamp(min=0)
    sink_end = recent_start.clamp(max=sink_pages)
    return sink_end, recent_start, cur


def box_center(digest_min: torch.Tensor, digest_max: torch.Tensor) -> torch.Tensor:
    """``(min + max) / 2`` in fp32: the center digest the ``"center"`` score reads (any shape)."""
    return (digest_min.float() + digest_max.float()) / 2


def center_mass(logits: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """``logits: [T, P, H]`` scaled center logits, ``cand: [T, P]`` candidate mask -> ``[T, P]``
    fp32: per head a softmax over the candidates, summed over heads; -inf off the candidates.
    (The Triton path's torch epilogue; the CPU path computes the same per token in
    ``center_scores``.) A row without candidates gives NaN in the softmax, which the mask replaces."""
    masked = logits.masked_fill(~cand[:, :, None], float("-inf")).transpose(1, 2)  # [T, H, P]
    mass = torch.softmax(masked, dim=2).sum(1)
    return torch.where(cand, mass, float("-inf"))


def center_scores(
    q: torch.Tensor,
    digest_center: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    *,
    sink_pages: int,
    recent_pages: int,
    page_size: int,
) -> torch.Tensor:
    """Estimated attention mass of every candidate page; -inf elsewhere.

    q: [num_tokens, num_heads, head_dim]; digest_center: [batch, max_pages, num_kv_heads,
    head_dim] box centers ``(min + max) / 2``; token_req, token_pos: [num_tokens]. Returns
    [num_tokens, max_pages] fp32.

    One GEMM per token over exactly its own candidate rows: ``[num_heads, KVH*D]`` (the token's
    block-diagonal query, row h holding ``q[h] / sqrt(D)`` in kv(h)'s columns) times the
    candidates' centers ``[KVH*D, num_candidates]``, then a softmax per head over that row and a
    sum over heads. Every shape and operand layout depends only on the token itself, so its scores
    are bitwise the same whatever else is in the batch (what keeps speculative verification
    lossless); the view of the digests is read in place, never gathered or widened.
    """
    num_tokens, num_heads, head_dim = q.shape
    batch, max_pages, num_kv_heads, _ = digest_center.shape
    group = num_heads // num_kv_heads
    sink_end, recent_start, _ = candidate_bounds(
        token_pos, sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size
    )
    scores = torch.full((num_tokens, max_pages), float("-inf"), dtype=torch.float32, device=q.device)
    if num_tokens == 0:
        return scores
    q_block = q.new_zeros((num_tokens, num_kv_heads, group, num_kv_heads, head_dim), dtype=torch.float32)
    kv = torch.arange(num_kv_heads, device=q.device)
    # advanced indices around a slice move to the front: the target is [KVH, T, G, D]
    q_block[:, kv, :, kv, :] = (q.float() / math.sqrt(head_dim)).view(
        num_tokens, num_kv_heads, group, head_dim).transpose(0, 1)
    q_block = q_block.view(num_tokens, num_heads, num_kv_heads * head_dim)
    centers = digest_center.reshape(batch, max_pages, num_kv_heads * head_dim)
    rows = zip(token_req.tolist(), sink_end.tolist(), recent_start.tolist())
    for t, (req, first, end) in enumerate(rows):
        if end > first:
            logits = torch.mm(q_block[t], centers[req, first:end].float().t())  # [num_heads, n]
            scores[t, first:end] = torch.softmax(logits, dim=1).sum(0)
    return scores


def quest_scores(
    q: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    *,
    sink_pages: int,
    recent_pages: int,
    page_size: int,
) -> torch.Tensor:
    """Quest bound of every candidate page; -inf elsewhere.

    q: [num_tokens, num_heads, head_dim]; digest_min/max: [batch, max_pages, num_kv_heads,
    head_dim]; token_req, token_pos: [num_tokens]. Returns [num_tokens, max_pages] fp32.

    Since ``digest_min <= digest_max``, ``max(q*min, q*max) = relu(q)*max + min(q, 0)*min``, so
    summing over a GQA group first gives ``sum_{kv,d} (sum_g relu(q))*max + (sum_g min(q,0))*min``.
    Each score is an independent reduction over ``num_kv_heads*head_dim`` products, so a token's
    scores do not depend on the other tokens of the batch. Only candidate rows of the digests
    are used: garbage (even NaN) beyond a request's sealed pages never reaches a score.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, max_pages, num_kv_heads, _ = digest_min.shape
    group = num_heads // num_kv_heads
    sink_end, recent_start, _ = candidate_bounds(
        token_pos, sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size
    )
    scores = torch.full((num_tokens, max_pages), float("-inf"), dtype=torch.float32, device=q.device)
    # no candidate lies beyond the furthest recent-window start
    used_pages = min(int(recent_start.max()), max_pages) if num_tokens else 0
    if used_pages == 0:
        return scores
    q_f32 = q.float().view(num_tokens, num_kv_heads, group, head_dim)
    q_pos = q_f32.clamp(min=0).sum(2).view(num_tokens, 1, num_kv_heads * head_dim)
    q_neg = q_f32.clamp(max=0).sum(2).view(num_tokens, 1, num_kv_heads * head_dim)
    page_ids = torch.arange(used_pages, device=q.device)  # [used_pages]
    # gathered min+max in the digest dtype plus their fp32 copies
    chunk = rows_per_chunk(used_pages * num_kv_heads * head_dim * 2 * (4 + digest_min.element_size()))
    for start in range(0, num_tokens, chunk):
        rows = slice(start, start + chunk)
        req = token_req[rows].long()
        flat = (req.numel(), used_pages, num_kv_heads * head_dim)
        if req.numel() == digest_max.shape[0] and torch.equal(req, torch.arange(req.numel(), device=req.device)):
            # one token per request, in batch order (plain decode): views, no gathered copy
            d_max = digest_max[:, :used_pages].float().reshape(flat)  # [c, used_pages, kvh*hd]
            d_min = digest_min[:, :used_pages].float().reshape(flat)
        else:
            d_max = digest_max[req, :used_pages].float().reshape(flat)
            d_min = digest_min[req, :used_pages].float().reshape(flat)
        # elementwise products and one reduction per (token, page): bitwise independent of the
        # batch (a BLAS mat-vec would block differently by batch size and could flip near-ties);
        # out of place, since d_max / d_min may be views of the caller's digests
        cand = (page_ids >= sink_end[rows, None]) & (page_ids < recent_start[rows, None])
        bound = torch.addcmul(d_max * q_pos[rows], d_min, q_neg[rows]).sum(-1)  # [c, used_pages]
        scores[rows, :used_pages] = torch.where(cand, bound, float("-inf"))
    return scores


def page_scores(
    q: torch.Tensor,
    digest_min: torch.Tensor | None,
    digest_max: torch.Tensor | None,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    *,
    sink_pages: int,
    recent_pages: int,
    page_size: int,
    score: str = "quest",
    digest_center: torch.Tensor | None = None,
) -> torch.Tensor:
    """Score (``"quest"`` or ``"center"``, see the module docstring) of every candidate page;
    -inf elsewhere: [num_tokens, max_pages] fp32. ``"center"`` reads ``digest_center``, or the
    box centers of ``digest_min/max`` when it is None."""
    bounds = dict(sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size)
    if score == "center":
        if digest_center is None:
            digest_center = box_center(digest_min, digest_max)
        return center_scores(q, digest_center, token_req, token_pos, **bounds)
    return quest_scores(q, digest_min, digest_max, token_req, token_pos, **bounds)


def _top_k_lower_page_on_ties(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best scores per row, best first, equal scores in ascending page order:
    what a stable descending sort gives, through ``topk`` on a unique int64 key (the fp32 score's
    order-preserving integer image in the high half, the inverted page index in the low half),
    which is O(n log k) instead of a full sort and exact, since no two keys are equal."""
    max_pages = scores.shape[1]
    bits = (scores + 0.0).view(torch.int32).to(torch.int64)  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # int order == float order
    inverted_page = (max_pages - 1) - torch.arange(max_pages, device=scores.device)
    key = (ordered << 32) | inverted_page
    best = torch.topk(key, k, dim=1, sorted=True).values
    return (max_pages - 1) - (best & 0xFFFFFFFF)


def select_from_scores(
    scores: torch.Tensor,
    token_pos: torch.Tensor,
    *,
    top_k_pages: int,
    sink_pages: int,
    recent_pages: int,
    page_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k candidates by score, then the sorted union sink + top-k + recent.

    scores: [num_tokens, max_pages] fp32, -inf off the candidate range (candidate scores must be
    finite). Ties are broken towards the lower page index: a stable descending sort keeps equal
    scores in page order. Returns ``selected_pages`` [num_tokens, sink_pages + top_k_pages +
    recent_pages] int32 (ascending, -1 padded at the end) and ``num_selected`` [num_tokens] int32.
    """
    num_tokens, max_pages = scores.shape
    device = scores.device
    sink_end, recent_start, cur = candidate_bounds(
        token_pos, sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size
    )
    num_top = (recent_start - sink_end).clamp(max=top_k_pages)  # [num_tokens]
    k = min(top_k_pages, max_pages)
    order = _top_k_lower_page_on_ties(scores, k)  # [T, k] best first
    sentinel = torch.iinfo(torch.int64).max
    col_k = torch.arange(k, device=device)
    top = torch.where(col_k < num_top[:, None], order, sentinel)
    top = torch.sort(top, dim=1).values  # [T, k] chosen pages ascending, sentinel after
    top = torch.cat([top, torch.full((num_tokens, 1), -1, dtype=torch.int64, device=device)], 1)

    width = sink_pages + top_k_pages + recent_pages
    col = torch.arange(width, device=device)[None, :]  # [1, width]
    num_sink = sink_end[:, None]
    top_end = num_sink + num_top[:, None]
    sel_end = top_end + (cur - recent_start + 1)[:, None]
    top_part = top.gather(1, (col - num_sink).clamp(min=0, max=k))
    recent_part = recent_start[:, None] + (col - top_end)
    selected = torch.where(
        col < num_sink,
        col,
        torch.where(col < top_end, top_part, torch.where(col < sel_end, recent_part, -1)),
    )
    return selected.to(torch.int32), sel_end[:, 0].to(torch.int32)


def page_select(
    q: torch.Tensor,
    digest_min: torch.Tensor | None,
    digest_max: torch.Tensor | None,
    token_req: torch.Tensor,
    token_pos: torch.Tensor,
    *,
    top_k_pages: int,
    sink_pages: int,
    recent_pages: int,
    page_size: int,
    score: str = "quest",
    digest_center: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference selection; contract in ``kernels.page_select.api.page_select``."""
    bounds = dict(sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size)
    scores = page_scores(
        q, digest_min, digest_max, token_req, token_pos, score=score, digest_center=digest_center, **bounds
    )
    return select_from_scores(scores, token_pos, top_k_pages=top_k_pages, **bounds)
