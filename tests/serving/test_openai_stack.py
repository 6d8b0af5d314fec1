"""The official ``openai`` client against a real stack (separate processes): content equals the
in-process engine's greedy output; streaming, usage, stop, max_tokens, concurrency, errors,
and a client that disconnects mid-stream frees its pages on the decoder."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serving.conftest import API_KEY, MAX_BODY_BYTES, MAX_PROMPT_TOKENS, MODEL

CHAT = [{"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The three most common programming languages are"


def test_models_lists_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_matches_in_process_engine(client, reference):
    expected = reference(CHAT, 24, chat=True)
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_completion_matches_in_process_engine(client, reference):
    expected = reference(PROMPT, 20)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    assert reply.object == "text_completion"
    assert reply.choices[0].text == expected.text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert reply.usage.completion_tokens == 20


def test_completion_accepts_token_ids(client, reference, reference_llm):
    ids = reference_llm.tokenizer.encode(PROMPT)
    expected = reference(ids, 8)
    reply = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert reply.choices[0].text == expected.text


def test_chat_stream_with_usage(client, reference):
    expected = reference(CHAT, 24, chat=True)
    chunks = list(client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in content_chunks) == expected.text
    assert content_chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == len(expected.prompt_token_ids)
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert len({c.id for c in chunks}) == 1


def test_completion_stream_without_usage(client, reference):
    expected = reference(PROMPT, 12)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_stop_sequence_cuts_the_output(client, reference):
    full = reference(PROMPT, 20).text
    stop = full.split()[3]  # a word the greedy output reaches after a few tokens
    expected = reference(PROMPT, 20, stop=[stop])
    assert expected.finish_reason == "stop" and stop not in expected.text
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop])
    assert reply.choices[0].text == expected.text == full[: full.index(stop)]
    assert reply.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected.text


def test_max_tokens_bounds_the_output(client):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_eight_concurrent_clients(client, reference):
    prompts = [f"Write one sentence about the number {i}." for i in range(8)]
    expected = [reference([{"role": "user", "content": p}], 16, chat=True).text for p in prompts]

    def ask(i):
        messages = [{"role": "user", "content": prompts[i]}]
        if i % 2:
            stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                    stream=True)
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        return reply.choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert answers == expected


def test_finished_requests_leave_no_redis_key(stack, client):
    """The decoder publishes live requests' state and residency in Redis; a finished request's
    keys are gone by the next heartbeat (1 s)."""
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    redis = stack.redis.client()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (list(redis.scan_iter(match="*:req:*"))
                                           or list(redis.scan_iter(match="*:residency:*"))):
        time.sleep(0.2)
    assert list(redis.scan_iter(match="*:req:*")) == [] and list(redis.scan_iter(match="*:residency:*")) == []


def _error_of(exc_info) -> dict:
    body = exc_info.value.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_unknown_model_is_404(client):
    import openai

    with pytest.raises(openai.NotFoundError) as exc_info:
        client.chat.completions.create(model="gpt-unknown", messages=CHAT, max_tokens=2)
    assert _error_of(exc_info)["code"] == "model_not_found"


@pytest.mark.parametrize("bad", [{"temperature": 7}, {"max_tokens": 0}, {"max_tokens": 100000}, {"top_p": 0},
                                 {"n": 3}, {"messages": []}])
def test_invalid_params_are_400(client, bad):
    import openai

    kwargs = {"model": MODEL, "messages": CHAT, "max_tokens": 2, **bad}
    with pytest.raises(openai.BadRequestError) as exc_info:
        client.chat.completions.create(**kwargs)
    error = _error_of(exc_info)
    assert error["type"] == "invalid_request_error" and error["message"]


def test_oversized_body_is_413(stack):
    body = {"model": MODEL, "prompt": "x" * (MAX_BODY_BYTES + 1), "max_tokens": 1}
    response = httpx.post(f"{stack.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_bad_key_is_401(stack):
    import openai

    bad = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc_info:
        bad.models.list()
    assert _error_of(exc_info)["code"] == "invalid_api_key"
    assert httpx.get(f"{stack.url}/v1/models").status_code == 401


def test_disconnect_mid_stream_frees_the_pages(stack, decoder_stats):
    before = decoder_stats()
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as response:
        assert response.status_code == 200
        events = 0
        for line in response.iter_lines():
            if line.startswith("data: "):
                json.loads(line[6:])
                events += 1
            if events == 4:
                break
        assert decoder_stats().num_running == 1
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        stats = decoder_stats()
        if stats.num_running == 0 and stats.num_free_slots == stats.num_total_slots:
            break
        time.sleep(0.1)
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.num_free_slots == stats.num_total_slots
    assert stats.num_generated_tokens - before.num_generated_tokens < 200  # aborted well before 400 tokens


def test_metrics_and_health(stack, client):
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
    health = httpx.get(f"{stack.url}/health")
    assert health.status_code == 200 and health.json()["num_decoders"] == 1
    text = httpx.get(f"{stack.url}/metrics").text
    assert 'dhisparse_gateway_requests_total{endpoint="/v1/completions",status="200"}' in text
    for name in ("time_to_first_token_seconds_count", "time_per_output_token_seconds_count",
                 "inter_token_latency_seconds_count", "generation_tokens_total", "requests_in_flight"):
        assert f"dhisparse_gateway_{name}" in text
    assert "dhisparse_decoder_waiting_requests" in text


def test_prompt_over_the_limits_is_400_and_changes_nothing(stack, client, decoder_stats, reference, reference_llm):
    """Prompts that fit in the body limit but not in the model's context, or over the gateway's
    ``--max-prompt-tokens`` (the limit travels in the request): the real decoder refuses them before
    admitting them; the gateway answers 400 with an OpenAI body. No slot, queue entry or kvtier page
    is held afterwards and the next request still matches the oracle."""
    from tests.decoder.prompts import long_document

    context = reference_llm.engine.max_model_len
    text = long_document(context // 18)  # ~19 tokens per line: over the context, within the gateway's limit
    longer = long_document(MAX_PROMPT_TOKENS // 17)  # over the gateway's limit
    assert context < len(reference_llm.tokenizer.encode(text)) < MAX_PROMPT_TOKENS
    assert len(reference_llm.tokenizer.encode(longer)) > MAX_PROMPT_TOKENS
    over = [{"prompt": text}, {"prompt": [1] * context},  # text, and exactly `context` token ids
            {"messages": [{"role": "user", "content": text}], "chat": True},
            {"prompt": longer, "limit": f"at most {MAX_PROMPT_TOKENS}"},
            {"prompt": [1] * (MAX_PROMPT_TOKENS + 1), "limit": f"at most {MAX_PROMPT_TOKENS}"}]
    headers = {"Authorization": f"Bearer {API_KEY}"}
    before = decoder_stats()
    for case in over:
        body = {"model": MODEL, "max_tokens": 4, **{k: v for k, v in case.items() if k not in ("chat", "limit")}}
        assert len(json.dumps(body)) < MAX_BODY_BYTES  # under the body limit: the decoder decides
        path = "/v1/chat/completions" if case.get("chat") else "/v1/completions"
        for stream in (False, True):
            response = httpx.post(f"{stack.url}{path}", json={**body, "stream": stream}, headers=headers, timeout=60)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "invalid_request_error", error
            assert case.get("limit", "the model context is") in error["message"], error
    after = decoder_stats()
    assert after.num_running == after.num_waiting == 0
    assert after.num_free_slots == after.num_total_slots
    assert after.num_prompt_tokens == before.num_prompt_tokens  # nothing was admitted or prefilled
    assert after.num_requests_finished == before.num_requests_finished
    with stack.security.channel(f"{stack.options.host}:{stack.options.kvtier_port}") as channel:
        from services.rpc import kvtier_pb2, kvtier_pb2_grpc

        stats = kvtier_pb2_grpc.KvtierStub(channel).Stats(kvtier_pb2.StatsRequest(check_integrity=True), timeout=5)
    assert stats.integrity_ok and stats.num_used_pages == 0 and stats.num_requests == 0, stats
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert completion.choices[0].text == reference(PROMPT, 8).text
