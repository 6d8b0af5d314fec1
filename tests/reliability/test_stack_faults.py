"""Faults of the whole stack (``dhisparse up``'s Redis, kvtier, decoder and gateway as processes):
kill -9 of kvtier in the middle of generation, and a restart of Redis under traffic.

Both compare greedy outputs with the same requests run through the same stack without the fault.
The decoder writes every sealed page back to kvtier, and kvtier persists every change in Redis,
so each fault hits calls that the request needs while it is generating."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from dhisparse.stack import LocalStack, StackOptions, free_port
from services.rpc import kvtier_pb2 as pb
from services.rpc import kvtier_pb2_grpc as pb_grpc
from tests.decoder.prompts import SHORT_PROMPTS, long_document
from tests.serving import resume_stack

MODEL = "SmolLM2-135M-Instruct"
PROMPTS = [long_document(20), SHORT_PROMPTS[1]]  # ~400 tokens (25 sealed pages) and a short one
MAX_TOKENS = 64


@pytest.fixture
def stack(tmp_path):
    # its own kvtier segment name: the serving tests' session stack (same pytest process) may be up
    options = StackOptions(instance=f"faults-{uuid.uuid4().hex[:8]}", gateway_port=free_port(), decoder_port=free_port(), kvtier_port=free_port(), kvtier=True,
                           kvtier_pool_gib=0.1, workdir=tmp_path / "stack",
                           decoder_args=["--kv-cache-tokens", "8192", "--threads", "1"])
    options.workdir.mkdir()
    local = LocalStack(options).start(log=lambda _msg: None)
    yield local
    local.stop()


def stream(url: str, prompt: str, on_event=None, max_tokens: int = MAX_TOKENS) -> tuple[str, str, int]:
    """One greedy streamed completion: ``(text, finish_reason, completion_tokens)``; ``on_event(n)``
    after the n-th event. Fails on an error event."""
    out = resume_stack.stream(url, on_event, max_tokens, prompt)
    return out["text"], out["finish_reason"], (out["usage"] or {}).get("completion_tokens", 0)


def run_both(url: str, on_event=None, max_tokens: int = MAX_TOKENS) -> list[tuple[str, str, int]]:
    """Both ``PROMPTS`` streamed at once (``on_event`` sees the first one's events)."""
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(stream, url, PROMPTS[0], on_event, max_tokens),
                   pool.submit(stream, url, PROMPTS[1], None, max_tokens)]
        return [f.result() for f in futures]


def kvtier_stats(stack: LocalStack) -> pb.StatsResponse:
    with stack.security.channel(f"{stack.options.host}:{stack.options.kvtier_port}") as channel:
        return pb_grpc.KvtierStub(channel).Stats(pb.StatsRequest(check_integrity=True), timeout=5)


def assert_pages_all_freed(stack: LocalStack) -> None:
    deadline = time.monotonic() + 15
    while (stats := kvtier_stats(stack)).num_used_pages and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stats.integrity_ok and stats.num_used_pages == 0 and stats.num_requests == 0, stats


def once_at(event: int, action):
    """An ``on_event`` that runs ``action`` (in a thread) when the stream reaches ``event``."""
    fired = threading.Event()

    def on_event(n: int) -> None:
        if n >= event and not fired.is_set():
            fired.set()
            threading.Thread(target=action, daemon=True).start()

    on_event.fired = fired
    return on_event


def test_kvtier_kill9_mid_generation_through_the_stack_changes_no_token(stack):
    reference = run_both(stack.url)
    assert all(r[1] == "length" and r[2] == MAX_TOKENS for r in reference), reference
    assert_pages_all_freed(stack)
    kvtier = stack.processes["kvtier"]
    timeline = {}

    def kill_then_restart():
        kvtier.kill()  # SIGKILL: no clean-up at all; the shm segment and Redis page table survive
        kvtier.wait(timeout=10)
        timeline["killed"] = time.monotonic()
        time.sleep(1.0)  # generation goes on meanwhile until a step needs kvtier
        stack.respawn("kvtier")

    trigger = once_at(5, kill_then_restart)
    outputs = run_both(stack.url, trigger)
    assert trigger.fired.is_set() and "killed" in timeline
    assert outputs == reference  # same text, finish reason and token count: nothing lost or repeated
    decoder_log = (stack.workdir / "decoder.log").read_text(errors="replace")
    assert "kvtier unavailable" in decoder_log  # the decoder really met the outage mid-generation
    kvtier_log = (stack.workdir / "kvtier.log").read_text(errors="replace")
    assert "re-attached" in kvtier_log  # the new kvtier adopted the surviving segment
    assert stack.processes["kvtier"].poll() is None
    assert_pages_all_freed(stack)


def test_redis_restart_gives_503_then_everything_recovers(stack):
    reference = run_both(stack.url)
    assert_pages_all_freed(stack)
    seen = {}

    def outage():
        stack.redis.stop()  # a clean Redis shutdown (it saves its snapshot first)
        time.sleep(0.5)  # past the gateway's registry cache (0.25 s)
        started = time.monotonic()
        reply = httpx.post(f"{stack.url}/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=30)
        seen["while_down"] = (reply.status_code, reply.json(), time.monotonic() - started,
                              reply.headers.get("retry-after"))
        seen["health"] = httpx.get(f"{stack.url}/health", timeout=10).status_code
        seen["metrics"] = httpx.get(f"{stack.url}/metrics", timeout=10).status_code
        time.sleep(1.0)
        stack.redis.start()
        seen["up"] = time.monotonic()

    trigger = once_at(3, outage)
    outputs = run_both(stack.url, trigger)  # requests under way when Redis went down finish unchanged
    assert trigger.fired.is_set()
    deadline = time.monotonic() + 20
    while "up" not in seen and time.monotonic() < deadline:
        time.sleep(0.1)
    status, body, answered_s, retry_after = seen["while_down"]
    assert status == 503 and answered_s < 5, (status, body)
    assert body["error"]["type"] == "service_unavailable" and body["error"]["code"] == "registry_unavailable"
    assert retry_after == "1" and seen["health"] == 503 and seen["metrics"] == 200
    assert outputs == reference
    # the outage hit calls the running requests needed: kvtier's page-table writes failed, were
    # answered UNAVAILABLE (nothing applied) and retried by the decoder; heartbeats failed too
    assert "Redis unavailable" in (stack.workdir / "kvtier.log").read_text(errors="replace")
    decoder_log = (stack.workdir / "decoder.log").read_text(errors="replace")
    assert "kvtier unavailable (UNAVAILABLE)" in decoder_log and "heartbeat failed" in decoder_log
    # after Redis is back: the decoder heartbeats again, and new requests are served
    deadline = seen["up"] + 15
    while True:
        reply = httpx.post(f"{stack.url}/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS, "temperature": 0,
                                 "ignore_eos": True})
        if reply.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == reference[1][0]
    assert_pages_all_freed(stack)
    assert all(stack.processes[name].poll() is None for name in ("kvtier", "decoder", "gateway"))

