"""Linear layers for the decoder: ``y = x @ weight.T + bias`` on ``x: [num_tokens, in_features]``.

On CPU in fp32, a decode batch of a few rows is where MKL's plain sgemm is weakest: with 8 rows it
takes ~2.4x the time of 1 row although it reads the same weight bytes (measured on this project's
2-core machines). MKL's packed GEMM (``cblas_sgemm_pack``, exposed as ``torch.ops.mkl``) keeps
8-64 rows close to the one-row cost, but a pack is built for one exact row count. So row counts
in [4, 64] are padded up to a bucket (8, 16, 32, 64) whose pack is built on first use; other
counts use ``F.linear`` (3 rows: sgemm ~1.17x one row, an 8-row pack ~1.37x). A pack holds a
re-laid-out copy of the weight, so each used bucket costs about one more weight copy of memory;
``packed_gemm=False`` turns the whole mechanism off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACK_BUCKETS_ROWS = (8, 16, 32, 64)
MIN_PACKED_ROWS = 4  # 1-3 rows: plain sgemv/sgemm costs less than padding to an 8-row pack


def packed_gemm_available(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkl.is_available()


class Linear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, packed_gemm: bool = True):
        self.weight = weight  # [out_features, in_features]
        self.bias = bias  # [out_features] or None
        self.use_packs = packed_gemm and packed_gemm_available(weight)
        self._packs: dict[int, torch.Tensor] = {}

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
        """``x: [num_rows, in_features]`` -> ``[num_rows, out_features]``."""
        num_rows = x.shape[0]
        if self.use_packs and MIN_PACKED_ROWS <= num_rows <= PACK_BUCKETS_ROWS[-1]:
            bucket = next(b for b in PACK_BUCKETS_ROWS if num_rows <= b)
            if num_rows != bucket:
                x = F.pad(x, (0, 0, 0, bucket - num_rows))
            y = torch.ops.mkl._mkl_linear(x.contiguous(), self._pack(bucket), self.weight, self.bias, bucket)
            return y[:num_rows]
        return F.linear(x, self.weight, self.bias)
