"""SSE framing and OpenAI response bodies (no server)."""

from __future__ import annotations

import json

from services.gateway import openai_format as fmt


def parse_event(event: str) -> dict:
    assert event.startswith("data: ") and event.endswith("\n\n") and "\n" not in event[:-2]
    return json.loads(event[len("data: "):])


def test_done_and_event_framing():
    assert fmt.SSE_DONE == "data: [DONE]\n\n"
    assert parse_event(fmt.sse_event({"a": "é\n"})) == {"a": "é\n"}


def test_chat_chunks_follow_openai():
    f = fmt.ChunkFormatter(chat=True, response_id="chatcmpl-1", created=7, model="m", include_usage=True)
    role = parse_event(f.role())
    assert role["object"] == "chat.completion.chunk" and role["usage"] is None
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    delta = parse_event(f.delta("Hi"))
    assert delta["choices"][0] == {"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}
    last = parse_event(f.delta("", "stop"))
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "stop"
    usage = parse_event(f.usage(3, 2))
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 2,
                                                          "total_tokens": 5}


def test_completion_chunks_without_usage_have_no_usage_field():
    f = fmt.ChunkFormatter(chat=False, response_id="cmpl-1", created=7, model="m", include_usage=False)
    chunk = parse_event(f.delta("x", "length"))
    assert "usage" not in chunk and chunk["object"] == "text_completion"
    assert chunk["choices"][0] == {"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}


def test_non_streaming_bodies():
    body = fmt.chat_response("chatcmpl-1", 7, "m", "hello", "stop", 4, 1)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "hello" and body["usage"]["total_tokens"] == 5
    body = fmt.completion_response("cmpl-1", 7, "m", "hello", "length", 4, 1)
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == "hello"
