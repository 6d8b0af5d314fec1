"""kvtier's configuration: one object, built once, from defaults < env (DHISPARSE_KVTIER_*) < explicit args."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.metadata.keys import check_name

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GIB = 2**30


class KvtierConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DHISPARSE_KVTIER_", extra="forbid")

    instance: str = Field("default", description="instance name: namespaces the shm segment and Redis keys")
    namespace: str = Field("dhisparse", description="Redis key namespace shared by all services")
    host: str = Field("127.0.0.1", description="gRPC listen address")
    port: int = Field(50061, ge=0, le=65535, description="gRPC port (0 = pick a free one, printed at start)")
    redis_url: str | None = Field(None, description="external Redis; None = embedded Redis in redis_dir")
    redis_dir: Path | None = Field(None, description="embedded Redis directory; None = /tmp/dhisparse-<uid>/<instance>")
    host_pool_gib: float | None = Field(None, gt=0, description="host pool size in GiB (rounded down to pages)")
    host_pool_pages: int | None = Field(None, gt=0, description="host pool size in pages (overrides host_pool_gib)")
    # Page layout of the pool (the default model: SmolLM2-135M, fp32, 16-token pages).
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    num_layers: int = Field(30, gt=0)
    num_kv_heads: int = Field(3, gt=0)
    head_dim: int = Field(64, gt=0)
    page_size: int = Field(16, gt=0, description="tokens per page")
    model_id: str = Field("", description="model whose pages the pool holds; empty = bound by the first attach")
    lease_ttl_s: float = Field(10.0, gt=0, description="a decoder silent this long loses its non-resumable pages")
    resumable_ttl_s: float = Field(300.0, gt=0, description="a resumable request whose decoder's lease ended is "
                                   "freed this long after, unless a decoder claims it (keep above the gateways' "
                                   "resume_timeout_s)")
    reap_interval_s: float | None = Field(None, gt=0, description="lease check period; None = lease_ttl_s / 4")
    # Internal gRPC security (services/rpc/auth.py): every call must carry the token; TLS with a cert and key.
    internal_token: SecretStr | None = Field(None, description="shared internal gRPC token; None = no check")
    internal_tls_cert: Path | None = Field(None, description="PEM certificate: serve gRPC over TLS (with the key)")
    internal_tls_key: Path | None = Field(None, description="PEM private key of internal_tls_cert")
    # mutual TLS: only clients (decoders, probes) with a certificate from this CA connect
    internal_tls_client_ca: Path | None = Field(None, description="PEM CA: require client certificates it signed "
                                                "(needs internal_tls_cert/key)")
    internal_tls_bind_decoder_id: bool = Field(False, description="a call's decoder_id must be the client "
                                               "certificate's CN or a DNS SAN (needs internal_tls_client_ca)")

    @field_validator("instance", "namespace")
    @classmethod
    def _names(cls, value: str) -> str:
        return check_name("name", value)

    @model_validator(mode="after")
    def _pool_size(self) -> KvtierConfig:
        if self.host_pool_pages is None and self.host_pool_gib is None:
            self.host_pool_gib = 2.0
        if self.num_host_pages <= 0:
            raise ValueError(f"host pool of {self.host_pool_gib} GiB holds no {self.host_page_bytes}-byte page")
        return self

    @property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.dtype]

    @property
    def host_page_bytes(self) -> int:
        """Bytes of one host page: every layer, K and V: ``2 * num_layers * page_size * num_kv_heads * head_dim * elem``."""
        return 2 * self.num_layers * self.page_size * self.num_kv_heads * self.head_dim * self.element_bytes

    @property
    def num_host_pages(self) -> int:
        if self.host_pool_pages is not None:
            return self.host_pool_pages
        return int(self.host_pool_gib * GIB) // self.host_page_bytes

    @property
    def segment_name(self) -> str:
        """POSIX shm name (``/dev/shm/<segment_name>``), one per (namespace, instance)."""
        return f"{self.namespace}-kvtier-{self.instance}"

    @property
    def resolved_redis_dir(self) -> Path:
        import os

        return self.redis_dir or Path(f"/tmp/dhisparse-{os.getuid()}") / self.instance

    @property
    def resolved_reap_interval_s(self) -> float:
        return self.reap_interval_s or self.lease_ttl_s / 4
