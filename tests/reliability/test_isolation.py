"""Isolation: a decoder can never learn, read through kvtier, or take over another decoder's pages.

kvtier hands host page ids out only to the request's owner; with the page ids a decoder reads the
bytes in the shared pool it maps. So the attack is to get a foreign request's page ids or to get
kvtier to move a foreign request's bytes: Lookup (with and without claim), WriteBack, allocation
under a foreign request id. Each is tried by decoder B against decoder A's requests on a real
kvtier process, through the raw stub, and is refused without a page id in the answer. Taking a
request over (claim) is possible only for a *resumable* request whose owner's lease is gone (the
decoder-restart path), never for a live decoder's request or a dead decoder's non-resumable one.
"""

from __future__ import annotations

import grpc
import pytest

from services.kvtier.messages import AllocateItem, KvtierError, PageLayout
from services.rpc import kvtier_pb2 as pb
from services.rpc import kvtier_pb2_grpc as pb_grpc
from tests.kvtier.conftest import TINY, Clock
from tests.reliability.internal_tls import status_of

LAYOUT = pb.PageLayout(dtype="float32", num_layers=TINY["num_layers"], num_kv_heads=TINY["num_kv_heads"],
                       head_dim=TINY["head_dim"], page_size=TINY["page_size"])
C = grpc.StatusCode


def test_decoder_b_never_gets_decoder_a_page_ids(kvtier_process):
    proc = kvtier_process(instance="iso", host_pool_pages=16)
    with grpc.insecure_channel(proc.address) as channel:
        stub = pb_grpc.KvtierStub(channel)
        for decoder in ("A", "B"):
            stub.Attach(pb.AttachRequest(decoder_id=decoder, model_id="m", layout=LAYOUT), timeout=10)
        a_pages = stub.Allocate(pb.AllocateRequest(decoder_id="A", allocations=[
            pb.AllocateItem(request_id="secret", num_pages=3)]), timeout=5).allocated[0].host_page_ids
        stub.Commit(pb.CommitRequest(decoder_id="A", commits=[pb.CommitItem(request_id="secret",
                                                                            num_committed_pages=3)]), timeout=5)
        b_pages = stub.Allocate(pb.AllocateRequest(decoder_id="B", allocations=[
            pb.AllocateItem(request_id="mine", num_pages=2)]), timeout=5).allocated[0].host_page_ids
        assert not set(a_pages) & set(b_pages)  # kvtier never hands one page to two requests
        # the owner sees its own request's pages
        (own,) = stub.Lookup(pb.LookupRequest(decoder_id="A", request_ids=["secret"]), timeout=5).requests
        assert list(own.host_page_ids) == list(a_pages)

        def lookup(decoder_id, ids, claim=False):
            return lambda: stub.Lookup(pb.LookupRequest(decoder_id=decoder_id, request_ids=ids, claim=claim), timeout=5)

        attempts = [
            ("B looks up A's request", lookup("B", ["secret"]), C.FAILED_PRECONDITION, "owned by decoder 'A'"),
            ("B hides it among its own", lookup("B", ["mine", "secret"]), C.FAILED_PRECONDITION, "owned by decoder 'A'"),
            ("B claims it while A is live", lookup("B", ["secret"], claim=True), C.FAILED_PRECONDITION,
             "owned by live decoder 'A'"),
            ("no decoder id", lookup("", ["secret"]), C.INVALID_ARGUMENT, "decoder_id"),
            ("a decoder that never attached", lookup("C", ["secret"]), C.NOT_FOUND, "holds no lease"),
            ("B asks kvtier to copy A's pages (write-back)", lambda: stub.WriteBack(pb.WriteBackRequest(
                decoder_id="B", items=[pb.WriteBackItem(request_id="secret", page_index=0, slot=0)]), timeout=5),
             C.FAILED_PRECONDITION, "owned by decoder 'A'"),
            ("B grows A's request to get pages under its id", lambda: stub.Allocate(pb.AllocateRequest(
                decoder_id="B", allocations=[pb.AllocateItem(request_id="secret", num_pages=1)]), timeout=5),
             C.FAILED_PRECONDITION, "owned by decoder 'A'"),
        ]
        for name, call, code, detail in attempts:
            got, details = status_of(call)
            assert (got, detail in details) == (code, True), (name, got, details)
            assert str(list(a_pages)) not in details
        # nothing moved: A still owns its pages and commits
        (again,) = stub.Lookup(pb.LookupRequest(decoder_id="A", request_ids=["secret"]), timeout=5).requests
        assert (list(again.host_page_ids), again.num_committed_pages, again.owner_decoder_id) == (list(a_pages), 3, "A")
        stats = stub.Stats(pb.StatsRequest(check_integrity=True), timeout=5)
        assert stats.integrity_ok and stats.num_used_pages == 5


def test_only_a_dead_decoders_resumable_request_can_be_claimed(make_service):
    clock = Clock()
    svc = make_service(clock=clock, lease_ttl_s=5.0)
    layout = PageLayout(**TINY)
    for decoder in ("A", "B"):
        svc.attach(decoder, "m", layout)
    svc.allocate("A", [AllocateItem("plain", 1), AllocateItem("resumable", 2)])
    svc.mark_resumable("A", ["resumable"])
    with pytest.raises(KvtierError, match="owned by live decoder 'A'"):
        svc.lookup("B", ["resumable"], claim=True)
    clock.now += 6.0  # A's lease runs out; B's is renewed; the reaper has not run yet
    svc.heartbeat("B")
    with pytest.raises(KvtierError, match="'plain' of decoder 'A' is not resumable") as err:
        svc.lookup("B", ["plain"], claim=True)  # pages about to be reclaimed are not up for grabs
    assert err.value.code == "FAILED_PRECONDITION"
    with pytest.raises(KvtierError, match="owned by decoder 'A'"):
        svc.lookup("B", ["resumable"])  # looking without claiming is still refused
    (taken,) = svc.lookup("B", ["resumable"], claim=True)  # the decoder-restart path
    assert taken.owner_decoder_id == "B" and len(taken.host_page_ids) == 2
    svc.attach("A", "m", layout)  # A comes back: the request is B's now
    with pytest.raises(KvtierError, match="owned by decoder 'B'"):
        svc.lookup("A", ["resumable"])
    assert svc.check_integrity()
