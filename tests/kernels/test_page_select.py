"""page_select: reference vs naive loops, Triton scoring (interpreter) vs reference, invariants."""

import pytest
import torch

from kernels import page_select
from kernels.page_select import reference
from kernels.page_select import triton as triton_impl
from tests.kernels import naive

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOP_KS = [1, 31, 32, 33, 63, 64, 65, 128]
SCORES = ["quest", "center"]


def _inputs(*, num_tokens, num_heads, num_kv_heads, head_dim, batch, max_pages, page_size,
            integer, dtype=torch.float32, seed=0):
    """Random q/digests; positions spread so recent windows start anywhere up to max_pages.

    ``integer``: small integer values, so every score is exact in fp32 whatever the summation
    order (Triton and reference then agree bit for bit, and ties are frequent).
    """
    gen = torch.Generator().manual_seed(seed)
    shape_q = (num_tokens, num_heads, head_dim)
    shape_d = (batch, max_pages, num_kv_heads, head_dim)
    if integer:
        q = torch.randint(-3, 4, shape_q, generator=gen).float()
        d_min = torch.randint(-4, 5, shape_d, generator=gen).float()
        d_max = d_min + torch.randint(0, 4, shape_d, generator=gen).float()
    else:
        q = torch.randn(shape_q, generator=gen)
        a, b = torch.randn(shape_d, generator=gen), torch.randn(shape_d, generator=gen)
        d_min, d_max = torch.minimum(a, b), torch.maximum(a, b)
    token_req = torch.randint(0, batch, (num_tokens,), generator=gen, dtype=torch.int32)
    token_pos = torch.randint(0, max_pages * page_size, (num_tokens,), generator=gen, dtype=torch.int32)
    token_pos[0] = max_pages * page_size - 1  # one token with the most candidates
    return q.to(dtype), d_min.to(dtype), d_max.to(dtype), token_req, token_pos


def _as_lists(selected, num_selected):
    return [row[: int(n)].tolist() for row, n in zip(selected, num_selected)]


def _assert_valid_layout(selected, num_selected):
    for row, n in zip(selected.tolist(), num_selected.tolist()):
        assert row[:n] == sorted(set(row[:n])) and all(x == -1 for x in row[n:])


def test_reference_matches_naive_exactly_on_integer_data():
    cfg = dict(top_k_pages=5, sink_pages=2, recent_pages=3, page_size=4)
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=7, num_heads=6, num_kv_heads=2, head_dim=8, batch=3, max_pages=24, page_size=4, integer=True
    )
    selected, num_selected = page_select(q, d_min, d_max, req, pos, **cfg)
    want, _ = naive.page_select(q, d_min, d_max, req, pos, **cfg)
    assert selected.dtype == torch.int32 and selected.shape == (7, 10)
    assert _as_lists(selected, num_selected) == want
    _assert_valid_layout(selected, num_selected)


@pytest.mark.parametrize("score", SCORES)
def test_reference_matches_naive_on_float_data(score):
    cfg = dict(top_k_pages=6, sink_pages=1, recent_pages=2, page_size=8, score=score)
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=5, num_heads=4, num_kv_heads=2, head_dim=16, batch=2, max_pages=30, page_size=8, integer=False
    )
    scores = reference.page_scores(q, d_min, d_max, req, pos, sink_pages=1, recent_pages=2, page_size=8, score=score)
    selected, num_selected = page_select(q, d_min, d_max, req, pos, **cfg)
    want, want_scores = naive.page_select(q, d_min, d_max, req, pos, **cfg)
    for t, row_scores in enumerate(want_scores):
        for page, score in row_scores.items():  # fp32 accumulation vs float64: 1e-4 abs suffices
            assert abs(float(scores[t, page]) - score) < 1e-4
    # continuous random scores have no near-ties at the cut, so the selections agree exactly
    assert _as_lists(selected, num_selected) == want


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("top_k", TOP_KS)
def test_triton_matches_reference_top_k_straddling_blocks(top_k, score):
    cfg = dict(top_k_pages=top_k, sink_pages=2, recent_pages=3, page_size=4, score=score)
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=3, num_heads=4, num_kv_heads=2, head_dim=16, batch=2, max_pages=150, page_size=4,
        integer=True, seed=top_k,
    )
    want = reference.page_select(q, d_min, d_max, req, pos, **cfg)
    got = triton_impl.page_select(q, d_min, d_max, req, pos, block_pages=32, **cfg)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_scores_match_reference(dtype, score):
    # fp32 accumulation in both, different summation order: 1e-5 relative to the score scale
    # (center: logits of order 1 enter exp, so a logit's rounding is the mass's relative error)
    bounds = dict(sink_pages=1, recent_pages=2, page_size=16, score=score)
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=5, num_heads=6, num_kv_heads=3, head_dim=80, batch=3, max_pages=37, page_size=16,
        integer=False, dtype=dtype, seed=3,
    )
    want = reference.page_scores(q, d_min, d_max, req, pos, **bounds)
    got = triton_impl.page_scores(q, d_min, d_max, req, pos, block_pages=16, **bounds)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    scale = want[finite].abs().max()
    assert torch.allclose(got[finite], want[finite], rtol=0, atol=1e-5 * float(scale))


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_selection_all_dtypes_integer_data(dtype, score):
    cfg = dict(top_k_pages=9, sink_pages=1, recent_pages=2, page_size=16, score=score)
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=5, num_heads=8, num_kv_heads=2, head_dim=32, batch=2, max_pages=41, page_size=16,
        integer=True, dtype=dtype, seed=5,
    )
    want = reference.page_select(q, d_min, d_max, req, pos, **cfg)
    got = triton_impl.page_select(q, d_min, d_max, req, pos, block_pages=16, **cfg)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if score == "quest":  # integer Quest scores are exact in fp32 and float64 alike; center masses
        # go through exp, where float64 and fp32 may order two near-equal masses differently
        # (the float-data test compares center with the naive loops)
        naive_lists, _ = naive.page_select(q.float(), d_min.float(), d_max.float(), req, pos, **cfg)
        assert _as_lists(*want) == naive_lists


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_garbage_beyond_candidates_is_never_read(impl, score):
    cfg = dict(top_k_pages=4, sink_pages=1, recent_pages=2, page_size=4, score=score)
    q, d_min, d_max, _, _ = _inputs(
        num_tokens=2, num_heads=4, num_kv_heads=2, head_dim=16, batch=1, max_pages=20, page_size=4, integer=False
    )
    req = torch.zeros(2, dtype=torch.int32)
    pos = torch.tensor([41, 30], dtype=torch.int32)  # recent windows start at pages 9 and 6
    fn = reference.page_select if impl == "reference" else triton_impl.page_select
    clean = fn(q, d_min, d_max, req, pos, **cfg)
    d_min[:, 9:], d_max[:, 9:] = float("nan"), float("inf")  # unsealed rows: garbage
    dirty = fn(q, d_min, d_max, req, pos, **cfg)
    assert torch.equal(clean[0], dirty[0])


