"""The decoder's configuration: one object, built once, from defaults < env (DHISPARSE_DECODER_*) < explicit args."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.decoder.spec.drafter import LEARNED_DRAFTERS, SPEC_METHODS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DecoderConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DHISPARSE_DECODER_", extra="forbid")

    model: str | None = Field(None, description="path to a .gguf file or a HF-style directory; None = the default model")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    gemm_dtype: Literal["float32", "bfloat16", "float16"] | None = Field(
        None, description="the projections' weights and matmul precision (None = dtype); bfloat16 with an fp32 "
        "dtype keeps norms, residuals, attention and the KV pool in fp32 and runs the matmuls on oneDNN's bf16 "
        "kernels (AMX): decode measured 1.5-1.8x faster than fp32 on the 2-core CPU, see model/linear.py"
    )
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
    page_score: Literal["center", "quest"] = Field(
        "center", description="how sparse selection ranks pages: center = estimated attention mass from the key "
        "box's center (perplexity +0.9% over dense at top-k 2048 on 8K), quest = Quest upper bound (+2.8%)"
    )
    spec: Literal[SPEC_METHODS] = Field(
        "none", description="speculative decoding drafter (dflash2: DFlash with its candidate selector and convolutions)"
    )
    draft_model: str | None = Field(
        None, description="dflash/dspark checkpoint directory (config.json + model.safetensors); None = the shipped one"
    )
    spec_tokens: int = Field(4, ge=1, le=64, description="draft tokens verified per step")
    draft_gemm_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="dflash/dspark: the draft layers' and draft head's matmul precision (their stored "
        "weights are bf16; verification keeps decoding lossless at any); auto = bfloat16 where oneDNN runs bf16 "
        "kernels (AVX512-BF16 / AMX: a drafter call at 4 requests measured 10.1 -> 7.4 ms on the 2-core CPU), "
        "else gemm_dtype"
    )
    verify_budget: Literal["fixed", "adaptive"] = Field(
        "fixed", description="adaptive: per-request draft length from acceptance vs profiled step and fetch costs"
    )
    ngram_min_n: int = Field(1, ge=1)
    ngram_max_n: int = Field(4, ge=1)
    kvtier_address: str | None = Field(None, description="host:port of kvtier; None = no host tier")
    residency: Literal["adaptive", "always-sparse", "always-full"] | None = Field(
        None, description="hot-tier policy; None = adaptive with kvtier and sparse attention, else always-full"
    )
    sparse_buffer_pages: int | None = Field(
        None, gt=0, description="LRU buffer slots per SPARSE request; None = (verify length + 2) x top-k pages"
    )
    residency_low_watermark: float = Field(0.10, ge=0, lt=1, description="free-slot fraction below which FULL requests are demoted")
    residency_high_watermark: float = Field(0.25, gt=0, le=1, description="free-slot fraction above which SPARSE requests are promoted")
    resumable_requests: bool = Field(
        False, description="mark requests resumable in kvtier: their pages survive this decoder's death"
    )
    promote_pages_per_step: int = Field(64, gt=0, description="pages fetched per step for promotions (transfer budget)")
    decoder_id: str = Field("decoder-0", description="this decoder's identity towards kvtier and Redis")
    model_id: str = Field("SmolLM2-135M-Instruct", description="model id announced to kvtier and clients")
    gemm_kernels: Literal["measured", "default"] = Field(
        "measured", description="the projections' CPU GEMM kernel per row count: measured on the model's weights once "
        "per machine and cached (model/gemm_plan.py), or default (F.linear; oneDNN for bf16)"
    )
    num_threads: int | None = Field(None, gt=0, description="torch intra-op threads; None = torch default")
    device: str = Field(
        "cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$",
        description="where weights, the hot pool and the forward live: cpu, or cuda[:N] (dense attention, no "
        "kvtier, no learned drafter: those paths run on CPU tensors only so far)"
    )
    # ---- serving (services/decoder/service) ----
    served_model_name: str = Field("SmolLM2-135M-Instruct", description="model id advertised to clients")
    decoder_id: str | None = Field(None, description="name in Redis heartbeats ([A-Za-z0-9_.-]); None = hostname-port")
    host: str = Field("127.0.0.1", description="gRPC bind address (loopback; containers set 0.0.0.0)")
    port: int = Field(50051, ge=0, lt=65536, description="gRPC port (0 = pick a free one)")
    advertise_address: str | None = Field(None, description="host:port gateways dial; None = hostname:port")
    redis_url: str | None = Field(None, description="redis:// or unix:// URL for heartbeats; None = no registry")
    namespace: str = Field("dhisparse", description="Redis key namespace shared by all services")
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_ttl_s: float = Field(5.0, gt=0, description="a decoder silent this long is dead to gateways")
    max_num_waiting: int = Field(64, gt=0, description="queued requests beyond this get RESOURCE_EXHAUSTED")
    drain_timeout_s: float = Field(60.0, ge=0, description="on SIGTERM: time to finish in-flight requests")
    grpc_max_workers: int = Field(
        64, gt=0, description="gRPC threads (each open stream holds one); at least max_num_seqs + max_num_waiting + 16")
    # Internal gRPC security (services/rpc/auth.py): the one token of every internal service, checked
    # on this decoder's port and sent to kvtier; TLS on the port with a cert and key, to kvtier with a CA.
    internal_token: SecretStr | None = Field(None, description="shared internal gRPC token; None = no check")
    internal_tls_cert: Path | None = Field(None, description="PEM certificate: serve gRPC over TLS (with the key)")
    internal_tls_key: Path | None = Field(None, description="PEM private key of internal_tls_cert")
    internal_tls_ca: Path | None = Field(None, description="PEM CA: dial kvtier over TLS, verified against it")
    # mutual TLS: require gateways' (and probes') client certificates; present one to kvtier
    internal_tls_client_ca: Path | None = Field(None, description="PEM CA: require client certificates it signed "
                                                "on this port (needs internal_tls_cert/key)")
    internal_tls_client_cert: Path | None = Field(None, description="PEM client certificate presented to kvtier "
                                                  "(and by --probe); needs internal_tls_ca")
    internal_tls_client_key: Path | None = Field(None, description="PEM private key of internal_tls_client_cert")

    @model_validator(mode="after")
    def _check_spec_with_sparse(self) -> DecoderConfig:
        if self.device != "cpu":
            unsupported = [name for name, on in (("attention='sparse'", self.attention == "sparse"),
                                                 ("a kvtier_address", self.kvtier_address is not None),
                                                 (f"spec={self.spec!r}", self.spec in LEARNED_DRAFTERS)) if on]
            if unsupported:
                raise ValueError(f"device={self.device!r} runs dense decoding only so far; "
                                 f"{', '.join(unsupported)} needs device='cpu'")
        # a verify block must not reach a page that plain decoding would score by digest: the
        # recent window has to cover the token's own page plus every page the block spans
        needed = 1 + -(-self.spec_tokens // self.page_size)
        if self.spec != "none" and self.attention == "sparse" and self.recent_pages < needed:
            raise ValueError(
                f"recent_pages={self.recent_pages} is too small for spec_tokens={self.spec_tokens}: "
                f"sparse verification needs recent_pages >= {needed}"
            )
        if self.residency in ("adaptive", "always-sparse"):
            if self.attention != "sparse" or not self.kvtier_address:
                raise ValueError(
                    f"residency={self.residency!r} keeps only working sets hot: it needs attention='sparse' "
                    "and a kvtier_address (the host tier holds the cold pages)"
                )
        if self.residency_low_watermark >= self.residency_high_watermark:
            raise ValueError("residency_low_watermark must be below residency_high_watermark (hysteresis)")
        if self.sparse_buffer_pages is not None and self.sparse_buffer_pages < self.verify_len * self.top_k_pages:
            raise ValueError(
                f"sparse_buffer_pages={self.sparse_buffer_pages} cannot hold one step's working set: "
                f"needs >= verify length {self.verify_len} x top-k {self.top_k_pages} pages"
            )
        if self.ngram_min_n > self.ngram_max_n:
            raise ValueError(f"ngram_min_n={self.ngram_min_n} > ngram_max_n={self.ngram_max_n}")
        return self

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_gemm_dtype(self) -> torch.dtype:
        return DTYPES[self.gemm_dtype or self.dtype]

    @property
    def residency_policy(self) -> str:
        if self.residency is not None:
            return self.residency
        return "adaptive" if self.attention == "sparse" and self.kvtier_address else "always-full"

    @property
    def verify_len(self) -> int:
        """Query tokens per request per step at most (1 + draft tokens)."""
        return 1 + (self.spec_tokens if self.spec != "none" else 0)

    @property
    def buffer_pages(self) -> int:
        return self.sparse_buffer_pages or max(1, (self.verify_len + 2) * self.top_k_pages)

    @property
    def top_k_pages(self) -> int:
        return -(-self.top_k_tokens // self.page_size)

    @property
    def num_slots(self) -> int:
        return self.kv_cache_tokens // self.page_size
