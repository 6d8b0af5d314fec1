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
    assert Linear(torch.randn(8, 8, dtype=torch.bfloat16), packed_gemm=False).packed_path == "plain"


@pytest.mark.parametrize("num_rows", [1, 3, 8, 13, 16, 64, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_linear_matches_a_bf16_rounded_reference(num_rows, with_bias):
    g = torch.Generator().manual_seed(100 + num_rows)
    weight = torch.randn(96, 40, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16() if with_bias else None
    x = torch.randn(num_rows, 40, generator=g)
    lin = Linear(weight, bias)
    # oneDNN's bf16 kernels need AMX or AVX512-BF16 (the AMX machines have them); a CPU without
    # AVX512 (an AVX2 AMD EPYC) runs plain bf16 F.linear: the same numbers are asked of both
    has_bf16_kernels = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert lin.packed_path == ("onednn-bf16" if has_bf16_kernels else "plain")
    got = lin(x)  # fp32 in, fp32 out: the input is rounded to bf16, products accumulate in fp32
    assert got.dtype == torch.float32 and got.shape == (num_rows, 96)
    ref = F.linear(x.bfloat16().float(), weight.float(), None if bias is None else bias.float())
    # the kernel writes its result in bf16: up to half an ulp at 8 mantissa bits (2^-9 relative)
    torch.testing.assert_close(got, ref, rtol=2**-8, atol=1e-4)
    # a plain bf16 input gives the same numbers, in bf16
    assert torch.equal(lin(x.bfloat16()), got.bfloat16())


@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (3072, 576)])  # SmolLM2's q|k|v, down, gate|up
def test_bf16_rows_come_out_as_if_each_ran_alone(shape):
    """Speculative verification runs a block of rows where decoding runs one: on the oneDNN bf16
    path every row of a 2-16-row call is bit-identical to that row alone, so a verified position
    sees exactly the projections one-token decoding would have computed."""
    g = torch.Generator().manual_seed(7)
    lin = Linear((torch.randn(*shape, generator=g) * 0.05).bfloat16())
    x = torch.randn(16, shape[1], generator=g)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(16)])
    for rows in (2, 5, 8, 16):
        assert torch.equal(lin(x[:rows]), alone[:rows]), rows
