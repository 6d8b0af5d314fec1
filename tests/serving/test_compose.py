"""compose.yaml agrees with the services' real configuration: every DHISPARSE_* variable it sets
is a field of that service's config class (and validates), every port it exposes or checks is
the port that config resolves to, kvtier and decoder share an IPC namespace, and the decoder
reserves a GPU."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from services.decoder.config import DecoderConfig  # noqa: E402
from services.gateway.config import GatewayConfig  # noqa: E402
from services.kvtier.config import KvtierConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"kvtier": KvtierConfig, "decoder": DecoderConfig, "gateway": GatewayConfig}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def interpolated(value: str) -> str:
    """compose fills ``${NAME...}`` from the shell or .env; here each NAME gets a valid stand-in."""
    return re.sub(r"\$\{(\w+)[^}]*\}", lambda m: f"stand-in-{m.group(1).lower()}", value)


def resolved_config(config_class, environment: dict, monkeypatch):
    prefix = config_class.model_config["env_prefix"]
    for name in list(__import__("os").environ):
        if name.startswith(prefix):
            monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, interpolated(str(value)))
    return config_class()


@pytest.mark.parametrize("service", sorted(CONFIGS))
def test_env_vars_are_config_fields(compose, service, monkeypatch):
    config_class = CONFIGS[service]
    prefix = config_class.model_config["env_prefix"]
    environment = compose["services"][service].get("environment", {})
    assert environment, f"{service} sets no environment"
    for name in environment:
        assert name.startswith(prefix), f"{service}: {name} is not a {prefix}* variable"
        field = name[len(prefix):].lower()
        assert field in config_class.model_fields, f"{service}: {name} is not a field of {config_class.__name__}"
    resolved_config(config_class, environment, monkeypatch)  # and the values validate


def test_commented_out_env_vars_are_config_fields_too():
    """compose.yaml's commented-out settings (TLS, mutual TLS, API keys) name real fields as well,
    so that uncommenting one never sets a variable the service ignores (or refuses)."""
    text = (ROOT / "compose.yaml").read_text()
    commented = [m for line in text.splitlines() if line.lstrip().startswith("#")
                 for m in re.finditer(r"DHISPARSE_(KVTIER|DECODER|GATEWAY)_(\w+)", line)]
    assert len(commented) >= 10
    for match in commented:
        config_class = CONFIGS[match.group(1).lower()]
        assert match.group(2).lower() in config_class.model_fields, f"{match.group(0)} is not a field"


@pytest.mark.parametrize("service", sorted(CONFIGS))
def test_ports_match_the_config(compose, service, monkeypatch):
    spec = compose["services"][service]
    port = resolved_config(CONFIGS[service], spec.get("environment", {}), monkeypatch).port
    container_ports = [int(str(p).split(":")[-1].split("/")[0]) for p in spec.get("ports", [])]
    container_ports += [int(p) for p in spec.get("expose", [])]
    assert container_ports and set(container_ports) == {port}
    health = " ".join(spec["healthcheck"]["test"])
    assert str(port) in health, f"{service}'s health check does not probe port {port}"
    assert all(int(p) == port for p in re.findall(r"(?:127\.0\.0\.1|localhost)[:',\s]+(\d+)", health))


def test_services_reach_each_other_by_name(compose, monkeypatch):
    for service in CONFIGS:
        url = resolved_config(CONFIGS[service], compose["services"][service]["environment"], monkeypatch).redis_url
        assert url == "redis://redis:6379/0"
    assert "redis" in compose["services"]
    gateway = compose["services"]["gateway"]
    assert "container_name" not in gateway, "a fixed name would prevent --scale gateway=2"
    assert all("-" in str(p).split(":")[0] for p in gateway["ports"]), "scaled gateways need a host port range"


def test_kvtier_and_decoder_share_ipc_and_decoder_gets_a_gpu(compose):
    services = compose["services"]
    assert services["kvtier"]["ipc"] == "shareable"
    assert services["decoder"]["ipc"] == "service:kvtier"
    devices = services["decoder"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    assert services["decoder"]["depends_on"]["kvtier"]["condition"] == "service_healthy"


def test_dockerfile_builds_the_image_compose_uses(compose):
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    for service in CONFIGS:
        spec = compose["services"][service]
        assert spec["build"]["dockerfile"] == "docker/Dockerfile" and spec["image"] == "dhisparse:latest"
        module = spec["command"][2]
        assert (ROOT / module.replace(".", "/") / "__main__.py").exists(), f"{module} is not runnable"
    assert "dhisparse models pull" in dockerfile
