"""Command-line flags of kvtier, shared by ``python -m services.kvtier`` and ``dhisparse kvtier``.
Each flag maps onto one ``KvtierConfig`` field; flags left out keep the env/default value."""

from __future__ import annotations

import argparse

from services.kvtier.config import KvtierConfig

# flag -> (field, type, help)
FLAGS = {
    "--instance": ("instance", str, "instance name (namespaces the shm segment and Redis keys)"),
    "--namespace": ("namespace", str, "Redis key namespace shared by all services"),
    "--host": ("host", str, "gRPC listen address"),
    "--port": ("port", int, "gRPC port (0: pick a free one)"),
    "--redis-url": ("redis_url", str, "external Redis (default: an embedded one)"),
    "--redis-dir": ("redis_dir", str, "directory of the embedded Redis"),
    "--host-pool-gib": ("host_pool_gib", float, "host pool size in GiB"),
    "--host-pool-pages": ("host_pool_pages", int, "host pool size in pages (overrides --host-pool-gib)"),
    "--dtype": ("dtype", str, "page dtype: float32, bfloat16, float16"),
    "--num-layers": ("num_layers", int, "layers per page"),
    "--num-kv-heads": ("num_kv_heads", int, "kv heads per layer"),
    "--head-dim": ("head_dim", int, "head dimension"),
    "--page-size": ("page_size", int, "tokens per page"),
    "--model-id": ("model_id", str, "model of the pages (default: bound by the first attach)"),
    "--lease-ttl-s": ("lease_ttl_s", float, "seconds a silent decoder keeps its pages"),
    "--resumable-ttl-s": ("resumable_ttl_s", float, "seconds a dead decoder's resumable requests wait for a claim"),
    "--reap-interval-s": ("reap_interval_s", float, "lease check period in seconds"),
    # the internal token is read from DHISPARSE_KVTIER_INTERNAL_TOKEN only (a flag would show in ps)
    "--internal-tls-cert": ("internal_tls_cert", str, "PEM certificate: serve gRPC over TLS"),
    "--internal-tls-key": ("internal_tls_key", str, "PEM private key of --internal-tls-cert"),
    "--internal-tls-client-ca": ("internal_tls_client_ca", str, "PEM CA: require client certificates it signed"),
    "--internal-tls-bind-decoder-id": ("internal_tls_bind_decoder_id", bool,
                                       "a call's decoder id must be named by its client certificate (CN or DNS SAN)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for flag, (field, kind, help_text) in FLAGS.items():
        if kind is bool:  # a switch: present = True, absent = the env/default value
            parser.add_argument(flag, dest=field, action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=field, type=kind, default=None, help=help_text)
    return parser


def config_from_namespace(args: argparse.Namespace) -> KvtierConfig:
    fields = {field: getattr(args, field) for field, _, _ in FLAGS.values() if getattr(args, field, None) is not None}
    return KvtierConfig(**fields)


def config_from_args(argv: list[str] | None = None) -> KvtierConfig:
    parser = add_arguments(argparse.ArgumentParser(prog="python -m services.kvtier", description="kvtier: the host KV pool service"))
    return config_from_namespace(parser.parse_args(argv))
