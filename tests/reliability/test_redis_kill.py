"""kill -9 of Redis in the middle of generation (real processes: ``dhisparse up``'s Redis, kvtier,
a decoder and the gateway), then Redis restarted with the same command line and data directory.

A kill gives Redis no chance to save. kvtier writes every page-table change to Redis before it
applies it in memory and acknowledges it, so whatever Redis loses in a kill is a change kvtier has
already acknowledged and will not write again: the persisted table would silently fall behind the
one in memory (and a later kvtier restart would load the stale one). The test pauses the decoder
(SIGSTOP, well under every TTL) and compares the two, entry by entry, right after the restart and
again after generation went on; the streams that were running finish equal to the uninterrupted
run."""

from __future__ import annotations

import signal
import time

import grpc
import httpx

from services.metadata.keys import Keys
from services.rpc import kvtier_pb2 as pb
from services.rpc import kvtier_pb2_grpc as pb_grpc
from tests.reliability.test_stack_faults import (
    MODEL,
    PROMPTS,
    assert_pages_all_freed,
    kvtier_stats,
    once_at,
    run_both,
    stack,  # noqa: F401 - the fixture
)

MAX_TOKENS = 128  # longer than test_stack_faults' streams: Redis is killed and restarted mid-stream


def persisted_table(local) -> dict[str, tuple]:
    """kvtier's page table as Redis holds it: request -> (owner, committed, resumable, host pages)."""
    keys, instance = Keys(), local.options.instance
    with local.redis.client(socket_timeout=5) as r:
        table = {}
        for rid in sorted(m.decode() for m in r.smembers(keys.kvtier_requests(instance))):
            meta = r.hgetall(keys.kvtier_page_table(instance, rid))
            pages = [int(p) for p in r.lrange(keys.kvtier_page_list(instance, rid), 0, -1)]
            table[rid] = (meta.get(b"owner", b"?").decode(), int(meta.get(b"num_committed", -1)),
                          meta.get(b"resumable") == b"1", pages)
        orphans = [k.decode() for k in r.scan_iter(match=keys.kvtier_prefix(instance) + "pt:*")
                   if k.decode().split(":pt:", 1)[1].removesuffix(":pages") not in table]
    if orphans:  # page-table keys of a request the set does not list
        table["<unlisted>"] = ("", 0, False, sorted(orphans))
    return table


def memory_table(local, request_ids: list[str]) -> dict[str, tuple]:
    """The same requests as kvtier holds them in memory (Lookup as their owner, who holds a lease)."""
    with local.security.channel(f"{local.options.host}:{local.options.kvtier_port}") as channel:
        found = pb_grpc.KvtierStub(channel).Lookup(pb.LookupRequest(
            decoder_id=f"decoder-{local.options.instance}", request_ids=request_ids), timeout=5).requests
    return {r.request_id: (r.owner_decoder_id, r.num_committed_pages, r.resumable, list(r.host_page_ids))
            for r in found}


def mismatch(local) -> str | None:
    """None when Redis holds exactly kvtier's in-memory page table, else what differs."""
    persisted = persisted_table(local)
    stats = kvtier_stats(local)
    try:
        memory = memory_table(local, [rid for rid in persisted if not rid.startswith("<")])
    except grpc.RpcError as exc:  # Redis lists a request that kvtier does not hold
        return f"Redis {persisted}; kvtier: {exc.details()}"
    listed = [e for rid, e in persisted.items() if not rid.startswith("<")]
    totals = (len(listed), sum(len(e[3]) for e in listed), sum(e[1] for e in listed))
    if memory != persisted or totals != (stats.num_requests, stats.num_used_pages, stats.num_committed_pages):
        return f"Redis {persisted} (requests, pages, committed {totals}) != kvtier {memory} ({stats})"
    return None


def compare_paused(local, seen: dict, name: str) -> None:
    """Pauses the decoder (so no kvtier call changes the table), polls until Redis and kvtier agree
    (a call already sent may still land) for up to 5 s, resumes it; records the last difference."""
    decoder = local.processes["decoder"]
    decoder.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 5
        while (problem := mismatch(local)) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        seen[name] = (problem, kvtier_stats(local).num_requests)
    finally:
        decoder.send_signal(signal.SIGCONT)


def test_redis_kill9_loses_no_acknowledged_page_table_write(stack):  # noqa: F811 - the fixture
    reference = run_both(stack.url, max_tokens=MAX_TOKENS)
    assert all(r[1] == "length" and r[2] == MAX_TOKENS for r in reference), reference
    assert_pages_all_freed(stack)
    seen: dict = {}
    redis_url = stack.redis.url

    def outage():
        stack.redis._process.kill()  # SIGKILL: no shutdown, no save
        stack.redis._process.wait(timeout=10)
        time.sleep(0.5)  # past the gateway's registry cache (0.25 s)
        started = time.monotonic()
        reply = httpx.post(f"{stack.url}/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=30)
        seen["while_down"] = (reply.status_code, reply.json(), time.monotonic() - started)
        time.sleep(1.0)  # the decoder's kvtier calls fail meanwhile (kvtier answers UNAVAILABLE)
        stack.redis.start()  # same command line, same directory
        seen["up"] = time.monotonic()
        compare_paused(stack, seen, "after_restart")

    def later():
        deadline = time.monotonic() + 60
        while "after_restart" not in seen and time.monotonic() < deadline:
            time.sleep(0.05)
        compare_paused(stack, seen, "later")

    first, second = once_at(3, outage), once_at(60, later)
    outputs = run_both(stack.url, lambda n: (first(n), second(n)), MAX_TOKENS)
    deadline = time.monotonic() + 30
    while "later" not in seen and time.monotonic() < deadline:
        time.sleep(0.1)
    status, body, answered_s = seen["while_down"]
    assert status == 503 and answered_s < 5 and body["error"]["code"] == "registry_unavailable", seen["while_down"]
    assert stack.redis.url == redis_url
    # Redis came back with every write kvtier had acknowledged, and stayed in step afterwards
    # (the long request was still running at both comparisons)
    for name in ("after_restart", "later"):
        problem, num_requests = seen[name]
        assert problem is None and num_requests >= 1, (name, problem)
    assert outputs == reference  # the streams under way finished unchanged
    kvtier_log = (stack.workdir / "kvtier.log").read_text(errors="replace")
    assert "Redis unavailable" in kvtier_log  # the kill did hit page-table writes
    # services recover: new requests are served, and the state ends consistent and empty
    deadline = seen["up"] + 15
    while (reply := httpx.post(f"{stack.url}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True})).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert reply.status_code == 200 and reply.json()["choices"][0]["text"] == reference[1][0], reply.text
    assert_pages_all_freed(stack)
    assert mismatch(stack) is None and persisted_table(stack) == {}
    assert all(stack.processes[name].poll() is None for name in ("kvtier", "decoder", "gateway"))
