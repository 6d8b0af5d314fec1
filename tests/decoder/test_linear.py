import pytest
import torch
import torch.nn.functional as F

from services.decoder.model.gemm_plan import GemmPlan
from services.decoder.model.linear import KERNELS, PACK_BUCKETS_ROWS, Linear, available_kernels, onednn_bf16_supported


@pytest.mark.parametrize("num_rows", [1, 2, 3, 4, 7, 8, 9, 16, 17, 33, 64, 65, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_kernel_matches_f_linear_at_every_row_count(num_rows, with_bias):
    g = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(96, 40, generator=g)
    bias = torch.randn(96, generator=g) if with_bias else None
    x = torch.randn(num_rows, 40, generator=g)
    lin = Linear(weight, bias)
    kernels = available_kernels(weight, num_rows)
    # this project's CPU torch build ships MKL and oneDNN: every kernel is exercised where it applies
    assert set(kernels) == set(KERNELS) - ({"mkl_pack"} if not 4 <= num_rows <= 64 else set())
    ref = F.linear(x, weight, bias)
    for kernel in kernels:
        got = lin.run(x, kernel)
        assert got.shape == (num_rows, 96) and got.is_contiguous(), kernel
        # a different summation order per kernel: fp32 rounding only
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5, msg=kernel)


def test_a_linear_follows_its_plan_and_packs_build_per_bucket_on_first_use():
    plan = GemmPlan((3, 8, 16, 128), ("mm_w_xt", "mkl_pack", "mkl_pack", "onednn"))
    lin = Linear(torch.randn(32, 16), plan=plan)
    assert [lin.kernel(n) for n in (1, 2, 3, 8, 9, 16, 17, 500)] == \
        ["mm_w_xt", "mm_w_xt", "mm_w_xt", "mkl_pack", "mkl_pack", "mkl_pack", "onednn", "onednn"]
    assert [lin.padded_rows(n) for n in (1, 3, 5, 8, 12, 17)] == [1, 3, 8, 8, 16, 17]
    for n in (5, 8, 12, 1):
        lin(torch.randn(n, 16))
    assert sorted(lin._packs) == [8, 16] and set(lin._packs) <= set(PACK_BUCKETS_ROWS)
    assert lin._onednn_pack is None  # not run yet
    lin(torch.randn(40, 16))
    assert lin._onednn_pack is not None
    lin.drop_packs({"onednn"})
    assert not lin._packs and lin._onednn_pack is not None


def test_plans_that_cannot_run_are_refused():
    with pytest.raises(ValueError, match="MKL packs serve"):
        GemmPlan((2, 8), ("f_linear", "mkl_pack"))  # 3-8: no pack serves 3 rows
    with pytest.raises(ValueError, match="MKL packs serve"):
        GemmPlan((3, 64), ("f_linear", "mkl_pack"))  # beyond the grid: 65+ rows
    with pytest.raises(ValueError, match="unknown GEMM kernels"):
        GemmPlan((1,), ("cublas",))
    with pytest.raises(ValueError, match="ascending"):
        GemmPlan((4, 2), ("f_linear", "f_linear"))
    with pytest.raises(ValueError, match="no MKL pack serves 3 rows"):
        Linear(torch.randn(8, 8)).run(torch.randn(3, 8), "mkl_pack")


def test_default_kernels_by_dtype():
    assert Linear(torch.randn(8, 8)).kernel(5) == "f_linear"
    assert "mkl_pack" not in available_kernels(torch.randn(8, 8, dtype=torch.bfloat16), 8)  # packs are fp32
    bf16 = Linear(torch.randn(8, 8, dtype=torch.bfloat16))
    # plain bf16 GEMMs are slower than fp32 where oneDNN has bf16 kernels (AMX, AVX512-BF16)
    assert bf16.kernel(1) == ("onednn" if onednn_bf16_supported() else "f_linear")


@pytest.mark.parametrize("num_rows", [1, 3, 8, 13, 16, 64, 200])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bf16_linear_matches_a_bf16_rounded_reference(num_rows, with_bias):
    g = torch.Generator().manual_seed(100 + num_rows)
    weight = torch.randn(96, 40, generator=g).bfloat16()
    bias = torch.randn(96, generator=g).bfloat16() if with_bias else None
    x = torch.randn(num_rows, 40, generator=g)
    lin = Linear(weight, bias)
    ref = F.linear(x.bfloat16().float(), weight.float(), None if bias is None else bias.float())
    for kernel in available_kernels(weight, num_rows):
        got = lin.run(x.bfloat16(), kernel).float()  # the input rounded to bf16, products accumulated in fp32
        assert got.shape == (num_rows, 96)
        # the kernels write their result in bf16: up to half an ulp at 8 mantissa bits (2^-9 relative)
        torch.testing.assert_close(got, ref, rtol=2**-8, atol=1e-4, msg=kernel)
    got = lin(x)  # fp32 in, fp32 out
    assert got.dtype == torch.float32 and torch.equal(lin(x.bfloat16()), got.bfloat16())


@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (3072, 576)])  # SmolLM2's q|k|v, down, gate|up
def test_bf16_rows_come_out_as_if_each_ran_alone(shape):
    """Speculative verification runs a block of rows where decoding runs one: on the oneDNN bf16
    path (plain bf16 ``F.linear`` where the CPU lacks its kernels) every row of a 2-16-row call is bit-identical to that row alone, so a verified position
    sees exactly the projections one-token decoding would have computed."""
    g = torch.Generator().manual_seed(7)
    lin = Linear((torch.randn(*shape, generator=g) * 0.05).bfloat16())
    x = torch.randn(16, shape[1], generator=g)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(16)])
    for rows in (2, 5, 8, 16):
        assert torch.equal(lin(x[:rows]), alone[:rows]), rows
