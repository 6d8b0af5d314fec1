"""gather_pages: byte-exact copies, exact destinations, Triton (interpreter) vs reference."""

import pytest
import torch

from kernels import gather_pages
from kernels.gather_pages import reference
from kernels.gather_pages import triton as triton_impl

IMPLS = {"api": gather_pages, "triton": triton_impl.gather_pages}


def _bits(t):
    return reference.as_bits(t)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
def test_copies_exact_pages_to_exact_places(impl, dtype):
    src = torch.randint(0, 256, (7, 5, 3, 12), dtype=torch.uint8)  # random bits: NaNs too
    src = src.view(-1).view(dtype).view(7, 5, 3, -1) if dtype != torch.uint8 else src
    dst = torch.zeros((9,) + tuple(src.shape[1:]), dtype=dtype)
    before = dst.clone()
    src_idx = torch.tensor([6, -1, 0, 3, 0], dtype=torch.int32)  # one padding lane, src 0 twice
    dst_idx = torch.tensor([2, -1, 8, 0, 5], dtype=torch.int64)
    out = IMPLS[impl](src, dst, src_idx, dst_idx)
    assert out is dst
    for s, d in [(6, 2), (0, 8), (3, 0), (0, 5)]:
        assert torch.equal(_bits(dst[d]), _bits(src[s]))  # bit for bit, NaN payloads included
    untouched = [1, 3, 4, 6, 7]
    assert torch.equal(_bits(dst[untouched]), _bits(before[untouched]))


def test_triton_matches_reference_on_strided_pools():
    pool = torch.randn(6, 2, 16, 3, 8).to(torch.bfloat16)  # [slots, K/V, page, kvh, hd]
    src = pool[:, 1]  # page stride 768 elements, each page contiguous
    dst_ref = torch.zeros(5, 2, 16, 3, 8, dtype=torch.bfloat16)[:, 0]
    dst_tri = dst_ref.clone()
    src_idx = torch.tensor([5, 1, 2])
    dst_idx = torch.tensor([4, 0, 1])
    reference.gather_pages(src, dst_ref, src_idx, dst_idx)
    triton_impl.gather_pages(src, dst_tri, src_idx, dst_idx, block_elems=128)  # 3 blocks per page
    assert torch.equal(_bits(dst_tri), _bits(dst_ref))
    assert torch.equal(_bits(dst_ref[4]), _bits(src[5]))


def test_empty_copy_list():
    dst = torch.ones(2, 4)
    gather_pages(torch.zeros(3, 4), dst, torch.tensor([], dtype=torch.int32), torch.tensor([], dtype=torch.int32))
    assert torch.all(dst == 1)


def test_validation_messages():
    src, dst = torch.zeros(4, 16, 2, 8), torch.zeros(3, 16, 2, 8)
    idx = torch.tensor([0, 1])
    with pytest.raises(TypeError, match="dst must have src's dtype"):
        gather_pages(src, dst.half(), idx, idx)
    with pytest.raises(ValueError, match="src and dst must share page_shape"):
        gather_pages(src, torch.zeros(3, 16, 2, 4), idx, idx)
    with pytest.raises(ValueError, match=r"dst_idx must have shape \[num_copies=2\]"):
        gather_pages(src, dst, idx, idx[:1])
    with pytest.raises(ValueError, match=r"src_idx entries must be in \[0, 4\)"):
        gather_pages(src, dst, torch.tensor([0, 4]), idx)
    with pytest.raises(ValueError, match=r"dst_idx entries must be in \[0, 3\)"):
        gather_pages(src, dst, idx, torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="dst_idx must not repeat an index; 1 appears twice"):
        gather_pages(src, dst, idx, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="-1 on the same lanes"):
        gather_pages(src, dst, torch.tensor([0, -1]), idx)
    with pytest.raises(ValueError, match="each page of src must be contiguous"):
        gather_pages(src.transpose(1, 2), dst.transpose(1, 2), idx, idx)
    with pytest.raises(TypeError, match="src_idx must have dtype int32/int64"):
        gather_pages(src, dst, idx.float(), idx)
