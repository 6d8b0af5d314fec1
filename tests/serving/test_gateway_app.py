"""The gateway app against fake in-process decoders (no model): wire format, routing errors
(503 / 429 with Retry-After / retry on another decoder), auth, body limit, metrics."""

from __future__ import annotations

import json
from concurrent import futures

import grpc
import pytest
from fastapi.testclient import TestClient

from dhisparse.stack import free_port
from services.gateway.app import create_app
from services.gateway.config import GatewayConfig
from services.rpc import decoder_pb2 as pb
from services.rpc import decoder_pb2_grpc as pb_grpc

MODEL = "SmolLM2-135M-Instruct"
WORDS = ["Hello", " there", ",", " friend"]


class FakeDecoder(pb_grpc.DecoderServicer):
    """Streams WORDS one token each; or refuses every request with ``refuse`` (a gRPC status)."""

    def __init__(self, refuse=None):
        self.refuse = refuse
        self.requests = []

    def Generate(self, request, context):
        self.requests.append(request)
        if self.refuse is not None:
            context.abort(self.refuse, "refused")
        n = min(request.sampling.max_tokens, len(WORDS))
        for i in range(n):
            reason = ("length" if n < len(WORDS) else "stop") if i == n - 1 else ""
            yield pb.GenerateChunk(request_id=request.request_id, token_ids=[100 + i], text_delta=WORDS[i],
                                   finish_reason=reason, usage=pb.Usage(prompt_tokens=5, completion_tokens=i + 1))


@pytest.fixture
def decoders():
    servers, fakes = [], []

    def start(refuse=None):
        fake = FakeDecoder(refuse)
        server = grpc.server(futures.ThreadPoolExecutor(4))
        pb_grpc.add_DecoderServicer_to_server(fake, server)
        port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        server.start()
        servers.append(server)
        fakes.append(fake)
        return f"127.0.0.1:{port}", fake

    yield start
    for server in servers:
        server.stop(None)


def gateway(addresses, **config):
    return TestClient(create_app(GatewayConfig(decoder_addresses=addresses, **config)))


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def sse_events(text: str) -> list:
    assert text.endswith("data: [DONE]\n\n")
    frames = text.split("\n\n")[:-1]
    assert all(f.startswith("data: ") for f in frames)
    return [json.loads(f[6:]) for f in frames[:-1]]


def test_chat_non_streaming_and_streaming(decoders):
    address, fake = decoders()
    with gateway([address]) as client:
        body = client.post("/v1/chat/completions", json=CHAT).json()
        assert body["choices"][0]["message"]["content"] == "Hello there, friend"
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
        sent = fake.requests[-1]
        assert sent.request_id == body["id"] and sent.messages.messages[0].content == "hi"

        response = client.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                              "stream_options": {"include_usage": True}})
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == \
            "Hello there, friend"
        assert events[-2]["choices"][0]["finish_reason"] == "stop"
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4


def test_completion_stream_length(decoders):
    address, _ = decoders()
    with gateway([address]) as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2,
                                                        "stream": True})
        events = sse_events(response.text)
        assert [e["choices"][0]["text"] for e in events] == ["Hello", " there", ""]  # OpenAI ends with an empty text
        assert events[-1]["choices"][0]["finish_reason"] == "length" and "usage" not in events[-1]


def test_no_decoder_is_503(decoders):
    with gateway([]) as client:
        response = client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "no_decoder_available"
        assert client.get("/health").status_code == 503


def test_refusing_decoder_is_skipped_and_all_saturated_is_429(decoders):
    full_a, _ = decoders(refuse=grpc.StatusCode.RESOURCE_EXHAUSTED)
    full_b, _ = decoders(refuse=grpc.StatusCode.RESOURCE_EXHAUSTED)
    with gateway([full_a, full_b], retry_after_s=2) as client:
        response = client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 429 and response.headers["retry-after"] == "2"
        assert response.json()["error"]["type"] == "rate_limit_exceeded"
    draining, _ = decoders(refuse=grpc.StatusCode.UNAVAILABLE)
    healthy, fake = decoders()
    with gateway([draining, healthy]) as client:
        for _ in range(3):
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert len(fake.requests) == 3


def test_invalid_argument_from_decoder_is_400(decoders):
    address, _ = decoders(refuse=grpc.StatusCode.INVALID_ARGUMENT)
    with gateway([address]) as client:
        response = client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        assert response.status_code == 400 and response.json()["error"]["message"] == "refused"


def test_auth_body_limit_and_unknown_routes(decoders):
    address, _ = decoders()
    with gateway([address], api_keys=["k1", "k2"], max_body_bytes=200) as client:
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).json()["error"]["code"] == \
            "invalid_api_key"
        ok = {"Authorization": "Bearer k2"}
        assert client.get("/v1/models", headers=ok).json()["data"][0]["id"] == MODEL
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 300}]}
        response = client.post("/v1/chat/completions", json=big, headers=ok)
        assert response.status_code == 413 and set(response.json()["error"]) == {"message", "type", "param", "code"}
        assert client.get("/health").status_code == 200  # ops endpoints need no key
        assert client.get("/v1/nothing", headers=ok).json()["error"]["code"] == "not_found"


def test_metrics_count_requests_and_tokens(decoders):
    address, _ = decoders()
    with gateway([address]) as client:
        client.post("/v1/chat/completions", json=CHAT)
        client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
        text = client.get("/metrics").text
    assert 'dhisparse_gateway_requests_total{endpoint="/v1/chat/completions",status="200"} 1.0' in text
    assert 'dhisparse_gateway_requests_total{endpoint="/v1/chat/completions",status="404"} 1.0' in text
    assert "dhisparse_gateway_generation_tokens_total 4.0" in text
    assert "dhisparse_gateway_time_to_first_token_seconds_count 1.0" in text
    assert "dhisparse_gateway_inter_token_latency_seconds_count 3.0" in text
