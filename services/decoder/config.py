"""The decoder's configuration: one object, built once, from defaults < env (DHISPARSE_DECODER_*) < explicit args."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DecoderConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DHISPARSE_DECODER_", extra="forbid")

    model: str | None = Field(None, description="path to a .gguf file or a HF-style directory; None = the default model")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    page_size: int = Field(16, gt=0)
    kv_cache_tokens: int = Field(32768, gt=0, description="hot pool capacity in tokens (rounded down to pages)")
    max_num_seqs: int = Field(32, gt=0)
    max_num_batched_tokens: int = Field(512, gt=0, description="tokens per engine step (prefill chunk budget)")
    max_model_len: int | None = Field(None, gt=0, description="default: the model's context length")
    attention: Literal["dense", "sparse"] = Field(
        "dense", description="sparse: decode tokens attend over sink + top-k + recent pages"
    )
    top_k_tokens: int = Field(2048, ge=0, description="sparse top-k budget in tokens, rounded up to pages")
    sink_pages: int = Field(1, ge=0)
    recent_pages: int = Field(4, ge=1, description="recent window in pages, including the unsealed tail")
    packed_gemm: bool = Field(True, description="CPU fp32: MKL packed GEMM for 3-64-row batches (see model/linear.py)")
    num_threads: int | None = Field(None, gt=0, description="torch intra-op threads; None = torch default")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def top_k_pages(self) -> int:
        return -(-self.top_k_tokens // self.page_size)

    @property
    def num_slots(self) -> int:
        return self.kv_cache_tokens // self.page_size
