"""The gateway's configuration: one object, built once, from defaults < env (DHISPARSE_GATEWAY_*) < explicit args."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewayConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DHISPARSE_GATEWAY_", extra="forbid")

    host: str = Field("0.0.0.0", description="HTTP bind address")
    port: int = Field(8000, ge=0, lt=65536, description="HTTP port")
    model_name: str = Field("SmolLM2-135M-Instruct", description="the model id clients send and /v1/models lists")
    redis_url: str | None = Field(None, description="decoder registry (heartbeats); None = use decoder_addresses")
    namespace: str = Field("dhisparse", description="Redis key namespace shared by all services")
    decoder_addresses: list[str] = Field(default_factory=list,
                                         description="static decoders (host:port), used when redis_url is None")
    registry_refresh_s: float = Field(0.25, gt=0, description="how long a read of the heartbeats is reused")
    api_keys: list[SecretStr] = Field(default_factory=list,
                                      description="accepted Bearer keys (masked in reprs); empty = no auth")
    max_body_bytes: int = Field(1 << 20, gt=0, description="larger request bodies get 413")
    max_prompt_tokens: int = Field(0, ge=0, lt=2**32, description="longer prompts get 400; 0 = the model's context only")
    max_tokens_limit: int = Field(4096, gt=0, lt=2**32, description="largest max_tokens a request may ask for")
    default_max_tokens: int = Field(256, gt=0, description="max_tokens of a chat request that sets none")
    retry_after_s: int = Field(1, ge=0, description="Retry-After of a 429 when every decoder is saturated")
    max_decoder_attempts: int = Field(3, gt=0, description="decoders tried when one refuses (queue full, draining)")
    resume_timeout_s: float = Field(60.0, ge=0, description="a stream whose decoder handed it off or died (resumable "
                                    "requests) is resumed on a live decoder within this many seconds; 0 = never")
    decoder_keepalive_s: float = Field(10.0, gt=0, description="ping each decoder connection with open streams "
                                       "this often; one that answers no ping within as long (frozen, cut off) fails "
                                       "its streams (resumable ones resume elsewhere)")
    log_level: str = "info"
    # Internal gRPC security towards the decoders (services/rpc/auth.py)
    internal_token: SecretStr | None = Field(None, description="shared internal gRPC token sent to decoders")
    internal_tls_ca: Path | None = Field(None, description="PEM CA: dial decoders over TLS, verified against it")
    internal_tls_client_cert: Path | None = Field(None, description="PEM client certificate presented to decoders "
                                                  "(mutual TLS); needs internal_tls_ca")
    internal_tls_client_key: Path | None = Field(None, description="PEM private key of internal_tls_client_cert")