@pytest.mark.parametrize("score", SCORES)
def test_selection_depends_only_on_own_token(score):
    """Decode-alone vs inside a verify block with other tokens: identical selection."""
    cfg = dict(top_k_pages=7, sink_pages=2, recent_pages=3, page_size=8, score=score)
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=9, num_heads=4, num_kv_heads=2, head_dim=32, batch=2, max_pages=60, page_size=8, integer=False
    )
    together = page_select(q, d_min, d_max, req, pos, **cfg)
    for t in range(9):
        alone = page_select(q[t : t + 1], d_min, d_max, req[t : t + 1], pos[t : t + 1], **cfg)
        assert torch.equal(alone[0][0], together[0][t])
    bounds = dict(sink_pages=2, recent_pages=3, page_size=8, score=score)
    scores_all = reference.page_scores(q, d_min, d_max, req, pos, **bounds)
    scores_one = reference.page_scores(q[:1], d_min, d_max, req[:1], pos[:1], **bounds)
    assert torch.equal(scores_all[0], scores_one[0])  # bitwise: per-token reductions


def test_center_scores_are_attention_mass_estimates():
    """Per head the candidates' softmax sums to 1, so a token's center scores sum to num_heads;
    a page whose box center aligns with every head's query gets most of the mass."""
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=4, num_heads=6, num_kv_heads=3, head_dim=16, batch=2, max_pages=20, page_size=4, integer=False
    )
    pos[:] = 79  # candidates: pages 1..17 (sink 1, recent 2)
    bounds = dict(sink_pages=1, recent_pages=2, page_size=4)
    scores = reference.page_scores(q, d_min, d_max, req, pos, score="center", **bounds)
    assert torch.allclose(scores[:, 1:18].sum(1), torch.full((4,), 6.0), atol=1e-5)
    assert torch.isinf(scores[:, [0, 18, 19]]).all()
    d_min[req[0], 9] = d_max[req[0], 9] = 8 * q[0].view(3, 2, 16).mean(1)  # page 9: the keys token 0 looks for
    selected, _ = page_select(q[:1], d_min, d_max, req[:1], pos[:1], top_k_pages=1, score="center", **bounds)
    assert selected[0].tolist() == [0, 9, 18, 19]
    with pytest.raises(ValueError, match="score must be one of"):
        page_select(q, d_min, d_max, req, pos, top_k_pages=1, score="mean", **bounds)


def test_short_sequences_and_zero_top_k():
    q = torch.randn(4, 2, 16)
    d = torch.zeros(1, 8, 2, 16)
    pos = torch.tensor([0, 17, 40, 127])  # pages 0, 1, 2, 7
    req = torch.zeros(4, dtype=torch.int64)
    sel, num = page_select(q, d, d, req, pos, top_k_pages=0, sink_pages=1, recent_pages=2, page_size=16)
    assert _as_lists(sel, num) == [[0], [0, 1], [0, 1, 2], [0, 6, 7]]
    sel, num = page_select(q, d, d, req, pos, top_k_pages=3, sink_pages=1, recent_pages=2, page_size=16)
    # all-zero digests: every candidate ties at 0 -> lowest page indices win
    assert _as_lists(sel, num) == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3, 6, 7]]
    assert sel.shape == (4, 6) and sel[3].tolist() == [0, 1, 2, 3, 6, 7]


