import pytest
from pydantic import ValidationError

from dhisparse.cli import build_parser
from services.kvtier.cli_args import config_from_namespace
from services.kvtier.config import KvtierConfig


def test_defaults_env_and_pool_size(monkeypatch):
    config = KvtierConfig()
    assert config.host_page_bytes == 2 * 30 * 16 * 3 * 64 * 4  # the default model, fp32
    assert config.num_host_pages == (2 * 2**30) // config.host_page_bytes
    assert config.segment_name == "dhisparse-kvtier-default"
    monkeypatch.setenv("DHISPARSE_KVTIER_HOST_POOL_GIB", "0.5")
    monkeypatch.setenv("DHISPARSE_KVTIER_INSTANCE", "b")
    config = KvtierConfig()
    assert config.num_host_pages == (2**29) // config.host_page_bytes and config.segment_name == "dhisparse-kvtier-b"
    assert KvtierConfig(host_pool_pages=7, host_pool_gib=1.0).num_host_pages == 7


@pytest.mark.parametrize("bad", [{"instance": "a/b"}, {"host_pool_gib": 1e-9}, {"dtype": "int8"}, {"port": 70000}])
def test_bad_config_is_rejected(bad):
    with pytest.raises(ValidationError):
        KvtierConfig(**bad)


def test_cli_flags_map_onto_config_fields():
    args = build_parser().parse_args(
        ["kvtier", "--host-pool-gib", "0.25", "--port", "5999", "--redis-url", "unix:///x.sock", "--instance", "i1"]
    )
    config = config_from_namespace(args)
    assert (config.host_pool_gib, config.port, config.redis_url, config.instance) == (0.25, 5999, "unix:///x.sock", "i1")
    assert config.lease_ttl_s == KvtierConfig().lease_ttl_s  # flags left out keep the default
