"""page_digest: reference vs naive loops, Triton (interpreter) vs reference, api validation."""

import pytest
import torch

from kernels import page_digest, page_digest_into
from kernels.page_digest import reference
from kernels.page_digest import triton as triton_impl
from tests.kernels import naive

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _pool(num_slots, page_size, num_kv_heads, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_slots, page_size, num_kv_heads, head_dim, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_matches_naive(dtype):
    k_pool = _pool(9, 16, 3, 64, dtype)
    slots = [4, 0, 8, 3]
    k_min, k_max = page_digest(k_pool, torch.tensor(slots, dtype=torch.int32))
    want_min, want_max = naive.page_digest(k_pool, slots)
    assert k_min.dtype == dtype
    assert torch.equal(k_min, want_min) and torch.equal(k_max, want_max)  # min/max are exact


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size,num_kv_heads,head_dim", [(16, 3, 64), (5, 2, 80)])
def test_triton_matches_reference(dtype, page_size, num_kv_heads, head_dim):
    # odd page count, padding lane, non-power-of-two page_size and head_dim: min/max are exact
    k_pool = _pool(11, page_size, num_kv_heads, head_dim, dtype, seed=1)
    slots = torch.tensor([7, -1, 2, 10, 0], dtype=torch.int32)
    rows = torch.tensor([3, 0, 1, 6, 4], dtype=torch.int64)
    want_min = torch.full((8, num_kv_heads, head_dim), 7.0).to(dtype)
    want_max = want_min.clone()
    got_min, got_max = want_min.clone(), want_max.clone()
    reference.page_digest_into(k_pool, slots, want_min, want_max, rows)
    triton_impl.page_digest_into(k_pool, slots, got_min, got_max, rows, block_elems=64)
    assert torch.equal(got_min, want_min) and torch.equal(got_max, want_max)
    assert torch.all(want_min[0] == 7.0)  # padding lane left its row untouched


def test_page_digest_padding_rows_are_zero():
    k_pool = _pool(4, 16, 2, 16, torch.float32)
    k_min, k_max = page_digest(k_pool, torch.tensor([-1, 2]))
    assert torch.all(k_min[0] == 0) and torch.all(k_max[0] == 0)
    assert torch.equal(k_min[1], k_pool[2].min(0).values)


def test_into_per_request_table():
    k_pool = _pool(6, 16, 2, 32, torch.bfloat16)
    table_min = torch.zeros(2, 5, 2, 32, dtype=torch.bfloat16)  # [batch, max_pages, kvh, hd]
    table_max = torch.zeros_like(table_min)
    # request row 1, pages 0 and 3 live in slots 5 and 1
    rows = torch.tensor([1 * 5 + 0, 1 * 5 + 3])
    page_digest_into(k_pool, torch.tensor([5, 1]), table_min.view(-1, 2, 32), table_max.view(-1, 2, 32), rows)
    assert torch.equal(table_max[1, 3], k_pool[1].max(0).values)
    assert torch.equal(table_min[1, 0], k_pool[5].min(0).values)
    assert torch.all(table_min[0] == 0)


def test_validation_messages():
    k_pool = _pool(4, 16, 2, 16, torch.float32)
    with pytest.raises(ValueError, match=r"k_pool must have shape \[num_slots, page_size"):
        page_digest(k_pool[0], torch.tensor([0]))
    with pytest.raises(TypeError, match="slot_ids must have dtype int32/int64"):
        page_digest(k_pool, torch.tensor([0.0]))
    with pytest.raises(ValueError, match=r"slot_ids entries must be in \[0, 4\)"):
        page_digest(k_pool, torch.tensor([4]))
    with pytest.raises(TypeError, match="k_pool must have dtype"):
        page_digest(k_pool.to(torch.int32), torch.tensor([0]))
    table = torch.zeros(3, 2, 16)
    with pytest.raises(ValueError, match=r"dst_rows entries must be in \[0, 3\)"):
        page_digest_into(k_pool, torch.tensor([0]), table, table.clone(), torch.tensor([3]))
    with pytest.raises(ValueError, match="dst_rows must not repeat"):
        page_digest_into(k_pool, torch.tensor([0, 1]), table, table.clone(), torch.tensor([2, 2]))
    with pytest.raises(TypeError, match="digest_min must have k_pool's dtype"):
        page_digest_into(k_pool, torch.tensor([0]), table.half(), table.half(), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"digest_max must have shape \[num_rows, num_kv_heads=2, head_dim=16\]"):
        page_digest_into(k_pool, torch.tensor([0]), table, torch.zeros(3, 2, 8), torch.tensor([0]))
