"""OpenAI request parsing and validation (no server)."""

from __future__ import annotations

import json

import pytest

from services.gateway.config import GatewayConfig
from services.gateway.errors import APIError
from services.gateway.generation import GenerationService
from services.gateway.schemas import ChatCompletionRequest, CompletionRequest, parse_request

MODEL = "SmolLM2-135M-Instruct"


def parse(schema, **body):
    return parse_request(schema, json.dumps(body).encode())


def error_of(model, body: bytes | dict) -> APIError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(APIError) as exc_info:
        parse_request(model, raw)
    assert exc_info.value.status == 400
    assert set(exc_info.value.body()["error"]) == {"message", "type", "param", "code"}
    return exc_info.value


def test_completion_prompt_forms():
    assert parse(CompletionRequest, model=MODEL, prompt="hi").single_prompt == "hi"
    assert parse(CompletionRequest, model=MODEL, prompt=["hi"]).single_prompt == "hi"
    assert parse(CompletionRequest, model=MODEL, prompt=[1, 2, 3]).single_prompt == [1, 2, 3]
    assert parse(CompletionRequest, model=MODEL, prompt=[[4, 5]]).single_prompt == [4, 5]
    request = parse(CompletionRequest, model=MODEL, prompt="x", stop="END")
    assert request.stop_list == ["END"] and request.max_tokens == 16
    assert "extra_field" in error_of(CompletionRequest, {"model": MODEL, "prompt": "x", "extra_field": 1}).message


def test_chat_messages_and_extras():
    request = parse(ChatCompletionRequest, model=MODEL, max_completion_tokens=5, top_k=3, ignore_eos=True,
                    messages=[{"role": "developer", "content": "be brief"},
                              {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                              {"role": "assistant", "content": None}])
    assert request.template_messages() == [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "ab"}, {"role": "assistant", "content": ""}]
    assert request.requested_max_tokens == 5 and request.top_k == 3 and request.ignore_eos


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x"}, "model"),
    ({"model": MODEL}, "prompt"),
    ({"model": MODEL, "prompt": "x", "temperature": 2.5}, "temperature"),
    ({"model": MODEL, "prompt": "x", "top_p": 0}, "top_p"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "x", "stop": [""]}, "stop"),
    ({"model": MODEL, "prompt": ""}, None),
    ({"model": MODEL, "prompt": ["a", "b"]}, None),
    ({"model": MODEL, "prompt": "x", "n": 2}, None),
    ({"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, None),
    ({"model": MODEL, "prompt": "x", "logprobs": 2}, None),
    ({"model": MODEL, "prompt": "x", "presence_penalty": 1.0}, None),
])
def test_invalid_completion_requests(body, param):
    error = error_of(CompletionRequest, body)
    assert error.param == param
    assert error.message


def test_invalid_chat_requests():
    assert error_of(ChatCompletionRequest, {"model": MODEL, "messages": []}).param == "messages"
    error_of(ChatCompletionRequest, {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]})
    error_of(ChatCompletionRequest, {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{}]})
    assert "Missing required parameter" in error_of(ChatCompletionRequest, {"model": MODEL}).message


def test_malformed_json_is_400():
    assert "parse the JSON" in error_of(CompletionRequest, b"{not json").message


def test_generate_request_applies_limits_and_defaults():
    service = GenerationService(GatewayConfig(max_tokens_limit=100, default_max_tokens=50, max_prompt_tokens=900),
                                client=None, metrics=None)
    chat = parse(ChatCompletionRequest, model=MODEL, messages=[{"role": "user", "content": "hi"}], temperature=0,
                 stop=["a", "b"], seed=7)
    proto = service.generate_request(chat, "chatcmpl-1")
    assert proto.WhichOneof("prompt") == "messages" and proto.messages.messages[0].content == "hi"
    assert proto.sampling.max_tokens == 50 and proto.sampling.temperature == 0 and proto.sampling.seed == 7
    assert list(proto.sampling.stop) == ["a", "b"] and proto.max_prompt_tokens == 900
    completion = parse(CompletionRequest, model=MODEL, prompt=[5, 6])
    proto = service.generate_request(completion, "cmpl-1")
    assert list(proto.prompt_token_ids.ids) == [5, 6] and proto.sampling.temperature == 1.0
    assert not proto.sampling.HasField("seed")
    with pytest.raises(APIError) as exc_info:
        service.generate_request(parse(CompletionRequest, model=MODEL, prompt="x", max_tokens=101), "cmpl-2")
    assert exc_info.value.status == 400 and exc_info.value.param == "max_tokens"
    with pytest.raises(APIError) as exc_info:
        service.generate_request(parse(CompletionRequest, model="other", prompt="x"), "cmpl-3")
    assert exc_info.value.status == 404 and exc_info.value.code == "model_not_found"
