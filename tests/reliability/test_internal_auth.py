"""The shared token and TLS of the internal gRPC ports (``services/rpc/auth.py``), against kvtier as
a real process (``python -m services.kvtier`` over a real Redis) and a gRPC server built the way
the decoder builds its own. Calls are made raw (no generated stub) so that nothing client-side
adds a token: every method without the token, with another one, or with two, ends with
UNAUTHENTICATED and changes nothing; the right token works; the token never reaches a log.
TLS: certificates are self-signed here with the openssl CLI."""

from __future__ import annotations

import re
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import torch
import yaml
from pydantic import SecretStr

from dhisparse.stack import LocalStack, StackOptions
from services.decoder.config import DecoderConfig
from services.decoder.kv.kvtier_client import KvLayout, KvtierClient, KvtierClientError
from services.gateway.config import GatewayConfig
from services.kvtier.config import KvtierConfig
from services.rpc import decoder_pb2, decoder_pb2_grpc
from services.rpc import kvtier_pb2 as pb
from services.rpc.auth import InternalSecurity
from tests.kvtier.conftest import ROOT, TINY
from tests.reliability.internal_tls import methods_of, raw_call, self_signed, status_of
from tests.serving.test_gateway_app import FakeDecoder

TOKEN = "kvtier-Token-0123456789abcdef"
WRONG = "kvtier-Token-0123456789abcdeX"  # differs in the last character only
LAYOUT = KvLayout(torch.float32, TINY["num_layers"], TINY["num_kv_heads"], TINY["head_dim"], TINY["page_size"])
C = grpc.StatusCode


