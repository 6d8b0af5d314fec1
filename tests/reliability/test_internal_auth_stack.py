"""``dhisparse up``'s stack (Redis, kvtier, decoder, gateway as processes) with the internal token,
then with the token and TLS: requests through the gateway work (gateway -> decoder -> kvtier all
carry the token), while a caller on the same machine without the token, or with another one, is
refused by both internal ports; the token is in no service's log."""

from __future__ import annotations

import grpc
import httpx
import pytest

from dhisparse.stack import LocalStack, StackOptions, free_port
from services.decoder.service.server import probe
from services.rpc import decoder_pb2, kvtier_pb2
from tests.reliability.internal_tls import raw_call, self_signed, status_of

MODEL = "SmolLM2-135M-Instruct"
C = grpc.StatusCode
HEALTH = "/dhisparse.decoder.v1.Decoder/Health"
KV_STATS = "/dhisparse.kvtier.v1.Kvtier/Stats"
GENERATE = "/dhisparse.decoder.v1.Decoder/Generate"


def start_stack(tmp_path, **options) -> LocalStack:
    opts = StackOptions(gateway_port=free_port(), decoder_port=free_port(), kvtier_port=free_port(),
                        kvtier=True, kvtier_pool_gib=0.05, workdir=tmp_path / "stack",
                        decoder_args=["--kv-cache-tokens", "8192", "--threads", "1"], **options)
    opts.workdir.mkdir()
    return LocalStack(opts).start(log=lambda _msg: None)


def complete(stack: LocalStack) -> dict:
    reply = httpx.post(f"{stack.url}/v1/completions", timeout=120,
                       json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()


def kvtier_address(stack: LocalStack) -> str:
    return f"{stack.options.host}:{stack.options.kvtier_port}"


def bearer(token: str) -> tuple:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def stacks(tmp_path):
    started: list[LocalStack] = []

    def start(**options) -> LocalStack:
        started.append(start_stack(tmp_path, **options))
        return started[-1]

    yield start
    for stack in started:
        stack.stop()


def test_the_stack_runs_on_its_token_and_refuses_callers_without_it(stacks):
    stack = stacks()
    token = stack.internal_token
    assert complete(stack)["usage"]["completion_tokens"] == 4
    generate = decoder_pb2.GenerateRequest(request_id="intruder", text="hello",
                                           sampling=decoder_pb2.SamplingParams(max_tokens=2)).SerializeToString()
    with grpc.insecure_channel(stack.decoder_address) as decoder, grpc.insecure_channel(kvtier_address(stack)) as kv:
        for metadata in ((), bearer(token[:-1] + ("A" if token[-1] != "A" else "B"))):
            for channel, path, streaming, payload in ((decoder, HEALTH, False, b""), (decoder, GENERATE, True, generate),
                                                      (kv, KV_STATS, False, b"")):
                code, detail = status_of(lambda c=channel, p=path, s=streaming, b=payload, m=metadata:
                                         raw_call(c, p, s, b, m))
                assert code == C.UNAUTHENTICATED, (path, metadata, code, detail)
        # the right token: answers; kvtier holds exactly one lease, the stack's decoder's
        health = decoder_pb2.HealthResponse.FromString(raw_call(decoder, HEALTH, False, b"", bearer(token)))
        assert health.status == decoder_pb2.HealthResponse.SERVING
        stats = kvtier_pb2.StatsResponse.FromString(raw_call(kv, KV_STATS, False, b"", bearer(token)))
        assert stats.num_live_decoders == 1
    assert not probe(stack.decoder_address) and probe(stack.decoder_address, security=stack.security)
    assert complete(stack)["usage"]["completion_tokens"] == 4  # refusals changed nothing
    for name in ("kvtier", "decoder", "gateway"):
        log = (stack.workdir / f"{name}.log").read_text(errors="replace")
        assert token not in log, f"{name} logged the internal token"
    assert "refused /dhisparse.decoder.v1.Decoder/Generate: no internal token" in \
        (stack.workdir / "decoder.log").read_text()


def test_the_stack_over_tls(stacks, tmp_path):
    cert, key = self_signed(tmp_path, "internal")
    stack = stacks(internal_tls_cert=cert, internal_tls_key=key, internal_tls_ca=cert)
    assert complete(stack)["usage"]["completion_tokens"] == 4  # gateway -TLS-> decoder -TLS-> kvtier
    token = stack.internal_token
    for address, path in ((stack.decoder_address, HEALTH), (kvtier_address(stack), KV_STATS)):
        with grpc.insecure_channel(address) as plain:  # plaintext, even with the token: no connection
            code, _ = status_of(lambda c=plain, p=path: raw_call(c, p, False, b"", bearer(token)))
            assert code == C.UNAVAILABLE
    assert probe(stack.decoder_address, security=stack.security)
    with stack.security.channel(kvtier_address(stack)) as kv:
        stats = kvtier_pb2.StatsResponse.FromString(raw_call(kv, KV_STATS, False, b""))
        assert stats.num_live_decoders == 1  # the decoder attached over TLS
