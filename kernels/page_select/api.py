"""Public entry point of page selection (Quest bound or center-mass scores)."""

from __future__ import annotations

import torch

from kernels.page_select import reference
from kernels.validation import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_index_range,
    check_positive_int,
    check_same_device,
    check_tensor,
)


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
    page_size: int = 16,
    score: str = "quest",
    digest_center: torch.Tensor | None = None,
    check_indices: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Select the pages each query token attends to.

    For a token at position ``pos``: ``cur = pos // page_size``; recent window = pages
    ``[max(0, cur - recent_pages + 1), cur]``; sink = ``[0, min(sink_pages, recent_start))``;
    candidates = ``[sink_end, recent_start)`` (sealed, as they precede the token's own page).
    With ``kv(h) = h // (num_heads // num_kv_heads)``, accumulated in fp32, candidate page p scores
    ``score="quest"``: ``sum_h sum_d max(q[h,d]*min[p,kv(h),d], q[h,d]*max[p,kv(h),d])``;
    ``score="center"``: ``sum_h softmax_p(l[h, :])[p]`` over the token's candidates, with the
    center logit ``l[h,p] = sum_d q[h,d] * c[p,kv(h),d] / sqrt(head_dim)`` and the box center
    ``c = (min + max) / 2`` (an estimate of the attention mass the page gets; see ``reference``). The top
    ``top_k_pages`` candidates are kept (all if fewer); ties go to the lower page index (stable
    descending sort on score). The output is sink ∪ top-k ∪ recent, sorted ascending.

    Invariant (what makes speculative verification lossless): a token's selection depends only
    on its own q, its own pos and the digests of pages before its recent window. Other tokens
    of the batch, later pages and the garbage digest rows of unsealed pages never influence it.

    Args:
        q: [num_tokens, num_heads, head_dim] fp32/fp16/bf16, the query after RoPE.
        digest_min, digest_max: [batch, max_pages, num_kv_heads, head_dim] float, per request in
            logical page order; rows from a token's recent window on are never read. Entries
            must be finite with ``digest_min <= digest_max`` (true for ``page_digest`` output).
            None (both) when ``digest_center`` is given.
        digest_center: ``score="center"`` only, instead of min/max: the box centers ``(min +
            max) / 2``, same shape and layout (what the decoder keeps per sealed page).
        token_req: [num_tokens] int32/int64 row of each token's request in ``batch``.
        token_pos: [num_tokens] int32/int64 absolute position of each token in its sequence;
            its recent window must start within the digest table
            (``max(0, pos // page_size - recent_pages + 1) <= max_pages``).
        top_k_pages, sink_pages >= 0; recent_pages >= 1 (the token's own page); page_size >= 1.
        score: ``"quest"`` or ``"center"``.
        check_indices: check token_req/token_pos ranges (reads them; syncs on CUDA).

    Returns:
        selected_pages: [num_tokens, sink_pages + top_k_pages + recent_pages] int32 ascending
            logical pages, -1 padded at the end.
        num_selected: [num_tokens] int32 number of valid entries per row.

    Dispatch: CUDA -> Triton scoring kernel + torch top-k (see ``triton.py``); CPU -> torch
    reference. Both share the top-k code, so tie-breaking is identical.
    """
    check_positive_int("top_k_pages", top_k_pages, minimum=0)
    check_positive_int("sink_pages", sink_pages, minimum=0)
    check_positive_int("recent_pages", recent_pages, minimum=1)
    check_positive_int("page_size", page_size, minimum=1)
    if score not in reference.SCORES:
        raise ValueError(f"score must be one of {reference.SCORES}; got {score!r}")
    check_tensor("q", q, shape=(None, None, None), shape_doc="[num_tokens, num_heads, head_dim]", dtypes=FLOAT_DTYPES)
    num_tokens, num_heads, head_dim = q.shape
    digests = _check_digests(score, head_dim, digest_min=digest_min, digest_max=digest_max,
                             digest_center=digest_center)
    batch, max_pages, num_kv_heads, _ = next(iter(digests.values())).shape
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"q's num_heads ({num_heads}) must be a multiple of the digests' num_kv_heads ({num_kv_heads})"
        )
    token_doc = f"[num_tokens={num_tokens}]"
    check_tensor("token_req", token_req, shape=(num_tokens,), shape_doc=token_doc, dtypes=INDEX_DTYPES)
    check_tensor("token_pos", token_pos, shape=(num_tokens,), shape_doc=token_doc, dtypes=INDEX_DTYPES)
    check_same_device(q=q, token_req=token_req, token_pos=token_pos, **digests)
    bounds = dict(sink_pages=sink_pages, recent_pages=recent_pages, page_size=page_size)
    if check_indices and num_tokens:
        check_index_range("token_req", token_req, high=batch, allow_padding=False, what="rows of the digest batch")
        if bool((token_pos < 0).any()):
            raise ValueError(f"token_pos must be >= 0; found {int(token_pos.min())}")
        _, recent_start, _ = reference.candidate_bounds(token_pos, **bounds)
        if int(recent_start.max()) > max_pages:
            raise ValueError(
                f"token_pos too large for the digest table: a recent window starts at page "
                f"{int(recent_start.max())} but max_pages is {max_pages}"
            )
    if q.is_cuda:
        from kernels.page_select import triton as triton_impl

        impl = triton_impl.page_select
    else:
        impl = reference.page_select
    return impl(q, digest_min, digest_max, token_req, token_pos, top_k_pages=top_k_pages, score=score,
                digest_center=digest_center, **bounds)


def _check_digests(score: str, head_dim: int, **given: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The digest tensors ``score`` reads, checked (same shape and dtype). ``"quest"`` needs
    min and max; ``"center"`` either the center alone or min and max (it then uses their centers)."""
    passed = {name for name, tensor in given.items() if tensor is not None}
    pairs = {"digest_min", "digest_max"}
    if passed != pairs and not (score == "center" and passed == {"digest_center"}):
        wanted = "digest_min and digest_max" + (", or digest_center alone" if score == "center" else "")
        raise ValueError(f"score={score!r} needs {wanted}; got {sorted(passed) or 'none'}")
    digests = {name: tensor for name, tensor in given.items() if tensor is not None}  # min before max
    first_name, first = next(iter(digests.items()))
    check_tensor(
        first_name, first, shape=(None, None, None, head_dim),
        shape_doc=f"[batch, max_pages, num_kv_heads, head_dim={head_dim}]", dtypes=FLOAT_DTYPES,
    )
    batch, max_pages, num_kv_heads, _ = first.shape
    for name, tensor in digests.items():
        check_tensor(
            name, tensor, shape=tuple(first.shape),
            shape_doc=f"[batch={batch}, max_pages={max_pages}, num_kv_heads={num_kv_heads}, head_dim={head_dim}]",
            dtypes=FLOAT_DTYPES,
        )
        if tensor.dtype != first.dtype:
            raise TypeError(f"{name} dtype {tensor.dtype} differs from {first_name} dtype {first.dtype}")
    return digests
