"""A decoder that stops heartbeating, end to end (real processes: Redis, kvtier, two decoders, the
gateway; short TTLs through the services' environment variables).

The decoder serving a greedy stream is frozen with SIGSTOP while kvtier holds its request's host
pages: the process is alive and its ports accept connections, but it answers nothing and sends no
heartbeat (to Redis) and no lease renewal (to kvtier). Then:
- within the heartbeat TTL the gateway stops routing to it: ``/health`` counts one decoder and
  new requests are served by the other one;
- the frozen decoder's open stream does not hang the client: the gateway's keepalive pings go
  unanswered, and the client gets the tokens generated so far, then an error event;
- once its kvtier lease expires, kvtier frees the request's pages (the request was not resumable):
  every host page is free, the integrity check passes, one live lease is left.
Then it is thawed (SIGCONT), as after a long GC or VM pause: it finds its lease gone, takes a new
one, drops (aborts) the request whose pages kvtier took back without writing into them again,
comes back into routing and serves new requests correctly. **Before**, it retried freeing the
reaped request forever and failed the next request routed to it."""

from __future__ import annotations

import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from dhisparse.stack import free_port
from services.metadata.keys import Keys
from tests.reliability.test_stack_faults import kvtier_stats
from tests.serving.resume_stack import (
    MODEL,
    PROMPT,
    decoder_stats,
    join_second_decoder,
    start_stack,
    stream,
    wait_for,
)

HEARTBEAT_TTL_S = 2.0
LEASE_TTL_S = 3.0
REAP_INTERVAL_S = LEASE_TTL_S / 4  # kvtier's default
KEEPALIVE_S = 1.0  # the gateway's ping interval and ping timeout towards decoders
ENV = {"DHISPARSE_DECODER_HEARTBEAT_INTERVAL_S": "0.5", "DHISPARSE_DECODER_HEARTBEAT_TTL_S": str(HEARTBEAT_TTL_S),
       "DHISPARSE_KVTIER_LEASE_TTL_S": str(LEASE_TTL_S), "DHISPARSE_GATEWAY_DECODER_KEEPALIVE_S": str(KEEPALIVE_S)}
MAX_TOKENS = 96
SHORT = "The capital of France is"


