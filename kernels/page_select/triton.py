"""Triton page selection: Triton scoring, then the reference's deterministic top-k.

Split:
1. ``score="quest"``: ``_page_score_kernel`` (Triton), one program per (token, block of
   ``BLOCK_P`` pages), writes the Quest bound of each candidate page into ``scores [num_tokens,
   max_pages]`` fp32 and -inf elsewhere. Blocks with no candidate skip all loads; candidate masks
   keep garbage digest rows beyond the token's recent window from ever being loaded.
   ``score="center"``: ``_center_logit_kernel`` (same grid and masking) reads the box centers
   (``reference.box_center`` of min/max unless given) and writes every head's scaled center
   logit ``[num_tokens, max_pages, num_heads]``; ``reference.center_mass`` (torch) turns them
   into the estimated attention mass per page.
2. ``reference.select_from_scores`` (torch, on the scores' device): stable descending sort, so
   ties go to the lower page index exactly as in the reference, then the sorted union.
Scores of the kernel and the reference agree to fp32 rounding (different summation order); with
integer-valued inputs they are bit-identical, which the tests use to check tie-breaking.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels.page_select import reference


@triton.jit
def _candidate_block(req_ptr, pos_ptr, tok, block_start, page_size, sink_pages, recent_pages, BLOCK_P: tl.constexpr):
    """Token ``tok``'s request row, its candidate range ``[sink_end, recent_start)``, this
    program's pages ``offs_p: [BLOCK_P]`` and which of them are candidates."""
    req = tl.load(req_ptr + tok).to(tl.int64)
    cur = tl.load(pos_ptr + tok).to(tl.int64) // page_size
    recent_start = tl.maximum(cur - recent_pages + 1, 0)
    sink_end = tl.minimum(recent_start, sink_pages)
    offs_p = block_start + tl.arange(0, BLOCK_P)  # [BLOCK_P] logical pages
    cand = (offs_p >= sink_end) & (offs_p < recent_start)
    return req, sink_end, recent_start, offs_p, cand


@triton.jit
def _digest_tiles(min_ptr, max_ptr, req, offs_p, kv, offs_d, mask,
                  stride_nb, stride_np, stride_nh, stride_nd, stride_xb, stride_xp, stride_xh, stride_xd):
    """fp32 min and max digest tiles ``[BLOCK_P, BLOCK_D]`` of kv head ``kv``; masked lanes 0."""
    d_min = tl.load(
        min_ptr + req * stride_nb + offs_p[:, None].to(tl.int64) * stride_np + kv * stride_nh + offs_d[None, :] * stride_nd,
        mask=mask, other=0.0,
    ).to(tl.float32)
    d_max = tl.load(
        max_ptr + req * stride_xb + offs_p[:, None].to(tl.int64) * stride_xp + kv * stride_xh + offs_d[None, :] * stride_xd,
        mask=mask, other=0.0,
    ).to(tl.float32)
    return d_min, d_max


