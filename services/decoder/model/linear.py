"""Linear layers for the decoder: ``y = x @ weight.T + bias`` on ``x: [num_tokens, in_features]``.

The same product has several CPU kernels, and which one is fastest at a given row count depends
on the CPU and its BLAS, by factors of 2-4 at the 1-16 rows that decoding and verification run:

- ``f_linear``: plain ``F.linear`` (MKL sgemm on x86 builds).
- ``mm_w_xt``: ``mm(W, x^T)^T``, the product laid out as a tall-skinny GEMM that streams W once.
- ``mkl_pack``: MKL's packed GEMM (``cblas_sgemm_pack``, ``torch.ops.mkl``), fp32 only. A pack is
  built for one exact row count, so counts in [4, 64] pad up to a bucket (8, 16, 32, 64) whose
  pack is built on first use, one re-laid-out weight copy per used bucket.
- ``onednn``: one oneDNN pack of the weight (``mkldnn._reorder_linear_weight`` without a batch
  size) serving every row count, fp32 or (on CPUs whose oneDNN has bf16 kernels: AMX,
  AVX512-BF16) bf16 with fp32 accumulation. One weight copy, built on first use.

Measured on this project's machines (all projections of SmolLM2-135M, streamed from DRAM,
``benchmarks/linear_rows.py``): on the Intel AMX machine ``f_linear`` at 1-3 rows and
``mkl_pack`` at 4-64 cost about one row's time; on the AMD EPYC machines MKL takes slow paths
(``f_linear`` 52 / 88 / 111 ms at 1 / 2 / 3 rows) while ``onednn`` runs 27 / 29 / 26 ms and
``mm_w_xt`` 52 / 19 / 26 ms. So no fixed choice serves both: a ``GemmPlan`` (``model/gemm_plan.py``)
maps each row count to a kernel (and, where measured faster, a larger count its rows are zero-padded
to: 1 row runs as ``mm_w_xt`` at 2 on the EPYC), measured on the model's own weights at start-up; a ``Linear``
follows the plan it is given (default: ``f_linear`` everywhere, or ``onednn`` for bf16 weights
where oneDNN has bf16 kernels, since plain bf16 GEMMs are slower than fp32 there).

Summation order differs between kernels and, within one kernel, between row counts: in fp32 only
the last bits of a sum change, and greedy outputs (speculative or not) match token for token in
every test. bf16 results are bf16 (logits near 20 step by 0.125, so top-two ties happen), and on
some CPUs a row's rounding depends on the call's row count (the AVX512-BF16 AMD EPYC: the
K=1536 down projection from 7-15 rows on), so greedy decoding in bf16 is exact only up to such
ties.

Inputs of another dtype than the weight are rounded to the weight's dtype and the result is
returned in the input's dtype (bf16 projections inside an fp32 model, see ``LlamaModel``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACK_BUCKETS_ROWS = (8, 16, 32, 64)
MIN_PACKED_ROWS = 4  # below this an 8-row pack costs more than the rows themselves on every machine seen

KERNELS = ("f_linear", "mm_w_xt", "mkl_pack", "onednn")


def pack_bucket(num_rows: int) -> int | None:
    """The MKL pack bucket ``num_rows`` pads up to, or None when no pack serves that count."""
    if MIN_PACKED_ROWS <= num_rows <= PACK_BUCKETS_ROWS[-1]:
        return next(b for b in PACK_BUCKETS_ROWS if num_rows <= b)
    return None


def onednn_bf16_supported() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def available_kernels(weight: torch.Tensor, num_rows: int) -> tuple[str, ...]:
    """The kernels that can run ``weight`` at ``num_rows`` rows on this machine."""
    out = ["f_linear", "mm_w_xt"]
    if weight.device.type != "cpu":
        return tuple(out)
    if weight.dtype == torch.float32 and torch.backends.mkl.is_available() and pack_bucket(num_rows) is not None:
        out.append("mkl_pack")
    if torch.backends.mkldnn.is_available() and (
        weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and onednn_bf16_supported())
    ):
        out.append("onednn")
    return tuple(out)


def default_kernel(weight: torch.Tensor) -> str:
    """What a ``Linear`` runs before it is given a measured plan."""
    return "onednn" if "onednn" in available_kernels(weight, 1) and weight.dtype == torch.bfloat16 else "f_linear"


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, plan=None):
        """``weight: [out_features, in_features]``, ``bias: [out_features]`` (the weight's dtype) or
        None; ``plan``: a ``GemmPlan`` (None: ``default_kernel`` at every row count)."""
        self.weight = weight
        self.bias = bias
        self.plan = plan
        self._default = default_kernel(weight)
        self._packs: dict[int, torch.Tensor] = {}  # MKL packs per bucket rows
        self._onednn_pack: torch.Tensor | None = None  # opaque oneDNN layout of ``weight``

    @property
    def weight_bytes(self) -> int:
        total = self.weight.numel() * self.weight.element_size()
        if self.bias is not None:
            total += self.bias.numel() * self.bias.element_size()
        return total

    def kernel(self, num_rows: int) -> str:
        return self._default if self.plan is None else self.plan.kernel(num_rows)

    def run_rows(self, num_rows: int) -> int:
        """The rows ``num_rows`` rows are handed to their kernel at (the plan's pad, else themselves)."""
        return num_rows if self.plan is None else self.plan.run_rows(num_rows)

    def padded_rows(self, num_rows: int) -> int:
        """The rows the kernel for ``num_rows`` computes (the plan's pad, then an MKL pack's bucket)."""
        rows = self.run_rows(num_rows)
        return pack_bucket(rows) if self.kernel(num_rows) == "mkl_pack" else rows

    def needs_build(self, kernel: str, num_rows: int) -> bool:
        """Whether running ``kernel`` at ``num_rows`` would first build a weight copy."""
        if kernel == "mkl_pack":
            return pack_bucket(num_rows) not in self._packs
        return kernel == "onednn" and self._onednn_pack is None

    def drop_packs(self, keep: set[str]) -> None:
        """Frees the weight copies of kernels not in ``keep`` (after a plan chose)."""
        if "mkl_pack" not in keep:
            self._packs.clear()
        if "onednn" not in keep:
            self._onednn_pack = None

    def run(self, x: torch.Tensor, kernel: str) -> torch.Tensor:
        """``x: [num_rows, in_features]`` in the weight's dtype through ``kernel`` ->
        ``[num_rows, out_features]`` in the weight's dtype."""
        num_rows = x.shape[0]
        if kernel == "f_linear":
            return F.linear(x, self.weight, self.bias)
        if kernel == "mm_w_xt":
            if self.bias is None:
                return torch.mm(self.weight, x.t()).t().contiguous()
            return torch.addmm(self.bias[:, None], self.weight, x.t()).t().contiguous()  # one rounding in bf16
        if kernel == "onednn":
            if self._onednn_pack is None:
                self._onednn_pack = torch.ops.mkldnn._reorder_linear_weight(self.weight)
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._onednn_pack, self.bias, "none", [], "")
        if kernel == "mkl_pack":
            bucket = pack_bucket(num_rows)
            if bucket is None:
                raise ValueError(f"no MKL pack serves {num_rows} rows (packs: {MIN_PACKED_ROWS}-{PACK_BUCKETS_ROWS[-1]})")
            pack = self._packs.get(bucket)
            if pack is None:
                pack = self._packs[bucket] = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, bucket)
            if num_rows != bucket:
                x = F.pad(x, (0, 0, 0, bucket - num_rows))
            return torch.ops.mkl._mkl_linear(x.contiguous(), pack, self.weight, self.bias, bucket)[:num_rows]
        raise ValueError(f"unknown GEMM kernel {kernel!r} (known: {', '.join(KERNELS)})")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [num_rows, in_features]`` -> ``[num_rows, out_features]`` in ``x``'s dtype."""
        out_dtype = x.dtype
        if x.dtype != self.weight.dtype:
            x = x.to(self.weight.dtype)
        num_rows = x.shape[0]
        kernel, rows = (self._default, num_rows) if self.plan is None else self.plan.choice(num_rows)
        if rows == num_rows:
            return self.run(x, kernel).to(out_dtype)
        # zero rows up to the plan's pad: a faster row count for this kernel (``GemmPlan.pad_to``)
        return self.run(F.pad(x, (0, 0, 0, rows - num_rows)), kernel)[:num_rows].to(out_dtype)