def bearer(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


def security(token: str | None = TOKEN, ca: Path | None = None) -> InternalSecurity:
    return InternalSecurity(SecretStr(token) if token else None, tls_ca=ca)


@pytest.fixture
def kvtier_with_token(kvtier_process, monkeypatch):
    monkeypatch.setenv("DHISPARSE_KVTIER_INTERNAL_TOKEN", TOKEN)  # the process inherits it
    return kvtier_process(instance="authz")


def stderr_of(proc) -> str:
    proc.log.flush()
    proc.log.seek(0)
    return proc.log.read()


def test_every_kvtier_method_refuses_a_missing_wrong_or_doubled_token(kvtier_with_token):
    proc = kvtier_with_token
    attach = pb.AttachRequest(decoder_id="intruder", model_id="m",
                              layout=pb.PageLayout(dtype="float32", **{k: v for k, v in TINY.items() if k != "dtype"}))
    payloads = {"Attach": attach.SerializeToString(), "Stats": b""}
    with grpc.insecure_channel(proc.address) as channel:
        for path, streaming in methods_of(pb.DESCRIPTOR, "Kvtier"):
            payload = payloads.get(path.rsplit("/", 1)[1], b"")
            for metadata, detail in (((), "no internal token"), (bearer(WRONG), "does not match"),
                                     (bearer(TOKEN.upper()), "does not match"), ((("authorization", TOKEN),), "does not match"),
                                     (bearer(TOKEN) + bearer(WRONG), "more than one")):
                code, details = status_of(lambda p=path, s=streaming, b=payload, m=metadata: raw_call(channel, p, s, b, m))
                assert code == C.UNAUTHENTICATED and detail in details, (path, metadata, code, details)
                assert TOKEN not in details and WRONG not in details
        # nothing above reached the service: no lease was created, no page handed out
        stats = pb.StatsResponse.FromString(raw_call(channel, "/dhisparse.kvtier.v1.Kvtier/Stats", False,
                                                     pb.StatsRequest(check_integrity=True).SerializeToString(),
                                                     bearer(TOKEN)))
        assert stats.num_live_decoders == 0 and stats.num_used_pages == 0 and stats.integrity_ok
    log = stderr_of(proc)
    assert "refused /dhisparse.kvtier.v1.Kvtier/Attach: no internal token" in log  # refusals are logged ...
    assert TOKEN not in log and WRONG not in log and TOKEN.upper() not in log  # ... without any token


def test_the_decoders_kvtier_client_needs_the_same_token(kvtier_with_token):
    proc = kvtier_with_token
    for wrong in (None, WRONG):
        client = KvtierClient(proc.address, "d-wrong", "m", LAYOUT, security=security(wrong))
        with pytest.raises(KvtierClientError) as err:
            client.attach()
        assert err.value.code == C.UNAUTHENTICATED
        client.close()
    with KvtierClient(proc.address, "d0", "m", LAYOUT, security=security()) as client:
        client.attach()
        assert len(client.allocate({"r1": 2})["r1"]) == 2
        assert client.stats()["num_live_decoders"] == 1  # only the decoder with the token got a lease
    assert TOKEN not in stderr_of(proc)


def test_kvtier_over_tls_with_a_self_signed_certificate(kvtier_process, monkeypatch, tmp_path):
    cert, key = self_signed(tmp_path, "kvtier")
    other_ca, _ = self_signed(tmp_path, "someone-else")
    monkeypatch.setenv("DHISPARSE_KVTIER_INTERNAL_TOKEN", TOKEN)
    proc = kvtier_process(instance="tls", internal_tls_cert=cert, internal_tls_key=key)
    with KvtierClient(proc.address, "d0", "m", LAYOUT, security=security(ca=cert)) as client:
        client.attach()
        assert len(client.allocate({"r1": 1})["r1"]) == 1
    # plaintext (even with the token), a CA that did not sign kvtier's certificate, TLS without the token
    for sec, code in ((security(), C.UNAVAILABLE), (security(ca=other_ca), C.UNAVAILABLE),
                      (security(token=None, ca=cert), C.UNAUTHENTICATED)):
        client = KvtierClient(proc.address, "d-bad", "m", LAYOUT, timeout_s=5, security=sec)
        with pytest.raises(KvtierClientError) as err:
            client.attach()
        assert err.value.code == code, (sec, err.value)
        client.close()


def test_a_decoder_style_server_over_tls_and_the_gateways_async_client(tmp_path):
    """The decoder's server construction (``InternalSecurity.of(config)`` on a ``DecoderConfig``)
    and the gateway's aio channel: a streamed Generate works over TLS with the token only."""
    import asyncio

    cert, key = self_signed(tmp_path, "decoder")
    config = DecoderConfig(internal_token=TOKEN, internal_tls_cert=cert, internal_tls_key=key)
    server_security = InternalSecurity.of(config)
    server = server_security.make_server(futures.ThreadPoolExecutor(4))
    decoder_pb2_grpc.add_DecoderServicer_to_server(FakeDecoder(), server)
    port = server_security.add_port(server, "127.0.0.1:0")
    server.start()
    gateway = InternalSecurity.of(GatewayConfig(internal_token=TOKEN, internal_tls_ca=cert))

    async def generate(sec: InternalSecurity):
        async with sec.aio_channel(f"127.0.0.1:{port}") as channel:
            call = decoder_pb2_grpc.DecoderStub(channel).Generate(
                decoder_pb2.GenerateRequest(request_id="r", sampling=decoder_pb2.SamplingParams(max_tokens=4)),
                timeout=10)
            return "".join([chunk.text_delta async for chunk in call])

    try:
        assert asyncio.run(generate(gateway)) == "Hello there, friend"
        for sec, code in ((security(ca=cert, token=WRONG), C.UNAUTHENTICATED), (security(), C.UNAVAILABLE)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                asyncio.run(generate(sec))
            assert err.value.code() == code
    finally:
        server.stop(None)


def test_tokens_are_validated_masked_and_never_echoed(kvtier_process, monkeypatch):
    for config_class in (KvtierConfig, DecoderConfig, GatewayConfig):
        config = config_class(internal_token=TOKEN)
        assert TOKEN not in repr(config) and TOKEN not in str(config.model_dump()) \
            and TOKEN not in config.model_dump_json()
        assert InternalSecurity.of(config).metadata == bearer(TOKEN)
        for bad in ("x7Q-short-secret", "spaces in the secret 0123456", "non-ascii-s\u00e9cret-0123456789"):
            bad = bad[:15] if "short" in bad else bad
            with pytest.raises(ValueError, match="16-512 characters") as err:
                InternalSecurity.of(config_class(internal_token=bad))
            assert bad not in str(err.value)
    assert TOKEN not in repr(security())
    with pytest.raises(ValueError, match="both internal_tls_cert and internal_tls_key"):
        InternalSecurity(tls_cert=Path(__file__))
    with pytest.raises(ValueError, match="does not exist"):
        InternalSecurity(tls_ca=Path("/nonexistent/ca.pem"))
    # a kvtier process with a malformed token refuses to start, and does not print the token
    monkeypatch.setenv("DHISPARSE_KVTIER_INTERNAL_TOKEN", "short-sEcReT")
    with pytest.raises(RuntimeError, match="kvtier did not start") as err:
        kvtier_process(instance="badtoken")
    assert "16-512 characters" in str(err.value) and "short-sEcReT" not in str(err.value)


def test_dhisparse_up_makes_a_fresh_token_per_stack_and_compose_shares_one(tmp_path):
    one, two = LocalStack(StackOptions(workdir=tmp_path)), LocalStack(StackOptions(workdir=tmp_path))
    assert one.internal_token != two.internal_token and len(one.internal_token) >= 32
    env = one._internal_env()
    assert {env[f"DHISPARSE_{s}_INTERNAL_TOKEN"] for s in ("KVTIER", "DECODER", "GATEWAY")} == {one.internal_token}
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    values = {services[s.lower()]["environment"][f"DHISPARSE_{s}_INTERNAL_TOKEN"] for s in ("KVTIER", "DECODER", "GATEWAY")}
    (value,) = values  # one token for all three
    assert re.fullmatch(r"\$\{DHISPARSE_INTERNAL_TOKEN:\?.+\}", value), value  # required: compose refuses to start without it
