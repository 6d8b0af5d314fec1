"""Hostile gRPC against a real kvtier process (``python -m services.kvtier`` over a real Redis),
sent through the raw generated stub so that nothing client-side filters it: foreign request ids,
counts out of range, double frees, absurd allocations, malformed ids and undecodable bytes.
Each is refused with a gRPC status and a detail, and leaves the page table, the allocator, the
leases and the Redis copy exactly as they were (Stats with the integrity check, Lookup, and the
instance's Redis keys before and after).

No kvtier RPC takes a host page id from the caller (kvtier hands page ids out; callers name
requests and counts), so a forged page id cannot be sent; the nearest attacks are commit counts
beyond a request's allocation, tested here.
"""

from __future__ import annotations

import grpc
import pytest

from services.metadata.keys import Keys
from services.rpc import kvtier_pb2 as pb
from services.rpc import kvtier_pb2_grpc as pb_grpc
from tests.kvtier.conftest import TINY

UINT32_MAX = 2**32 - 1
LAYOUT = pb.PageLayout(dtype="float32", num_layers=TINY["num_layers"], num_kv_heads=TINY["num_kv_heads"],
                       head_dim=TINY["head_dim"], page_size=TINY["page_size"])
C = grpc.StatusCode


@pytest.fixture
def kvtier(kvtier_process, redis_server, namespace):
    """A kvtier of 16 host pages where decoder A holds ``a1`` (3 pages, 2 committed) and ``a2``
    (1 page, resumable) and decoder B holds ``b1`` (2 pages); yields ``(stub, snapshot, channel)``."""
    proc = kvtier_process(instance="hostile", host_pool_pages=16)
    channel = grpc.insecure_channel(proc.address)
    stub = pb_grpc.KvtierStub(channel)
    for decoder in ("A", "B"):
        stub.Attach(pb.AttachRequest(decoder_id=decoder, model_id="m", layout=LAYOUT), timeout=10)
    stub.Allocate(pb.AllocateRequest(decoder_id="A", allocations=[pb.AllocateItem(request_id="a1", num_pages=3),
                                                                  pb.AllocateItem(request_id="a2", num_pages=1)]))
    stub.Commit(pb.CommitRequest(decoder_id="A", commits=[pb.CommitItem(request_id="a1", num_committed_pages=2)]))
    stub.MarkResumable(pb.MarkResumableRequest(decoder_id="A", request_ids=["a2"], resumable=True))
    stub.Allocate(pb.AllocateRequest(decoder_id="B", allocations=[pb.AllocateItem(request_id="b1", num_pages=2)]))
    redis = redis_server.client()
    prefix = Keys(namespace).kvtier_prefix("hostile")

    def snapshot() -> tuple:
        """Everything a refused call must leave alone (lease expiries aside: calls renew them)."""
        stats = stub.Stats(pb.StatsRequest(check_integrity=True), timeout=5)
        assert stats.integrity_checked and stats.integrity_ok, stats.integrity_detail
        pages = [stub.Lookup(pb.LookupRequest(decoder_id=d, request_ids=ids), timeout=5)  # each owner its own
                 for d, ids in (("A", ["a1", "a2"]), ("B", ["b1"]))]
        keys = {}
        for key in sorted(redis.scan_iter(match=prefix + "*")):
            kind = redis.type(key)
            if kind == b"hash" and not key.endswith(b":leases") and not key.endswith(b":info"):
                keys[key] = redis.hgetall(key)
            elif kind == b"list":
                keys[key] = redis.lrange(key, 0, -1)
            elif kind == b"set":
                keys[key] = redis.smembers(key)
            else:
                keys[key] = kind
        stats.ClearField("num_live_decoders")  # compared separately where it matters
        return (stats.SerializeToString(deterministic=True), [p.SerializeToString(deterministic=True) for p in pages],
                keys)

    yield stub, snapshot, channel
    channel.close()


