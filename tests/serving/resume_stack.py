"""Helpers of the resume tests (a decoder going away under a live SSE stream): a whole stack with
kvtier, a second decoder joining it, a greedy streamed completion through the gateway, and a
decoder's Stats over gRPC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import httpx

from dhisparse.stack import LocalStack, StackOptions, free_port
from services.decoder.service.server import probe
from services.rpc import decoder_pb2 as pb
from services.rpc import decoder_pb2_grpc as pb_grpc
from tests.decoder.prompts import long_document

MODEL = "SmolLM2-135M-Instruct"
PAGE_SIZE = 16  # the decoders' default page size
PROMPT = long_document(20)  # ~400 tokens: 25 sealed pages before the first generated token
MAX_TOKENS = 160


def start_stack(workdir, decoder_args=(), env=None) -> LocalStack:
    """Redis, kvtier, one decoder and a gateway that waits up to 120 s to resume a stream."""
    workdir.mkdir()
    # its own kvtier segment name: the serving tests' session stack (same pytest process) may be up
    options = StackOptions(instance=f"resume-{uuid.uuid4().hex[:8]}", gateway_port=free_port(), decoder_port=free_port(), kvtier_port=free_port(), kvtier=True,
                           kvtier_pool_gib=0.1, workdir=workdir, env=dict(env or {}),
                           decoder_args=["--kv-cache-tokens", "8192", "--threads", "1", *decoder_args],
                           gateway_args=["--resume-timeout-s", "120"])
    return LocalStack(options).start(log=lambda _msg: None)


def wait_for(predicate, timeout_s: float, what: str):
    """Polls ``predicate`` until it returns something truthy (returned) or fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def join_second_decoder(stack: LocalStack, port: int, log_path, kv_cache_tokens: int = 8192,
                        extra_args=()) -> subprocess.Popen:
    """Decoder "decoder-b" on ``port``: the stack's Redis, kvtier, internal credentials and
    environment. Returns once it answers and the gateway routes to two decoders (killed if not)."""
    o = stack.options
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.decoder.service", "--host", "127.0.0.1", "--port", str(port),
             "--advertise-address", f"127.0.0.1:{port}", "--decoder-id", "decoder-b", "--redis-url", stack.redis.url,
             "--kvtier-address", f"{o.host}:{o.kvtier_port}", "--kv-cache-tokens", str(kv_cache_tokens),
             "--threads", "1", *extra_args],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **stack._internal_env(), **o.env})
    try:
        address = f"127.0.0.1:{port}"
        wait_for(lambda: process.poll() is not None or probe(address, 1.0, stack.security), 240, "decoder-b")
        assert process.poll() is None, log_path.read_text()
        wait_for(lambda: httpx.get(f"{stack.url}/health").json()["num_decoders"] == 2, 10, "two decoders")
    except BaseException:
        process.kill()
        raise
    return process


def stream(url: str, on_event=None, max_tokens: int = MAX_TOKENS, prompt: str = PROMPT) -> dict:
    """One greedy streamed completion of ``prompt``; ``on_event(n)`` after the n-th data event.
    Returns text, finish_reason, usage and the number of events; fails on an error event."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    text, reason, usage, n = [], None, None, 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            assert "error" not in event, event
            for choice in event.get("choices", []):
                text.append(choice["text"])
                reason = choice.get("finish_reason") or reason
            usage = event.get("usage") or usage
            n += 1
            if on_event is not None:
                on_event(n)
    return {"text": "".join(text), "finish_reason": reason, "usage": usage, "num_events": n}


def decoder_stats(stack: LocalStack, address: str) -> pb.StatsResponse:
    with stack.security.channel(address) as channel:
        return pb_grpc.DecoderStub(channel).Stats(pb.StatsRequest(), timeout=10)


def prompt_tokens(url: str) -> int:
    """The prompt's token count, from a one-token completion's usage."""
    reply = httpx.post(f"{url}/v1/completions", timeout=120,
                       json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()["usage"]["prompt_tokens"]
