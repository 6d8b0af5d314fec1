"""kill -9 of the decoder process under a live SSE stream (real stack: Redis, decoder, gateway as
processes): the client gets a clean error event and the end of the stream, never a hung
connection; afterwards the gateway answers 503 (no decoder alive), not a timeout."""

import json
import signal
import time

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def small_stack(tmp_path):
    from dhisparse.stack import LocalStack, StackOptions, free_port

    options = StackOptions(gateway_port=free_port(), decoder_port=free_port(), kvtier=False, workdir=tmp_path,
                           decoder_args=["--kv-cache-tokens", "8192", "--threads", "1"])
    stack = LocalStack(options).start(log=lambda _msg: None)
    yield stack
    stack.stop()


def test_killed_decoder_ends_the_stream_with_an_error_event(small_stack):
    body = {"model": MODEL, "prompt": "Count from one to one thousand: one, two,", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True, "stream": True}
    events = []
    started = time.monotonic()
    with httpx.stream("POST", f"{small_stack.url}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[len("data: "):])
            if len(events) == 3:  # generation is under way: kill the decoder without warning
                small_stack.processes["decoder"].send_signal(signal.SIGKILL)
    assert time.monotonic() - started < 30  # ended by the gateway, not by the client timeout
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "decoder" in error["message"]
    assert all("choices" in json.loads(e) for e in events[:3])  # tokens before the kill were delivered
    # no decoder left: a new request is refused at once (503), it does not hang
    deadline = time.monotonic() + 15
    while True:
        reply = httpx.post(f"{small_stack.url}/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=20)
        if reply.status_code == 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert reply.status_code == 503 and reply.json()["error"]["type"] in ("server_error", "service_unavailable")
