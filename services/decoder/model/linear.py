"""Linear layers for the decoder: ``y = x @ weight.T + bias`` on ``x: [num_tokens, in_features]``.

Two CPU fast paths, both chosen by the weight's dtype:

- **fp32, MKL packs.** A decode batch of a few rows is where MKL's plain sgemm is weakest: with 8
  rows it takes ~2.4x the time of 1 row although it reads the same weight bytes (measured on this
  project's 2-core machines). MKL's packed GEMM (``cblas_sgemm_pack``, exposed as ``torch.ops.mkl``)
  keeps 8-64 rows close to the one-row cost, but a pack is built for one exact row count. So row
  counts in [4, 64] are padded up to a bucket (8, 16, 32, 64) whose pack is built on first use;
  other counts use ``F.linear`` (3 rows: sgemm ~1.17x one row, an 8-row pack ~1.37x). A pack holds
  a re-laid-out copy of the weight, so each used bucket costs about one more weight copy of memory.
- **bf16, one oneDNN pack.** With bf16 weights on a CPU whose oneDNN has bf16 kernels (AMX or
  AVX512-BF16), the weight is re-laid out once (``mkldnn._reorder_linear_weight`` without a batch
  size) and every row count runs on that pack with fp32 accumulation. Measured on the 2-core AMX
  machine with SmolLM2-135M's shapes, each layer's weight cache-hot (30 layers + LM head): 1 row
  4.9 ms vs fp32 8.1 ms, 8 rows 5.2 ms vs fp32 packs 11.3 ms, 16 rows 5.9 ms vs 16.7 ms; plain bf16
  ``F.linear`` is slower than fp32 at 1 row (9.6 ms). In the engine a step streams every weight
  from DRAM, so the gain is the halved bytes: 4 concurrent decodes 142-148 vs 78 tok/s in fp32.
  The result is bf16 (logits near 20 step by 0.125, so top-two ties happen), and on some CPUs a
  row's rounding depends on the call's row count: on the AMX machine rows matched one-row calls up
  to 16, on an AVX512-BF16 AMD EPYC the K=1536 down projection differs from 7-15 rows on. Greedy
  decoding in bf16 (plain batched as well as speculative) is therefore exact only up to such
  rounding ties; in fp32 (the default) row counts change only the last bits of a sum, and
  greedy outputs, speculative or not, match token for token in every test.

Inputs of another dtype than the weight are rounded to the weight's dtype and the result is
returned in the input's dtype (bf16 projections inside an fp32 model, see ``LlamaModel``).
``packed_gemm=False`` turns both packing paths off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACK_BUCKETS_ROWS = (8, 16, 32, 64)
MIN_PACKED_ROWS = 4  # 1-3 rows: plain sgemv/sgemm costs less than padding to an 8-row pack


def padded_rows(num_rows: int, buckets: tuple[int, ...] = PACK_BUCKETS_ROWS, min_rows: int = MIN_PACKED_ROWS) -> int:
    """The rows an fp32 packed GEMM runs for ``num_rows``: the smallest of ``buckets`` (ascending)
    that holds them when ``min_rows <= num_rows <= buckets[-1]``, else ``num_rows`` itself. A
    step costs what its padded rows cost (the verify budget prices counts with this rule too)."""
    if buckets and min_rows <= num_rows <= buckets[-1]:
        return next(b for b in buckets if num_rows <= b)
    return num_rows


def packed_gemm_available(weight: torch.Tensor) -> bool:
    """fp32 MKL packs for this weight."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkl.is_available()


def onednn_bf16_available(weight: torch.Tensor) -> bool:
    """one oneDNN bf16 pack for this weight (needs bf16 kernels in this CPU's oneDNN)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, packed_gemm: bool = True):
        self.weight = weight  # [out_features, in_features]
        self.bias = bias  # [out_features] or None, in the weight's dtype
        self.use_packs = packed_gemm and packed_gemm_available(weight)
        self._packs: dict[int, torch.Tensor] = {}
        self._onednn_pack: torch.Tensor | None = None  # opaque oneDNN layout of ``weight``
        if packed_gemm and onednn_bf16_available(weight):
            self._onednn_pack = torch.ops.mkldnn._reorder_linear_weight(weight)

    @property
    def packed_path(self) -> str:
        """Which kernel family runs this layer: ``mkl-fp32-packs``, ``onednn-bf16`` or ``plain``."""
        if self.use_packs:
            return "mkl-fp32-packs"
        return "onednn-bf16" if self._onednn_pack is not None else "plain"

    @property
    def weight_bytes(self) -> int:
        total = self.weight.numel() * self.weight.element_size()
        if self.bias is not None:
            total += self.bias.numel() * self.bias.element_size()
        return total

    def _pack(self, rows: int) -> torch.Tensor:
        pack = self._packs.get(rows)
        if pack is None:
            pack = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows)
            self._packs[rows] = pack
        return pack

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x: [num_rows, in_features]`` -> ``[num_rows, out_features]`` in ``x``'s dtype."""
        out_dtype = x.dtype
        if x.dtype != self.weight.dtype:
            x = x.to(self.weight.dtype)
        if self._onednn_pack is not None:
            y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._onednn_pack, self.bias, "none", [], "")
        elif self.use_packs and (bucket := padded_rows(x.shape[0])) in PACK_BUCKETS_ROWS:
            num_rows = x.shape[0]
            if num_rows != bucket:
                x = F.pad(x, (0, 0, 0, bucket - num_rows))
            y = torch.ops.mkl._mkl_linear(x.contiguous(), self._pack(bucket), self.weight, self.bias, bucket)[:num_rows]
        else:
            y = F.linear(x, self.weight, self.bias)
        return y.to(out_dtype)
