"""Mutual TLS on the internal gRPC ports (``services/rpc/auth.py``): kvtier (a real process over a
real Redis) and a decoder-style server require a client certificate signed by their client CA
(``internal_tls_client_ca``); the decoder's kvtier client, the gateway's decoder client and the
probes present one (``internal_tls_client_{cert,key}``). With ``internal_tls_bind_decoder_id``,
kvtier also checks that every decoder id a call carries is named by the caller's certificate.
Certificates are made with the openssl CLI (``tests/reliability/internal_tls.py``)."""

from __future__ import annotations

import asyncio
import uuid
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import pytest
import torch
from pydantic import SecretStr

from dhisparse.stack import LocalStack, StackOptions, free_port
from services.decoder.config import DecoderConfig
from services.decoder.kv.kvtier_client import KvLayout, KvtierClient, KvtierClientError
from services.decoder.service.server import probe
from services.gateway.config import GatewayConfig
from services.kvtier.cli_args import config_from_args
from services.kvtier.config import KvtierConfig
from services.rpc import decoder_pb2, decoder_pb2_grpc
from services.rpc import kvtier_pb2 as pb
from services.rpc.auth import InternalSecurity
from tests.kvtier.conftest import TINY
from tests.reliability.internal_tls import (
    issue,
    make_ca,
    methods_of,
    raw_call,
    self_signed,
    status_of,
)
from tests.serving.test_gateway_app import FakeDecoder

TOKEN = "mtls-Token-0123456789abcdefgh"
LAYOUT = KvLayout(torch.float32, TINY["num_layers"], TINY["num_kv_heads"], TINY["head_dim"], TINY["page_size"])
C = grpc.StatusCode
KV_STATS = "/dhisparse.kvtier.v1.Kvtier/Stats"


class Pki:
    """One server certificate (self-signed, for 127.0.0.1), a client CA with its client
    certificates, and a second CA nobody trusts that issues a certificate of the same name."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.server = self_signed(directory, "server")
        self.client_ca = make_ca(directory, "client-ca")
        self.rogue_ca = make_ca(directory, "rogue-ca")
        (directory / "rogue").mkdir()
        self.rogue = issue(directory / "rogue", self.rogue_ca, "decoder-a", dns=("decoder-a",))

    def client(self, name: str, dns: tuple[str, ...] | None = None) -> tuple[Path, Path]:
        return issue(self.dir, self.client_ca, name, dns=(name,) if dns is None else dns)

    def security(self, client: tuple[Path, Path] | None, token: str | None = TOKEN) -> InternalSecurity:
        """A client's: verifies the server against its certificate, presents ``client``."""
        cert, key = client or (None, None)
        return InternalSecurity(SecretStr(token) if token else None, tls_ca=self.server[0],
                                tls_client_cert=cert, tls_client_key=key)


