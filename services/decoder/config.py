"""The decoder's configuration: one object, built once, from defaults < env (DHISPARSE_DECODER_*) < explicit args."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
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
    allow_long_context: bool = Field(
        False, description="allow max_model_len past the trained context (RoPE extrapolates: throughput tests only)"
    )
    attention: Literal["dense", "sparse"] = Field(
        "dense", description="sparse: decode tokens attend over sink + top-k + recent pages"
    )
    top_k_tokens: int = Field(2048, ge=0, description="sparse top-k budget in tokens, rounded up to pages")
    sink_pages: int = Field(1, ge=0)
    recent_pages: int = Field(4, ge=1, description="recent window in pages, including the unsealed tail")
    spec: Literal["none", "ngram"] = Field("none", description="speculative decoding drafter")
    spec_tokens: int = Field(4, ge=1, le=64, description="draft tokens verified per step")
    ngram_min_n: int = Field(1, ge=1)
    ngram_max_n: int = Field(4, ge=1)
    kvtier_address: str | None = Field(None, description="host:port of kvtier; None = no host tier")
    decoder_id: str = Field("decoder-0", description="this decoder's identity towards kvtier and Redis")
    model_id: str = Field("SmolLM2-135M-Instruct", description="model id announced to kvtier and clients")
    packed_gemm: bool = Field(True, description="CPU fp32: MKL packed GEMM for 3-64-row batches (see model/linear.py)")
    num_threads: int | None = Field(None, gt=0, description="torch intra-op threads; None = torch default")
    # ---- serving (services/decoder/service) ----
    served_model_name: str = Field("SmolLM2-135M-Instruct", description="model id advertised to clients")
    decoder_id: str | None = Field(None, description="name in Redis heartbeats ([A-Za-z0-9_.-]); None = hostname-port")
    host: str = Field("0.0.0.0", description="gRPC bind address")
    port: int = Field(50051, ge=0, lt=65536, description="gRPC port (0 = pick a free one)")
    advertise_address: str | None = Field(None, description="host:port gateways dial; None = hostname:port")
    redis_url: str | None = Field(None, description="redis:// or unix:// URL for heartbeats; None = no registry")
    namespace: str = Field("dhisparse", description="Redis key namespace shared by all services")
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_ttl_s: float = Field(5.0, gt=0, description="a decoder silent this long is dead to gateways")
    max_num_waiting: int = Field(64, gt=0, description="queued requests beyond this get RESOURCE_EXHAUSTED")
    drain_timeout_s: float = Field(60.0, ge=0, description="on SIGTERM: time to finish in-flight requests")
    grpc_max_workers: int = Field(64, gt=0, description="gRPC threads (each open stream holds one)")

    @model_validator(mode="after")
    def _check_spec_with_sparse(self) -> DecoderConfig:
        # a verify block must not reach a page that plain decoding would score by digest: the
        # recent window has to cover the token's own page plus every page the block spans
        needed = 1 + -(-self.spec_tokens // self.page_size)
        if self.spec != "none" and self.attention == "sparse" and self.recent_pages < needed:
            raise ValueError(
                f"recent_pages={self.recent_pages} is too small for spec_tokens={self.spec_tokens}: "
                f"sparse verification needs recent_pages >= {needed}"
            )
        if self.ngram_min_n > self.ngram_max_n:
            raise ValueError(f"ngram_min_n={self.ngram_min_n} > ngram_max_n={self.ngram_max_n}")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def top_k_pages(self) -> int:
        return -(-self.top_k_tokens // self.page_size)

    @property
    def num_slots(self) -> int:
        return self.kv_cache_tokens // self.page_size