def refused(call, code: grpc.StatusCode, detail: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, (err.value.code(), err.value.details())
    assert detail in err.value.details(), err.value.details()


def step(stub, decoder_id, commits=(), frees=(), allocations=()):
    return lambda: stub.Step(pb.StepRequest(
        decoder_id=decoder_id,
        commits=[pb.CommitItem(request_id=r, num_committed_pages=n) for r, n in commits],
        free_request_ids=list(frees),
        allocations=[pb.AllocateItem(request_id=r, num_pages=n) for r, n in allocations]), timeout=5)


def test_a_decoder_cannot_touch_another_decoders_requests(kvtier):
    stub, snapshot, _ = kvtier
    before = snapshot()
    owned_by_a = "is owned by decoder 'A'"
    cases = [
        ("free", lambda: stub.Free(pb.FreeRequest(decoder_id="B", request_ids=["a1"]), timeout=5)),
        ("commit", lambda: stub.Commit(pb.CommitRequest(
            decoder_id="B", commits=[pb.CommitItem(request_id="a1", num_committed_pages=3)]), timeout=5)),
        ("grow", step(stub, "B", allocations=[("a1", 1)])),
        ("grow by 0", step(stub, "B", allocations=[("a1", 0)])),
        ("resumable", lambda: stub.MarkResumable(pb.MarkResumableRequest(
            decoder_id="B", request_ids=["a2"], resumable=False), timeout=5)),
        # all-or-nothing: B's valid commit of its own b1 is not applied either
        ("mixed step", step(stub, "B", commits=[("b1", 2)], frees=["a2"])),
        ("claim from a live owner", lambda: stub.Lookup(pb.LookupRequest(
            decoder_id="B", request_ids=["a1"], claim=True), timeout=5)),
    ]
    for name, call in cases:
        detail = "owned by live decoder 'A'" if name.startswith("claim") else owned_by_a
        refused(call, C.FAILED_PRECONDITION, detail)
        assert snapshot() == before, name


def test_decoders_without_a_lease_and_malformed_ids_are_refused(kvtier):
    stub, snapshot, _ = kvtier
    before = snapshot()
    no_lease = "holds no lease"
    cases = [
        (step(stub, "C", frees=["a1"]), C.NOT_FOUND, no_lease),  # never attached
        (lambda: stub.Heartbeat(pb.HeartbeatRequest(decoder_id="C"), timeout=5), C.NOT_FOUND, no_lease),
        (lambda: stub.Detach(pb.DetachRequest(decoder_id="C"), timeout=5), C.NOT_FOUND, no_lease),
        (lambda: stub.Lookup(pb.LookupRequest(decoder_id="C", request_ids=["a1"], claim=True), timeout=5),
         C.NOT_FOUND, no_lease),
        (step(stub, "", allocations=[("x", 1)]), C.INVALID_ARGUMENT, "decoder_id"),
        (step(stub, "A:evil", allocations=[("x", 1)]), C.INVALID_ARGUMENT, "decoder_id"),
        (step(stub, "A", allocations=[("", 1)]), C.INVALID_ARGUMENT, "request_id"),
        (step(stub, "A", allocations=[("a1:pages", 1)]), C.INVALID_ARGUMENT, "request_id"),  # Redis key injection
        (step(stub, "A", allocations=[("../x", 1)]), C.INVALID_ARGUMENT, "request_id"),
        (step(stub, "A", allocations=[("x" * 129, 1)]), C.INVALID_ARGUMENT, "request_id"),
        (step(stub, "A", allocations=[("é", 1)]), C.INVALID_ARGUMENT, "request_id"),
        (step(stub, "A", frees=["a1", "a1"]), C.INVALID_ARGUMENT, "appears twice"),
        (step(stub, "A", frees=["a1"], allocations=[("a1", 1)]), C.INVALID_ARGUMENT, "both freed and allocated"),
        (lambda: stub.Lookup(pb.LookupRequest(decoder_id="A", request_ids=["a1", "a1"]), timeout=5),
         C.INVALID_ARGUMENT, "appears twice"),
        (lambda: stub.Attach(pb.AttachRequest(decoder_id="C", model_id="", layout=LAYOUT), timeout=5),
         C.INVALID_ARGUMENT, "model_id"),
        (lambda: stub.Attach(pb.AttachRequest(decoder_id="C", model_id="other", layout=LAYOUT), timeout=5),
         C.FAILED_PRECONDITION, "model mismatch"),
        (lambda: stub.Attach(pb.AttachRequest(decoder_id="C", model_id="m"), timeout=5),  # no layout at all
         C.FAILED_PRECONDITION, "page layout mismatch"),
    ]
    for call, code, detail in cases:
        refused(call, code, detail)
        assert snapshot() == before, detail
    stats = stub.Stats(pb.StatsRequest(), timeout=5)
    assert stats.num_live_decoders == 2  # no refused Attach/Lookup left a lease behind


def test_double_free_out_of_range_commits_and_absurd_allocations_are_refused(kvtier):
    stub, snapshot, _ = kvtier
    step(stub, "A", allocations=[("tmp", 2)])()
    step(stub, "A", frees=["tmp"])()
    before = snapshot()
    cases = [
        (step(stub, "A", frees=["tmp"]), C.NOT_FOUND, "'tmp' has no host pages"),  # double free
        (step(stub, "A", commits=[("a1", 4)]), C.FAILED_PRECONDITION, "must be in [2 (committed), 3 (allocated)]"),
        (step(stub, "A", commits=[("a1", UINT32_MAX)]), C.FAILED_PRECONDITION, "3 (allocated)"),
        (step(stub, "A", commits=[("a1", 1)]), C.FAILED_PRECONDITION, "2 (committed)"),  # decreasing
        (step(stub, "A", commits=[("tmp", 1)]), C.NOT_FOUND, "no host pages"),  # commit after free
        (step(stub, "A", allocations=[("big", UINT32_MAX)]), C.RESOURCE_EXHAUSTED,
         f"asked for {UINT32_MAX} host pages, 10 free of 16"),
        (step(stub, "A", allocations=[(f"big{i}", UINT32_MAX) for i in range(64)]), C.RESOURCE_EXHAUSTED,
         f"asked for {64 * UINT32_MAX} host pages"),  # no uint32 wrap-around in the sum
        (step(stub, "A", allocations=[(f"r{i}", 1) for i in range(11)]), C.RESOURCE_EXHAUSTED, "asked for 11"),
        # a valid commit and free in the same step as an absurd allocation: nothing applied
        (step(stub, "A", commits=[("a1", 3)], frees=["a2"], allocations=[("big", 17)]), C.RESOURCE_EXHAUSTED,
         "asked for 17 host pages, 11 free"),
    ]
    for call, code, detail in cases:
        refused(call, code, detail)
        assert snapshot() == before, detail
    assert not step(stub, "A", allocations=[("empty", 0)])().allocated  # a 0-page allocation makes no entry
    assert snapshot() == before


def test_undecodable_bytes_are_refused_and_kvtier_keeps_serving(kvtier):
    stub, snapshot, channel = kvtier
    before = snapshot()
    for method in ("Step", "Attach", "Free", "Lookup"):
        raw = channel.unary_unary(f"/dhisparse.kvtier.v1.Kvtier/{method}", request_serializer=None,
                                  response_deserializer=None)
        for garbage in (b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05ab"):
            with pytest.raises(grpc.RpcError) as err:
                raw(garbage, timeout=5)
            assert err.value.code() == C.INTERNAL and "deserializ" in err.value.details().lower()
    assert snapshot() == before
    assert step(stub, "A", allocations=[("after", 1)])().allocated[0].host_page_ids  # still serving
    assert snapshot() != before  # (and the snapshot does see a change)
