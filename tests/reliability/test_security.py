"""Security: API keys compared in constant time and never logged (in-process and by a real gateway
process at debug level), internal gRPC services bound to loopback by default (containers opt in to
0.0.0.0), and kvtier's shared-memory segment owner-only whatever the umask."""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from dhisparse.stack import StackOptions, free_port
from services.decoder.config import DecoderConfig
from services.gateway import auth
from services.gateway.config import GatewayConfig
from services.kvtier.config import KvtierConfig
from tests.reliability.conftest import MODEL

ROOT = Path(__file__).resolve().parents[2]
GOOD = "sk-good-7f3a9c1e5b2d4860"
OTHER = "sk-other-0c4e8a2f6d1b9357"
BAD = "sk-bad-guess-5e1f3a7c9b2d"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def requests_with_keys(client) -> None:
    """No key, a wrong key, a good key, a key-like body, and a bad request with a good key."""
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 401
    assert client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {BAD}"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {GOOD}x"}).status_code == 401
    assert client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {GOOD}"}).status_code == 200
    assert client.post("/v1/completions", json={"model": MODEL, "prompt": [-1]},
                       headers={"Authorization": f"Bearer {GOOD}"}).status_code == 400


def test_keys_are_compared_with_compare_digest_against_every_key(gateway_app, monkeypatch):
    calls = []
    real = auth.hmac.compare_digest

    def spy(a, b):
        calls.append((type(a), type(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    with TestClient(gateway_app(api_keys=[GOOD, OTHER])) as client:
        for token, status in [(BAD, 401), (GOOD, 200), (OTHER, 200), (GOOD[:-1], 401), ("", 401)]:
            calls.clear()
            response = client.get("/v1/models", headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == status
            assert calls == [(bytes, bytes)] * 2  # every key, even after a match: no early exit


@pytest.mark.parametrize("header", ["Bearer " + "é" * 20, "Bearer \x00", "Basic " + GOOD, GOOD, "Bearer",
                                    "bearer  " + GOOD + "  "])
def test_odd_authorization_headers_are_401_not_500(gateway_app, header):
    with TestClient(gateway_app(api_keys=[GOOD]), raise_server_exceptions=False) as client:
        response = client.get("/v1/models", headers={"Authorization": header.encode("latin-1")})
    expected = 200 if header.lower().startswith("bearer ") and header.split()[-1] == GOOD else 401
    assert response.status_code == expected
    if expected == 401:
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert GOOD not in response.text


def test_keys_are_masked_in_the_config():
    config = GatewayConfig(api_keys=[GOOD])
    for text in (repr(config), str(config), config.model_dump_json(), str(config.model_dump())):
        assert GOOD not in text


def test_keys_never_reach_a_log_record(gateway_app, caplog):
    caplog.set_level(logging.DEBUG)
    with TestClient(gateway_app(api_keys=[GOOD])) as client:
        requests_with_keys(client)
    assert caplog.records  # the debug level did record something (httpx, grpc, asyncio...)
    text = "\n".join(f"{r.getMessage()} {r.args!r} {r.__dict__!r}" for r in caplog.records)
    assert GOOD not in text and BAD not in text


def test_a_gateway_process_at_debug_level_never_logs_a_key(fake_decoder):
    address, _ = fake_decoder
    port = free_port()
    env = {**os.environ, "DHISPARSE_GATEWAY_API_KEYS": json.dumps([GOOD])}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "services.gateway", "--port", str(port), "--host", "127.0.0.1",
                                 "--decoder", address, "--log-level", "debug"],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if client.get("/health").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline and proc.poll() is None, "gateway did not start"
                    time.sleep(0.1)
                requests_with_keys(client)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        log.seek(0)
        text = log.read().decode("utf-8", "replace")
    assert "POST /v1/chat/completions" in text and "401" in text  # uvicorn's access log ran
    assert GOOD not in text and BAD not in text


def test_internal_grpc_services_bind_to_loopback_by_default(monkeypatch):
    for name in ("DHISPARSE_DECODER_HOST", "DHISPARSE_KVTIER_HOST"):
        monkeypatch.delenv(name, raising=False)
    assert DecoderConfig().host == "127.0.0.1"
    assert KvtierConfig().host == "127.0.0.1"
    assert StackOptions().host == "127.0.0.1"  # `dhisparse up` binds every service to loopback by default
    # containers, whose ports are reached from other containers, opt in explicitly
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert compose["kvtier"]["environment"]["DHISPARSE_KVTIER_HOST"] == "0.0.0.0"
    assert compose["decoder"]["environment"]["DHISPARSE_DECODER_HOST"] == "0.0.0.0"
    cmd = re.search(r"^CMD (.*)$", (ROOT / "docker" / "Dockerfile").read_text(), re.MULTILINE).group(1)
    assert json.loads(cmd)[-2:] == ["--host", "0.0.0.0"]


# /proc/net/tcp{,6} spellings of 127.0.0.1, ::ffff:127.0.0.1 and ::1
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}


def listening_addresses(port: int) -> list[str]:
    """Local addresses of the TCP sockets listening on ``port`` (from /proc/net/tcp{,6})."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A = LISTEN
                found.append(address)
    return found


def test_kvtier_listens_on_loopback_only_and_its_segment_is_owner_only(kvtier_process):
    previous = os.umask(0)  # the most permissive umask: the modes below must not depend on it
    try:
        kv = kvtier_process(instance="sec")
    finally:
        os.umask(previous)
    port = int(kv.address.rsplit(":", 1)[1])
    assert kv.address.startswith("127.0.0.1:")
    found = listening_addresses(port)
    assert found and set(found) <= LOOPBACK, found  # no 0.0.0.0, no [::]
    segment = os.stat(f"/dev/shm/{kv.segment_name}")
    assert stat.S_IMODE(segment.st_mode) == 0o600 and segment.st_uid == os.getuid()
    lock = Path(tempfile.gettempdir()) / f"dhisparse-{os.getuid()}" / f"{kv.segment_name}.lock"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600
    assert stat.S_IMODE(lock.parent.stat().st_mode) & 0o077 == 0
