"""sparse_paged_attention: naive loops, dense SDPA equivalence, Triton (interpreter) vs reference."""

import pytest
import torch
import torch.nn.functional as F

from kernels import sparse_paged_attention
from kernels.sparse_paged_attention import reference
from kernels.sparse_paged_attention import triton as triton_impl
from tests.kernels import naive

# Output tolerance vs the fp32 reference: fp32 differs only by summation order (1e-5); fp16/bf16
# outputs are rounded once to the dtype (relative step 2^-11 / 2^-8 on values of order 1).
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _random_case(*, num_tokens, num_heads, num_kv_heads, head_dim, page_size, max_sel, num_slots,
                 dtype=torch.float32, seed=0, pad_lanes=True):
    """Random pools and per-token selections: distinct pages in shuffled order, some -1 lanes,
    each token's own (partial) page included so that it always sees at least one key."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    k_pool = torch.randn(num_slots, page_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_pool = torch.randn(num_slots, page_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    token_pos = torch.randint(max_sel * page_size, 4 * max_sel * page_size, (num_tokens,), generator=gen)
    slots = torch.full((num_tokens, max_sel), -1, dtype=torch.int32)
    pages = torch.full((num_tokens, max_sel), -1, dtype=torch.int32)
    for t in range(num_tokens):
        cur = int(token_pos[t]) // page_size
        chosen = torch.randperm(cur, generator=gen)[: max_sel - 1].tolist() + [cur]
        lanes = torch.randperm(max_sel, generator=gen)[: len(chosen)]
        if pad_lanes and max_sel > 2:
            lanes = lanes[:-1]  # leave one more lane as padding
            chosen = chosen[-len(lanes):]
        pages[t, lanes] = torch.tensor(chosen, dtype=torch.int32)
        slots[t, lanes] = torch.randint(0, num_slots, (len(chosen),), generator=gen, dtype=torch.int32)
    return q, k_pool, v_pool, slots, pages, token_pos.to(torch.int32)


def test_reference_matches_naive():
    q, k_pool, v_pool, slots, pages, pos = _random_case(
        num_tokens=3, num_heads=4, num_kv_heads=2, head_dim=16, page_size=4, max_sel=5, num_slots=9
    )
    got = sparse_paged_attention(q, k_pool, v_pool, slots, pages, pos, scale=0.25, page_size=4)
    want = naive.sparse_paged_attention(q, k_pool, v_pool, slots, pages, pos, scale=0.25, page_size=4)
    assert (got.double() - want).abs().max() < 1e-5  # fp32 vs float64 oracle


def _dense_case(seq_len, block_len, *, num_heads=8, num_kv_heads=2, head_dim=64, page_size=16, seed=0):
    """A whole sequence scattered over shuffled slots; the last ``block_len`` tokens query it
    with every page selected (in shuffled lane order)."""
    gen = torch.Generator().manual_seed(seed)
    num_pages = -(-seq_len // page_size)
    keys = torch.randn(num_pages * page_size, num_kv_heads, head_dim, generator=gen)
    values = torch.randn(num_pages * page_size, num_kv_heads, head_dim, generator=gen)
    q = torch.randn(block_len, num_heads, head_dim, generator=gen)
    slot_of_page = torch.randperm(num_pages + 3, generator=gen)[:num_pages]
    k_pool = torch.randn(num_pages + 3, page_size, num_kv_heads, head_dim, generator=gen)
    v_pool = torch.randn_like(k_pool)
    k_pool[slot_of_page] = keys.view(num_pages, page_size, num_kv_heads, head_dim)
    v_pool[slot_of_page] = values.view(num_pages, page_size, num_kv_heads, head_dim)
    lane_pages = torch.stack([torch.randperm(num_pages, generator=gen) for _ in range(block_len)])
    token_slots = slot_of_page[lane_pages].to(torch.int32)
    token_pos = torch.arange(seq_len - block_len, seq_len, dtype=torch.int32)
    # dense causal attention over the contiguous sequence (queries = its last block_len tokens)
    group = num_heads // num_kv_heads
    k_dense = keys[:seq_len].repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, seq, hd]
    v_dense = values[:seq_len].repeat_interleave(group, dim=1).transpose(0, 1)
    mask = torch.arange(seq_len)[None, :] <= token_pos[:, None].long()  # [block_len, seq]
    dense = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k_dense[None], v_dense[None], attn_mask=mask, scale=head_dim**-0.5
    )[0].transpose(0, 1)
    return (q, k_pool, v_pool, token_slots, lane_pages.to(torch.int32), token_pos), dense


@pytest.mark.parametrize("impl", ["api", "triton"])
@pytest.mark.parametrize("seq_len,block_len", [(45, 1), (45, 8), (64, 5), (19, 19)])
def test_all_pages_selected_equals_dense_causal(impl, seq_len, block_len):
    args, dense = _dense_case(seq_len, block_len, seed=seq_len + block_len)
    fn = sparse_paged_attention if impl == "api" else triton_impl.sparse_paged_attention
    got = fn(*args, scale=64**-0.5, page_size=16)
    assert (got - dense).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,page_size,max_sel",
    [(4, 2, 64, 16, 9), (3, 1, 80, 5, 4), (2, 2, 32, 16, 1)],
)
def test_triton_matches_reference(dtype, num_heads, num_kv_heads, head_dim, page_size, max_sel):
    case = _random_case(
        num_tokens=3, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        page_size=page_size, max_sel=max_sel, num_slots=13, dtype=dtype, seed=max_sel,
    )
    want = reference.sparse_paged_attention(*case, scale=head_dim**-0.5, page_size=page_size)
    got = triton_impl.sparse_paged_attention(*case, scale=head_dim**-0.5, page_size=page_size, pages_per_block=2)
    assert got.dtype == dtype
    assert (got.float() - want.float()).abs().max() <= ATOL[dtype]


@pytest.mark.parametrize("max_sel", [31, 32, 33])
def test_triton_selection_width_straddles_blocks(max_sel):
    case = _random_case(
        num_tokens=1, num_heads=4, num_kv_heads=1, head_dim=16, page_size=4, max_sel=max_sel,
        num_slots=40, seed=max_sel,
    )
    want = reference.sparse_paged_attention(*case, scale=0.25, page_size=4)
    got = triton_impl.sparse_paged_attention(*case, scale=0.25, page_size=4, pages_per_block=8)
    assert (got - want).abs().max() <= 1e-5


@pytest.mark.parametrize("impl", ["api", "triton"])
def test_token_without_visible_keys_gets_zeros(impl):
    q = torch.randn(2, 2, 16)
    k_pool = torch.randn(3, 4, 1, 16)
    slots = torch.tensor([[-1, -1], [0, 2]], dtype=torch.int32)
    pages = torch.tensor([[-1, -1], [5, 0]], dtype=torch.int32)  # token 1: page 5 is in its future
    pos = torch.tensor([3, 2], dtype=torch.int32)
    fn = sparse_paged_attention if impl == "api" else triton_impl.sparse_paged_attention
    out = fn(q, k_pool, k_pool.clone(), slots, pages, pos, scale=1.0, page_size=4)
    assert torch.all(out[0] == 0)
    p = torch.softmax(q[1, :, None, :] @ k_pool[2, :3, 0].T, -1)  # keys 0..2 of page 0
    assert torch.allclose(out[1], (p @ k_pool[2, :3, 0])[:, 0], atol=1e-5)


def test_validation_messages():
    q = torch.randn(2, 4, 16)
    pool = torch.randn(5, 16, 2, 16)
    slots = torch.tensor([[0, -1], [1, 2]], dtype=torch.int32)
    pages = torch.tensor([[0, -1], [0, 1]], dtype=torch.int32)
    pos = torch.tensor([3, 20], dtype=torch.int32)
    call = lambda **kw: sparse_paged_attention(  # noqa: E731
        **{"q": q, "k_pool": pool, "v_pool": pool, "token_slots": slots, "token_pages": pages,
           "token_pos": pos, "scale": 0.25, **kw}
    )
    shape_msg = r"k_pool must have shape \[num_slots, page_size=16, num_kv_heads, head_dim=16\]"
    with pytest.raises(ValueError, match=shape_msg):
        call(k_pool=pool[:, :8])
    with pytest.raises(TypeError, match="v_pool must have q's dtype"):
        call(v_pool=pool.half())
    with pytest.raises(ValueError, match=r"token_pages must have shape \[num_tokens=2, max_sel=2\]"):
        call(token_pages=pages[:, :1])
    with pytest.raises(ValueError, match=r"token_slots entries must be in \[0, 5\)"):
        call(token_slots=slots + 4)
    with pytest.raises(ValueError, match="-1 exactly where token_slots is -1"):
        call(token_pages=torch.tensor([[0, 3], [0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="row 1 repeats an entry"):
        call(token_pages=torch.tensor([[0, -1], [1, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="multiple of k_pool's num_kv_heads"):
        call(q=torch.randn(2, 3, 16))
    with pytest.raises(TypeError, match="token_pos must have dtype int32/int64"):
        call(token_pos=pos.float())