def test_validation_messages():
    q = torch.randn(2, 4, 16)
    d = torch.zeros(1, 8, 2, 16)
    req = torch.zeros(2, dtype=torch.int32)
    pos = torch.tensor([3, 20], dtype=torch.int32)
    cfg = dict(top_k_pages=2, sink_pages=1, recent_pages=1, page_size=16)
    with pytest.raises(ValueError, match=r"q must have shape \[num_tokens, num_heads, head_dim\]"):
        page_select(q[0], d, d, req, pos, **cfg)
    with pytest.raises(ValueError, match=r"digest_min must have shape \[batch, max_pages, num_kv_heads, head_dim=16\]"):
        page_select(q, d[..., :8], d, req, pos, **cfg)
    with pytest.raises(ValueError, match="multiple of the digests' num_kv_heads"):
        page_select(q, torch.zeros(1, 8, 3, 16), torch.zeros(1, 8, 3, 16), req, pos, **cfg)
    with pytest.raises(ValueError, match=r"token_pos must have shape \[num_tokens=2\]"):
        page_select(q, d, d, req, pos[:1], **cfg)
    with pytest.raises(TypeError, match="token_req must have dtype int32/int64"):
        page_select(q, d, d, req.float(), pos, **cfg)
    with pytest.raises(ValueError, match=r"token_req entries must be in \[0, 1\)"):
        page_select(q, d, d, req + 1, pos, **cfg)
    with pytest.raises(ValueError, match="token_pos too large for the digest table"):
        page_select(q, d, d, req, pos * 100, **cfg)
    with pytest.raises(ValueError, match="recent_pages must be >= 1"):
        page_select(q, d, d, req, pos, **{**cfg, "recent_pages": 0})
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        page_select(q, d, d.to("meta"), req, pos, **cfg)
    with pytest.raises(ValueError, match=r"score='quest' needs digest_min and digest_max; got \['digest_center'\]"):
        page_select(q, None, None, req, pos, digest_center=d, **cfg)
    with pytest.raises(ValueError, match="needs digest_min and digest_max, or digest_center alone"):
        page_select(q, d, d, req, pos, digest_center=d, score="center", **cfg)
    with pytest.raises(ValueError, match=r"digest_center must have shape \[batch, max_pages, num_kv_heads, head_dim=16\]"):
        page_select(q, None, None, req, pos, digest_center=d[:, :, :, :8], score="center", **cfg)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_center_digest_gives_the_scores_of_min_and_max(impl):
    """The decoder passes stored box centers; min/max callers get the same scores and pages."""
    cfg = dict(top_k_pages=5, sink_pages=1, recent_pages=2, page_size=8, score="center")
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=6, num_heads=6, num_kv_heads=2, head_dim=24, batch=3, max_pages=33, page_size=8, integer=False
    )
    center = (d_min + d_max) / 2
    bounds = {k: v for k, v in cfg.items() if k != "top_k_pages"}
    scores_fn = reference.page_scores if impl == "reference" else triton_impl.page_scores
    from_pair = scores_fn(q, d_min, d_max, req, pos, **bounds)
    from_center = scores_fn(q, None, None, req, pos, digest_center=center, **bounds)
    assert torch.equal(from_pair, from_center)  # box_center is the same fp32 expression
    select_fn = reference.page_select if impl == "reference" else triton_impl.page_select
    assert torch.equal(select_fn(q, None, None, req, pos, digest_center=center, **cfg)[0],
                       page_select(q, d_min, d_max, req, pos, **cfg)[0])


def test_center_scores_do_not_depend_on_the_batch_bitwise():
    """Each token's scores come from GEMMs shaped by its own candidates only: alone, next to
    longer requests, or among its verify block, the fp32 bits are the same."""
    bounds = dict(sink_pages=1, recent_pages=4, page_size=16, score="center")
    q, d_min, d_max, req, pos = _inputs(
        num_tokens=12, num_heads=9, num_kv_heads=3, head_dim=64, batch=4, max_pages=300, page_size=16,
        integer=False, seed=11,
    )
    center = (d_min + d_max) / 2
    together = reference.page_scores(q, None, None, req, pos, digest_center=center, **bounds)
    for t in range(12):
        alone = reference.page_scores(q[t : t + 1], None, None, req[t : t + 1], pos[t : t + 1],
                                      digest_center=center, **bounds)
        assert torch.equal(alone[0], together[t])
        # the same request's digests as the only row of a shorter table
        end = int(pos[t]) // 16 + 1
        own = reference.page_scores(q[t : t + 1], None, None, torch.zeros(1, dtype=torch.int32), pos[t : t + 1],
                                    digest_center=center[req[t] : req[t] + 1, :end].clone(), **bounds)
        assert torch.equal(own[0], together[t, :end])
