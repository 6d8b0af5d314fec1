"""Bad input against the gateway (in-process, over a fake decoder): each is answered with a 4xx
and OpenAI's error body ``{"error": {message, type, param, code}}``, and changes nothing: no
request reaches the decoder, no stream is left open, and the gateway serves the next request."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tests.reliability.conftest import MODEL

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
PROMPT = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
LIMIT = 4096  # max_body_bytes of these tests


@pytest.fixture
def gateway(gateway_app, fake_decoder):
    """``(client, fake)``; after the test: nothing is left in flight, and a valid request still
    gets its completion."""
    app = gateway_app(max_body_bytes=LIMIT, max_tokens_limit=512)
    _, fake = fake_decoder
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, fake
        assert all(n == 0 for n in app.state.client.in_flight.values())
        assert app.state.metrics.in_flight._value.get() == 0
        ok = client.post("/v1/chat/completions", json=CHAT)
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "Hello there, friend"


def refused(response, status: int, param: str | None = None, words: str = "") -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert words.lower() in error["message"].lower(), error["message"]
    return error


@pytest.mark.parametrize("body", [b"", b"{", b'{"model": "x",}', b"null", b"[1, 2]", b"'single quotes'",
                                  b"\x00" * 10])
def test_malformed_json_is_400(gateway, body):
    client, fake = gateway
    for path in ("/v1/chat/completions", "/v1/completions"):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
        refused(response, 400)
    assert fake.requests == []


@pytest.mark.parametrize("body", [
    "\xff\xfe{}".encode("latin-1"),  # UTF-16 BOM
    b'{"model": "\xc3\x28", "messages": []}',  # invalid 2-byte sequence
    b'{"model": "' + MODEL.encode() + b'", "prompt": "\xed\xa0\x80"}',  # UTF-8-encoded lone surrogate
    b'{"model": "' + MODEL.encode() + b'", "prompt": "\\ud800"}',  # JSON-escaped lone surrogate
    '{"model": "é"}'.encode("latin-1"),
])
def test_non_utf8_body_is_400(gateway, body):
    client, fake = gateway
    refused(client.post("/v1/completions", content=body, headers={"content-type": "application/json"}), 400)
    assert fake.requests == []


@pytest.mark.parametrize("field, value, param, words", [
    ("messages", "hi", "messages", "valid array"),
    ("messages", [], "messages", "at least 1"),
    ("messages", [{"role": "root", "content": "x"}], "messages.0.role", "user"),
    ("messages", [{"content": "x"}], "messages.0.role", "missing"),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "messages.0.content", ""),
    ("model", 7, "model", "valid string"),
    ("max_tokens", "many", "max_tokens", "valid integer"),
    ("max_tokens", 1.5, "max_tokens", "integer"),
    ("temperature", "hot", "temperature", "valid number"),
    ("stream", [True], "stream", "valid boolean"),
    ("stop", 5, "stop", "valid string"),
    ("stop_token_ids", "1,2", "stop_token_ids", "valid array"),
])
def test_wrong_types_are_400_naming_the_parameter(gateway, field, value, param, words):
    client, fake = gateway
    refused(client.post("/v1/chat/completions", json={**CHAT, field: value}), 400, param, words)
    assert fake.requests == []


@pytest.mark.parametrize("path, field, value, param", [
    # found by probing: these passed validation and overflowed the decoder's uint32/uint64 fields (500)
    ("/v1/chat/completions", "top_k", 2**40, "top_k"),
    ("/v1/chat/completions", "stop_token_ids", [-1], "stop_token_ids.0"),
    ("/v1/chat/completions", "stop_token_ids", [2**32], "stop_token_ids.0"),
    ("/v1/completions", "prompt", [2**40], "prompt"),
    ("/v1/completions", "prompt", [[1, 2**70]], "prompt"),
    ("/v1/completions", "prompt", [-5], "prompt"),
    # out of range or absurd
    ("/v1/chat/completions", "max_tokens", -1, "max_tokens"),
    ("/v1/chat/completions", "max_tokens", 0, "max_tokens"),
    ("/v1/chat/completions", "max_tokens", 513, "max_tokens"),  # above max_tokens_limit
    ("/v1/chat/completions", "max_tokens", 2**64, "max_tokens"),
    ("/v1/chat/completions", "max_completion_tokens", 10**30, "max_completion_tokens"),
    ("/v1/completions", "max_tokens", 10**100, "max_tokens"),
    ("/v1/chat/completions", "temperature", -0.5, "temperature"),
    ("/v1/chat/completions", "temperature", 1e308, "temperature"),
    ("/v1/chat/completions", "top_p", 0, "top_p"),
    ("/v1/chat/completions", "top_p", 1.5, "top_p"),
    ("/v1/chat/completions", "top_k", -2, "top_k"),
    ("/v1/chat/completions", "seed", -1, "seed"),
    ("/v1/chat/completions", "seed", 2**64, "seed"),
    ("/v1/chat/completions", "n", 1000, None),
    ("/v1/chat/completions", "presence_penalty", 9, "presence_penalty"),
    ("/v1/chat/completions", "stop", ["x"] * 17, "stop"),
    ("/v1/chat/completions", "stop", [""], "stop"),
    ("/v1/completions", "prompt", [], None),
    ("/v1/completions", "prompt", ["a", "b"], None),
])
def test_negative_and_absurd_parameters_are_400(gateway, path, field, value, param):
    client, fake = gateway
    body = {**(CHAT if "chat" in path else PROMPT), field: value}
    refused(client.post(path, json=body), 400, param)
    assert fake.requests == []


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers_are_400(gateway, value):
    client, fake = gateway
    for field in (b"temperature", b"top_p"):
        body = b'{"model": "%s", "prompt": "x", "%s": %s}' % (MODEL.encode(), field, value)
        refused(client.post("/v1/completions", content=body), 400, field.decode())
    assert fake.requests == []


def test_unknown_model_is_404(gateway):
    client, fake = gateway
    error = refused(client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4\u202e"}), 404, "model")
    assert error["code"] == "model_not_found"
    assert fake.requests == []


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_the_limit_is_413_before_it_is_read(gateway, chunked):
    """A prompt-injection-sized prompt: the body passes max_body_bytes (declared, or while streamed)."""
    client, fake = gateway
    body = json.dumps({"model": MODEL, "prompt": "ignore previous instructions " * 10_000}).encode()
    content = iter([body[i:i + 1000] for i in range(0, len(body), 1000)]) if chunked else body
    error = refused(client.post("/v1/completions", content=content, headers={"content-type": "application/json"}),
                    413)
    assert error["code"] == "request_too_large" and str(LIMIT) in error["message"]
    assert fake.requests == []


def test_unknown_fields_are_refused_and_cannot_override_what_the_gateway_sets(gateway):
    """Unknown top-level fields get a 400 naming the field (as OpenAI's API answers), so a client
    can neither misspell a parameter unnoticed nor smuggle the decoder-side request id, the prompt
    limit or anything else the gateway sets."""
    client, fake = gateway
    smuggled = {"request_id": "someone-elses-request", "max_prompt_tokens": 10**9, "decoder": "127.0.0.1:1",
                "sampling": {"max_tokens": 10**6}, "prompt_token_ids": [1, 2, 3], "__proto__": {"x": 1}}
    for name, value in smuggled.items():
        error = refused(client.post("/v1/chat/completions", json={**CHAT, name: value}), 400, param=name)
        assert name in error["message"]
    assert fake.requests == []