def raw_stream(url: str, on_event) -> dict:
    """A greedy streamed completion that records an error event instead of failing on it."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "stream": True}
    text, errors, done, n = [], [], False, 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[len("data: "):])
                errors += [event["error"]] if "error" in event else []
                text += [c["text"] for c in event.get("choices", [])]
                n += 1
                on_event(n)
    return {"text": "".join(text), "errors": errors, "done": done, "ended": time.monotonic()}


def test_a_frozen_decoder_leaves_routing_within_the_ttl_and_its_pages_are_reclaimed(tmp_path):
    stack = start_stack(tmp_path / "stack", env=ENV)
    port = free_port()
    b_address = f"127.0.0.1:{port}"
    b = join_second_decoder(stack, port, tmp_path / "decoder-b.log")
    try:
        reference = stream(stack.url, max_tokens=MAX_TOKENS)["text"]
        decoders = {stack.decoder_address: stack.processes["decoder"], b_address: b}
        seen = {}

        def on_event(n: int) -> None:
            if n == 3:  # freeze the decoder serving the request, while kvtier holds its pages
                running = [a for a in decoders if decoder_stats(stack, a).num_running == 1]
                assert len(running) == 1, running
                pages = kvtier_stats(stack)
                assert pages.num_requests == 1 and pages.num_used_pages > 20, pages
                decoders[running[0]].send_signal(signal.SIGSTOP)
                seen["frozen"], seen["at"] = running[0], time.monotonic()

        result = {}
        reader = threading.Thread(target=lambda: result.update(raw_stream(stack.url, on_event)), daemon=True)
        reader.start()
        frozen_at = wait_for(lambda: seen.get("at"), 120, "the freeze")
        frozen, (survivor,) = seen["frozen"], set(decoders) - {seen["frozen"]}
        # out of routing within the heartbeat TTL (plus the gateway's 0.25 s registry cache)
        wait_for(lambda: httpx.get(f"{stack.url}/health").json()["num_decoders"] == 1, HEARTBEAT_TTL_S + 1, "expiry")
        left_routing_s = time.monotonic() - frozen_at
        frozen_id = "decoder-b" if frozen == b_address else f"decoder-{stack.options.instance}"
        with stack.redis.client() as r:
            assert not r.exists(Keys().decoder_heartbeat(frozen_id))
        # the frozen decoder's request: its pages are freed once the lease ran out
        stats = wait_for(lambda: (s := kvtier_stats(stack)).num_used_pages == 0 and s, LEASE_TTL_S + 10, "reaping")
        reclaimed_s = time.monotonic() - frozen_at
        assert stats.integrity_ok and stats.num_requests == 0 and stats.num_live_decoders == 1, stats
        assert LEASE_TTL_S - 1 < reclaimed_s < LEASE_TTL_S + REAP_INTERVAL_S + 2, reclaimed_s
        assert f"lease of decoder '{frozen_id}' expired: freed 1 requests" in \
            (tmp_path / "stack" / "kvtier.log").read_text()
        # new requests go to the other decoder (one routed to the frozen one would hang)
        before = decoder_stats(stack, survivor)
        for _ in range(3):
            reply = httpx.post(f"{stack.url}/v1/completions", timeout=60,
                               json={"model": MODEL, "prompt": SHORT, "max_tokens": 4, "temperature": 0})
            assert reply.status_code == 200, reply.text
        assert decoder_stats(stack, survivor).num_requests_finished - before.num_requests_finished == 3
        # the client was not left hanging: the tokens generated before the freeze, then an error event
        reader.join(timeout=4 * KEEPALIVE_S + 10)
        assert not reader.is_alive(), "the stream of the frozen decoder hangs"
        assert result["done"] and len(result["errors"]) == 1 and result["errors"][0]["type"] == "server_error"
        assert 0 < len(result["text"]) < len(reference) and reference.startswith(result["text"])
        assert result["ended"] - frozen_at < 4 * KEEPALIVE_S + 5
        assert left_routing_s <= HEARTBEAT_TTL_S + 1
        # thawed: back in routing, and it serves new requests correctly (its lost request aborted)
        decoders[frozen].send_signal(signal.SIGCONT)
        wait_for(lambda: httpx.get(f"{stack.url}/health").json()["num_decoders"] == 2, 10, "the thawed decoder")
        before = wait_for(lambda: (s := decoder_stats(stack, frozen)).num_running == 0 and s, 10, "the abort")
        expected = reply.json()["choices"][0]["text"]
        with ThreadPoolExecutor(4) as pool:  # concurrent: the gateway spreads them over both decoders
            texts = list(pool.map(lambda _: complete(stack.url), range(4)))
        assert texts == [expected] * 4
        after = wait_for(lambda: (s := decoder_stats(stack, frozen)).num_running == s.num_waiting == 0
                         and s.num_free_slots == s.num_total_slots and s, 10, "an idle decoder")
        assert after.num_requests_finished > before.num_requests_finished  # it took some of them
        log_path = tmp_path / ("decoder-b.log" if frozen == b_address else "stack/decoder.log")
        assert "kvtier lease was lost" in log_path.read_text(errors="replace")
        stats = wait_for(lambda: (s := kvtier_stats(stack)).num_used_pages == 0 and s, 10, "pages freed")
        assert stats.integrity_ok and stats.num_requests == 0 and stats.num_live_decoders == 2, stats
        assert decoders[frozen].poll() is None and b.poll() is None
    finally:
        for process in (stack.processes.get("decoder"), b):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
        if b.poll() is None:
            b.kill()
            b.wait()
        stack.stop()


def complete(url: str) -> str:
    reply = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": SHORT, "max_tokens": 4, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]
