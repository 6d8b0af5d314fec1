"""Probes of a running ``LocalStack``: RSS of its processes, decoder and kvtier Stats, the Redis
keys of requests, gateway metrics (used by the soak and by tests/reliability/test_overload.py)."""

from __future__ import annotations

import time

import httpx

SERVICES = ("redis", "kvtier", "decoder", "gateway")


def proc_status_kib(pid: int) -> dict[str, int]:
    """The ``kB`` fields of /proc/<pid>/status (VmRSS, RssAnon, RssFile, RssShmem, ...)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            parts = value.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[name] = int(parts[0])
    return out


def rss_mib(pid: int) -> tuple[float, float]:
    """``(VmRSS, VmRSS - RssShmem)`` of ``pid`` in MiB."""
    s = proc_status_kib(pid)
    return s["VmRSS"] / 1024, (s["VmRSS"] - s.get("RssShmem", 0)) / 1024


def service_pids(stack) -> dict[str, int]:
    pids = {name: p.pid for name, p in stack.processes.items()}
    if stack.redis is not None and stack.redis._process is not None:
        pids["redis"] = stack.redis._process.pid
    return pids


def decoder_stats(stack):
    from services.rpc import decoder_pb2 as pb
    from services.rpc import decoder_pb2_grpc as pb_grpc

    with stack.security.channel(stack.decoder_address) as channel:
        return pb_grpc.DecoderStub(channel).Stats(pb.StatsRequest(), timeout=10)


def kvtier_stats(stack, check_integrity: bool = True):
    from services.rpc import kvtier_pb2 as pb
    from services.rpc import kvtier_pb2_grpc as pb_grpc

    with stack.security.channel(f"{stack.options.host}:{stack.options.kvtier_port}") as channel:
        return pb_grpc.KvtierStub(channel).Stats(pb.StatsRequest(check_integrity=check_integrity), timeout=10)


def request_keys(stack) -> list[str]:
    """Every Redis key that belongs to one request: the decoder's request and residency hashes,
    kvtier's page-table entries, and the members of both request sets (``services/metadata/keys.py``)."""
    from services.metadata.keys import Keys

    keys = Keys()
    instance = stack.options.instance
    with stack.redis.client(decode_responses=True) as r:
        patterns = [make("x")[:-1] + "*" for make in (keys.request, keys.residency,  # "*" is no valid id
                                                      lambda rid: keys.kvtier_page_table(instance, rid))]
        found = [k for pattern in patterns for k in r.scan_iter(pattern)]
        found += [f"{keys.requests()} member {m}" for m in r.smembers(keys.requests())]
        found += [f"{keys.kvtier_requests(instance)} member {m}" for m in r.smembers(keys.kvtier_requests(instance))]
    return sorted(set(found))


def gateway_metric(url: str, name: str) -> float:
    """The sum of a Prometheus sample ``name`` (over its labels) from the gateway's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "))


def wait_idle(stack, timeout_s: float = 20.0):
    """Waits until the decoder runs nothing and holds no slot, kvtier holds no page and Redis no
    request key (the heartbeat removes a gone request's keys at its next beat); returns the last
    ``(decoder stats, kvtier stats, request keys)`` either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        d, k, keys = decoder_stats(stack), kvtier_stats(stack), request_keys(stack)
        idle = (d.num_running == 0 and d.num_waiting == 0 and d.num_free_slots == d.num_total_slots
                and k.num_used_pages == 0 and k.num_requests == 0 and not keys)
        if idle or time.monotonic() > deadline:
            return d, k, keys
        time.sleep(0.25)