@pytest.fixture
def pki(tmp_path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def mtls_kvtier(kvtier_process, monkeypatch, pki):
    monkeypatch.setenv("DHISPARSE_KVTIER_INTERNAL_TOKEN", TOKEN)

    def start(instance: str, **flags):
        return kvtier_process(instance=instance, internal_tls_cert=pki.server[0], internal_tls_key=pki.server[1],
                              internal_tls_client_ca=pki.client_ca[0], **flags)

    return start


def stderr_of(proc) -> str:
    proc.log.flush()
    proc.log.seek(0)
    return proc.log.read()


def attach_error(address: str, security: InternalSecurity, decoder_id: str = "decoder-a", model_id: str = "m",
                 layout: KvLayout = LAYOUT) -> KvtierClientError | None:
    client = KvtierClient(address, decoder_id, model_id, layout, timeout_s=5, security=security)
    try:
        client.attach()
    except KvtierClientError as exc:
        return exc
    finally:
        client.close()
    return None


def kv_stats(address: str, security: InternalSecurity) -> pb.StatsResponse:
    with security.channel(address) as channel:
        return pb.StatsResponse.FromString(raw_call(channel, KV_STATS, False,
                                                    pb.StatsRequest(check_integrity=True).SerializeToString()))


def test_kvtier_requires_a_client_certificate_from_its_client_ca(mtls_kvtier, pki):
    proc = mtls_kvtier("mtls")
    trusted = pki.client("decoder-a")
    with KvtierClient(proc.address, "decoder-a", "m", LAYOUT, security=pki.security(trusted)) as client:
        client.attach()
        assert len(client.allocate({"r1": 2})["r1"]) == 2
    # no client certificate; one from a CA kvtier does not trust (same name); a self-signed one
    self_made = self_signed(pki.dir, "decoder-a-self")
    for client_cert in (None, pki.rogue, self_made):
        err = attach_error(proc.address, pki.security(client_cert))
        assert err is not None and err.code == C.UNAVAILABLE, (client_cert, err)
    # the certificate does not replace the token: a trusted certificate without it is refused
    err = attach_error(proc.address, pki.security(trusted, token=None))
    assert err is not None and err.code == C.UNAUTHENTICATED
    stats = kv_stats(proc.address, pki.security(trusted))  # only the trusted decoder holds a lease and pages
    assert (stats.num_live_decoders, stats.num_used_pages, stats.integrity_ok) == (1, 2, True)
    log = stderr_of(proc)
    assert TOKEN not in log and pki.client_ca[1].read_text() not in log and trusted[1].read_text() not in log


def bound_methods() -> list[tuple[str, bool, type]]:
    """``[(path, server_streaming, request class)]`` of every kvtier method whose request carries a decoder id."""
    service = pb.DESCRIPTOR.services_by_name["Kvtier"]
    found = []
    for path, streaming in methods_of(pb.DESCRIPTOR, "Kvtier"):
        request = service.methods_by_name[path.rsplit("/", 1)[1]].input_type
        if "decoder_id" in request.fields_by_name:
            found.append((path, streaming, getattr(pb, request.name)))
    return found


def test_kvtier_binds_decoder_ids_to_client_certificates(mtls_kvtier, pki, monkeypatch):
    monkeypatch.setenv("DHISPARSE_KVTIER_INTERNAL_TLS_BIND_DECODER_ID", "true")
    proc = mtls_kvtier("bind")
    cert_a, cert_b = pki.client("decoder-a"), pki.client("decoder-b")
    cert_c = pki.client("decoder-c", dns=())  # a CN and no subject alternative name
    cert_d = pki.client("node-7", dns=("decoder-d", "decoder-d2"))  # named by a DNS SAN only
    a = KvtierClient(proc.address, "decoder-a", "m", LAYOUT, security=pki.security(cert_a))
    a.attach()
    pages = a.allocate({"ra": 2})["ra"]
    a.commit({"ra": 2})
    a.mark_resumable(["ra"])
    before = kv_stats(proc.address, pki.security(cert_a))
    # A's certificate used for decoder id B, and B's for A: every method with a decoder id refuses
    methods = bound_methods()
    assert len(methods) == 11  # all but Stats
    for cert, claimed in ((cert_a, "decoder-b"), (cert_b, "decoder-a")):
        with pki.security(cert).channel(proc.address) as channel:
            for path, streaming, request in methods:
                fields = {"decoder_id": claimed}
                if "request_ids" in request.DESCRIPTOR.fields_by_name:
                    fields["request_ids"] = ["ra"]
                if "claim" in request.DESCRIPTOR.fields_by_name:
                    fields["claim"] = True
                payload = request(**fields).SerializeToString()
                code, detail = status_of(lambda p=path, s=streaming, b=payload: raw_call(channel, p, s, b))
                assert code == C.PERMISSION_DENIED, (path, claimed, code, detail)
                assert f"decoder id '{claimed}' is not named by the client certificate" in detail
    with pytest.raises(KvtierClientError) as err:
        KvtierClient(proc.address, "decoder-b", "m", LAYOUT, security=pki.security(cert_a)).attach()
    assert err.value.code == C.PERMISSION_DENIED
    # ... and nothing changed: one lease (A's), A's request and pages as they were, integrity holds
    after = kv_stats(proc.address, pki.security(cert_b))
    assert (after.num_live_decoders, after.num_used_pages) == (before.num_live_decoders, before.num_used_pages) == (1, 2)
    assert after.integrity_ok
    mine = a.lookup(["ra"])["ra"]
    assert list(mine.host_page_ids) == pages and mine.owner_decoder_id == "decoder-a"
    # each certificate attaches as the decoder it names: by CN, by DNS SAN (either), not by a non-SAN CN
    for cert, decoder_id in ((cert_b, "decoder-b"), (cert_c, "decoder-c"), (cert_d, "decoder-d"),
                             (cert_d, "decoder-d2")):
        with KvtierClient(proc.address, decoder_id, "m", LAYOUT, security=pki.security(cert)) as client:
            client.attach()
            assert len(client.allocate({f"r-{decoder_id}": 1})[f"r-{decoder_id}"]) == 1
    assert attach_error(proc.address, pki.security(cert_d), "node-7") is None  # the CN names it as well
    a.close()
    assert "refused /dhisparse.kvtier.v1.Kvtier/Attach: decoder id 'decoder-b'" in stderr_of(proc)


class ServingFakeDecoder(FakeDecoder):
    def Health(self, request, context):
        return decoder_pb2.HealthResponse(status=decoder_pb2.HealthResponse.SERVING)


def decoder_server(pki: Pki, **fields):
    """A gRPC server built the way the decoder builds its own, from a ``DecoderConfig`` with mutual TLS."""
    config = DecoderConfig(internal_token=TOKEN, internal_tls_cert=pki.server[0], internal_tls_key=pki.server[1],
                           internal_tls_client_ca=pki.client_ca[0], **fields)
    security = InternalSecurity.of(config)
    server = security.make_server(futures.ThreadPoolExecutor(4))
    decoder_pb2_grpc.add_DecoderServicer_to_server(ServingFakeDecoder(), server)
    port = security.add_port(server, "127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_decoder_style_server_requires_the_gateways_client_certificate(pki, monkeypatch):
    gateway_cert, probe_cert = pki.client("gateway"), pki.client("decoder-probe")
    server, address = decoder_server(pki)

    async def generate(security: InternalSecurity) -> str:
        async with security.aio_channel(address) as channel:
            call = decoder_pb2_grpc.DecoderStub(channel).Generate(
                decoder_pb2.GenerateRequest(request_id="r", sampling=decoder_pb2.SamplingParams(max_tokens=4)),
                timeout=10)
            return "".join([chunk.text_delta async for chunk in call])

    try:
        gateway = InternalSecurity.of(GatewayConfig(internal_token=TOKEN, internal_tls_ca=pki.server[0],
                                                    internal_tls_client_cert=gateway_cert[0],
                                                    internal_tls_client_key=gateway_cert[1]))
        assert asyncio.run(generate(gateway)) == "Hello there, friend"
        for security in (pki.security(None), pki.security(pki.rogue)):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                asyncio.run(generate(security))
            assert err.value.code() == C.UNAVAILABLE
        # the decoder's own --probe: DHISPARSE_DECODER_* with a client certificate answers, without it not
        for name, value in (("INTERNAL_TOKEN", TOKEN), ("INTERNAL_TLS_CA", pki.server[0]),
                            ("INTERNAL_TLS_CLIENT_CERT", probe_cert[0]), ("INTERNAL_TLS_CLIENT_KEY", probe_cert[1])):
            monkeypatch.setenv(f"DHISPARSE_DECODER_{name}", str(value))
        assert probe(address, security=InternalSecurity.of(DecoderConfig()))
        assert not probe(address, security=pki.security(None))
    finally:
        server.stop(None)


def test_mutual_tls_settings_are_checked_at_start_without_echoing_secrets(pki, kvtier_process, monkeypatch):
    cert, key = pki.client("decoder-a")
    server_cert, server_key, ca = pki.server[0], pki.server[1], pki.server[0]
    key_text = key.read_text()
    cases = [
        ({"tls_ca": ca, "tls_client_cert": cert}, "both internal_tls_client_cert and internal_tls_client_key"),
        ({"tls_ca": ca, "tls_client_key": key}, "both internal_tls_client_cert and internal_tls_client_key"),
        ({"tls_client_ca": pki.client_ca[0]}, "internal_tls_client_ca needs internal_tls_cert"),
        ({"tls_client_cert": cert, "tls_client_key": key}, "internal_tls_client_cert needs internal_tls_ca"),
        ({"tls_cert": server_cert, "tls_key": server_key, "bind_decoder_id": True},
         "internal_tls_bind_decoder_id needs internal_tls_client_ca"),
        ({"tls_ca": ca, "tls_client_cert": pki.dir / "missing.pem", "tls_client_key": key},
         "missing.pem does not exist (internal_tls_client_cert)"),
        ({"tls_cert": server_cert, "tls_key": server_key, "tls_client_ca": pki.dir},
         "is not a regular file (internal_tls_client_ca)"),
        ({"tls_ca": ca, "tls_client_cert": key, "tls_client_key": key},  # the key given as the certificate
         "is not a PEM certificate (internal_tls_client_cert)"),
        ({"tls_ca": ca, "tls_client_cert": cert, "tls_client_key": cert}, "is not a PEM private key (internal_tls_client_key)"),
    ]
    for fields, message in cases:
        with pytest.raises(ValueError) as err:
            InternalSecurity(**fields)
        assert message in str(err.value), (fields, str(err.value))
        assert key_text not in str(err.value) and "PRIVATE KEY" not in str(err.value)
    # unreadable (tests run as root here, who reads any file: the error is simulated)
    real_read = Path.read_bytes

    def read_bytes(path):
        if path == key:
            raise PermissionError(13, "Permission denied")
        return real_read(path)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "read_bytes", read_bytes)
        with pytest.raises(ValueError, match=r"cannot be read \(internal_tls_client_key\): Permission denied"):
            InternalSecurity(tls_ca=ca, tls_client_cert=cert, tls_client_key=key)
    # the services read the new settings from their DHISPARSE_* variables
    monkeypatch.setenv("DHISPARSE_GATEWAY_INTERNAL_TLS_CLIENT_CERT", str(cert))
    monkeypatch.setenv("DHISPARSE_GATEWAY_INTERNAL_TLS_CLIENT_KEY", str(key))
    monkeypatch.setenv("DHISPARSE_KVTIER_INTERNAL_TLS_CLIENT_CA", str(pki.client_ca[0]))
    monkeypatch.setenv("DHISPARSE_KVTIER_INTERNAL_TLS_BIND_DECODER_ID", "true")
    gateway, kvtier = GatewayConfig(), KvtierConfig()
    assert (gateway.internal_tls_client_cert, gateway.internal_tls_client_key) == (cert, key)
    assert kvtier.internal_tls_client_ca == pki.client_ca[0] and kvtier.internal_tls_bind_decoder_id
    with pytest.raises(ValueError, match="internal_tls_client_cert needs internal_tls_ca"):
        InternalSecurity.of(gateway)
    flags = config_from_args(["--internal-tls-client-ca", "/ca.pem", "--internal-tls-bind-decoder-id"])
    assert (flags.internal_tls_client_ca, flags.internal_tls_bind_decoder_id) == (Path("/ca.pem"), True)
    # kvtier with a client CA but no certificate of its own does not start, and says why
    with pytest.raises(RuntimeError, match="kvtier did not start") as err:
        kvtier_process(instance="badmtls")
    assert "internal_tls_client_ca needs internal_tls_cert" in str(err.value)


def test_dhisparse_up_hands_the_mutual_tls_files_to_the_right_services(tmp_path):
    files = {name: tmp_path / f"{name}.pem" for name in ("cert", "key", "ca", "client_ca", "client_cert", "client_key")}
    stack = LocalStack(StackOptions(workdir=tmp_path, **{f"internal_tls_{n}": p for n, p in files.items()}))
    env = stack._internal_env()
    expected = {"KVTIER": {"cert", "key", "client_ca"}, "DECODER": set(files), "GATEWAY": {"ca", "client_cert", "client_key"}}
    for service, names in expected.items():
        prefix = f"DHISPARSE_{service}_INTERNAL_TLS_"
        assert {k[len(prefix):].lower(): v for k, v in env.items() if k.startswith(prefix)} == \
            {n: str(files[n].resolve()) for n in names}, service


# ---- the whole stack (dhisparse up) with mutual TLS on both internal ports -----------------------
MODEL = "SmolLM2-135M-Instruct"


def test_the_stack_over_mutual_tls_with_decoder_ids_bound(pki, tmp_path):
    """gateway -mTLS-> decoder -mTLS-> kvtier, with kvtier binding decoder ids: completions work;
    callers without a client certificate, or with one from another CA, reach neither port."""
    instance = f"mtls{uuid.uuid4().hex[:8]}"
    client = pki.client(f"decoder-{instance}")  # the stack's decoder id; the gateway shares the certificate
    opts = StackOptions(gateway_port=free_port(), decoder_port=free_port(), kvtier_port=free_port(), kvtier=True,
                        kvtier_pool_gib=0.05, workdir=tmp_path / "stack", instance=instance,
                        decoder_args=["--kv-cache-tokens", "8192", "--threads", "1"],
                        internal_tls_cert=pki.server[0], internal_tls_key=pki.server[1], internal_tls_ca=pki.server[0],
                        internal_tls_client_ca=pki.client_ca[0], internal_tls_client_cert=client[0],
                        internal_tls_client_key=client[1],
                        env={"DHISPARSE_KVTIER_INTERNAL_TLS_BIND_DECODER_ID": "true"})
    opts.workdir.mkdir()
    stack = LocalStack(opts).start(log=lambda _msg: None)
    try:
        reply = httpx.post(f"{stack.url}/v1/completions", timeout=120,
                           json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4, reply.text
        kvtier = f"{opts.host}:{opts.kvtier_port}"
        token = stack.internal_token
        for address, path in ((stack.decoder_address, "/dhisparse.decoder.v1.Decoder/Health"), (kvtier, KV_STATS)):
            for client_cert in (None, pki.rogue):  # TLS and the token, but no trusted client certificate
                with pki.security(client_cert, token=token).channel(address) as channel:
                    code, _ = status_of(lambda c=channel, p=path: raw_call(c, p, False, b""))
                    assert code == C.UNAVAILABLE, (address, client_cert, code)
        assert probe(stack.decoder_address, security=stack.security)
        assert not probe(stack.decoder_address, security=pki.security(None, token=token))
        stats = kv_stats(kvtier, stack.security)
        assert stats.num_live_decoders == 1  # the decoder attached with its certificate, under the id it names
        # another trusted certificate cannot take the stack decoder's lease over (the attach would be
        # valid otherwise: the decoder's own model and page layout, SmolLM2-135M fp32)
        other = pki.security(pki.client("decoder-other"), token=token)
        err = attach_error(kvtier, other, f"decoder-{instance}", MODEL, KvLayout(torch.float32, 30, 3, 64, 16))
        assert err is not None and err.code == C.PERMISSION_DENIED
        assert kv_stats(kvtier, stack.security).num_live_decoders == 1
        for name in ("kvtier", "decoder", "gateway"):
            log = (stack.workdir / f"{name}.log").read_text(errors="replace")
            assert token not in log and client[1].read_text() not in log, name
    finally:
        stack.stop()
