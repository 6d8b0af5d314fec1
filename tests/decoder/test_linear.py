import pytest
import torch
import torch.nn.functional as F

from services.decoder.model.linear import PACK_BUCKETS_ROWS, Linear, packed_gemm_available


@pytest.mark.parametrize("num_rows", [1, 2, 3, 7, 8, 9, 16, 17, 33, 64, 65, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_f_linear_for_every_row_count(num_rows, with_bias):
    g = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(96, 40, generator=g)
    bias = torch.randn(96, generator=g) if with_bias else None
    x = torch.randn(num_rows, 40, generator=g)
    lin = Linear(weight, bias)
    # different summation order in the packed kernel: fp32 rounding only
    torch.testing.assert_close(lin(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_packs_are_built_per_bucket_on_first_use():
    lin = Linear(torch.randn(32, 16))
    if not packed_gemm_available(lin.weight):
        pytest.fail("this project's CPU torch build is expected to ship MKL")
    lin(torch.randn(5, 16))
    lin(torch.randn(8, 16))
    lin(torch.randn(12, 16))
    lin(torch.randn(1, 16))
    assert sorted(lin._packs) == [8, 16]
    assert set(lin._packs) <= set(PACK_BUCKETS_ROWS)


def test_packing_off_for_half_precision_and_when_disabled():
    assert not Linear(torch.randn(8, 8, dtype=torch.bfloat16)).use_packs
    assert not Linear(torch.randn(8, 8), packed_gemm=False).use_packs