@triton.jit
def _page_score_kernel(
    q_ptr, min_ptr, max_ptr, req_ptr, pos_ptr, score_ptr,
    max_pages, num_kv_heads, head_dim, group, page_size, sink_pages, recent_pages,
    stride_qt, stride_qh, stride_qd,
    stride_nb, stride_np, stride_nh, stride_nd,
    stride_xb, stride_xp, stride_xh, stride_xd,
    stride_st,
    BLOCK_P: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    block_start = tl.program_id(1) * BLOCK_P
    req, sink_end, recent_start, offs_p, cand = _candidate_block(
        req_ptr, pos_ptr, tok, block_start, page_size, sink_pages, recent_pages, BLOCK_P)
    acc = tl.zeros((BLOCK_P,), dtype=tl.float32)
    if (block_start < recent_start) & (block_start + BLOCK_P > sink_end):
        offs_g = tl.arange(0, BLOCK_G)
        for kv in range(0, num_kv_heads):
            for d0 in range(0, head_dim, BLOCK_D):
                offs_d = d0 + tl.arange(0, BLOCK_D)
                mask_d = offs_d < head_dim
                heads = kv * group + offs_g
                q_tile = tl.load(
                    q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=(offs_g[:, None] < group) & mask_d[None, :], other=0.0,
                ).to(tl.float32)  # [BLOCK_G, BLOCK_D]
                q_pos = tl.sum(tl.maximum(q_tile, 0.0), axis=0)  # [BLOCK_D]
                q_neg = tl.sum(tl.minimum(q_tile, 0.0), axis=0)
                mask = cand[:, None] & mask_d[None, :]
                d_min, d_max = _digest_tiles(min_ptr, max_ptr, req, offs_p, kv, offs_d, mask,
                                             stride_nb, stride_np, stride_nh, stride_nd,
                                             stride_xb, stride_xp, stride_xh, stride_xd)  # [BLOCK_P, BLOCK_D]
                acc += tl.sum(d_max * q_pos[None, :] + d_min * q_neg[None, :], axis=1)
    out = tl.where(cand, acc, float("-inf"))
    tl.store(score_ptr + tok * stride_st + offs_p, out, mask=offs_p < max_pages)


@triton.jit
def _center_logit_kernel(
    q_ptr, center_ptr, req_ptr, pos_ptr, logit_ptr,
    max_pages, num_kv_heads, head_dim, group, page_size, sink_pages, recent_pages, scale,
    stride_qt, stride_qh, stride_qd,
    stride_cb, stride_cp, stride_ch, stride_cd,
    stride_lt, stride_lp, stride_lh,
    BLOCK_P: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    block_start = tl.program_id(1) * BLOCK_P
    req, sink_end, recent_start, offs_p, cand = _candidate_block(
        req_ptr, pos_ptr, tok, block_start, page_size, sink_pages, recent_pages, BLOCK_P)
    offs_g = tl.arange(0, BLOCK_G)
    for kv in range(0, num_kv_heads):
        heads = kv * group + offs_g
        acc = tl.zeros((BLOCK_G, BLOCK_P), dtype=tl.float32)
        if (block_start < recent_start) & (block_start + BLOCK_P > sink_end):
            for d0 in range(0, head_dim, BLOCK_D):
                offs_d = d0 + tl.arange(0, BLOCK_D)
                mask_d = offs_d < head_dim
                q_tile = tl.load(
                    q_ptr + tok * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                    mask=(offs_g[:, None] < group) & mask_d[None, :], other=0.0,
                ).to(tl.float32)  # [BLOCK_G, BLOCK_D]
                center = tl.load(
                    center_ptr + req * stride_cb + offs_p[:, None].to(tl.int64) * stride_cp + kv * stride_ch
                    + offs_d[None, :] * stride_cd,
                    mask=cand[:, None] & mask_d[None, :], other=0.0,
                ).to(tl.float32)  # [BLOCK_P, BLOCK_D] box centers
                acc += tl.sum(q_tile[:, None, :] * center[None, :, :], axis=2)  # [BLOCK_G, BLOCK_P]
        out = tl.where(cand[None, :], acc * scale, float("-inf"))
        tl.store(
            logit_ptr + tok * stride_lt + offs_p[None, :].to(tl.int64) * stride_lp + heads[:, None] * stride_lh,
            out, mask=(offs_g[:, None] < group) & (offs_p[None, :] < max_pages),
        )


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
    block_pages: int = 64,
) -> torch.Tensor:
    """Triton scores, same contract as ``reference.page_scores``: [num_tokens, max_pages] fp32."""
    if score == "center" and digest_center is None:
        digest_center = reference.box_center(digest_min, digest_max)
    num_tokens, num_heads, head_dim = q.shape
    _, max_pages, num_kv_heads, _ = (digest_center if score == "center" else digest_min).shape
    group = num_heads // num_kv_heads
    scores = torch.empty((num_tokens, max_pages), dtype=torch.float32, device=q.device)
    if num_tokens == 0 or max_pages == 0:
        return scores
    grid = (num_tokens, triton.cdiv(max_pages, block_pages))
    if score == "center":
        logits = torch.empty((num_tokens, max_pages, num_heads), dtype=torch.float32, device=q.device)
        _center_logit_kernel[grid](
            q, digest_center, token_req.contiguous(), token_pos.contiguous(), logits,
            max_pages, num_kv_heads, head_dim, group, page_size, sink_pages, recent_pages, 1 / math.sqrt(head_dim),
            *q.stride(), *digest_center.stride(), *logits.stride(),
            BLOCK_P=block_pages,
            BLOCK_G=triton.next_power_of_2(group),
            BLOCK_D=min(64, triton.next_power_of_2(head_dim)),
        )
        sink_end, recent_start, _ = reference.candidate_bounds(
            token_pos, sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size)
        page_ids = torch.arange(max_pages, device=q.device)
        cand = (page_ids >= sink_end[:, None]) & (page_ids < recent_start[:, None])
        return reference.center_mass(logits, cand)
    _page_score_kernel[grid](
        q, digest_min, digest_max, token_req.contiguous(), token_pos.contiguous(), scores,
        max_pages, num_kv_heads, head_dim, group, page_size, sink_pages, recent_pages,
        *q.stride(), *digest_min.stride(), *digest_max.stride(), scores.stride(0),
        BLOCK_P=block_pages,
        BLOCK_G=triton.next_power_of_2(group),
        BLOCK_D=min(128, triton.next_power_of_2(head_dim)),
    )
    return scores


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
    block_pages: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton-scored selection; contract in ``kernels.page_select.api.page_select``."""
    bounds = dict(sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size)
    scores = page_scores(
        q, digest_min, digest_max, token_req, token_pos, score=score, digest_center=digest_center,
        block_pages=block_pages, **bounds
    )
    return reference.select_from_scores(scores, token_pos, top_k_pages=top_k_pages, **bounds)
