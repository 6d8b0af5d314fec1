"""KvtierService in-process over a real Redis: exact page ids, atomicity, leases, restart."""

from __future__ import annotations

import pytest

from services.kvtier.messages import AllocateItem as A
from services.kvtier.messages import CommitItem as C
from services.kvtier.messages import KvtierError, PageLayout
from services.metadata.keys import Keys
from tests.kvtier.conftest import TINY, Clock

LAYOUT = PageLayout(**TINY)


def snapshot(service) -> tuple:
    """Everything a call could change: allocator queue, page table, leases, the instance's Redis keys."""
    client = service._redis
    keys = sorted(client.scan_iter(match=Keys(service.config.namespace).kvtier_prefix(service.instance) + "*"))
    dump = {key: client.dump(key) for key in keys}
    table = sorted((e.request_id, e.owner, tuple(e.host_pages), e.num_committed, e.resumable)
                   for e in service.page_table.entries())
    return service.allocator.free_page_order(), table, service.leases.expiries(), dump


def test_step_hands_out_exact_ids_and_reuses_freed_pages_fifo(make_service):
    svc = make_service()
    svc.attach("d0", "m", LAYOUT)
    r = svc.allocate("d0", [A("r1", 3), A("r2", 2)])
    assert [(a.request_id, a.first_page_index, a.host_page_ids) for a in r.allocated] == [("r1", 0, [0, 1, 2]), ("r2", 0, [3, 4])]
    r = svc.step("d0", commits=[C("r1", 3)], free_request_ids=["r2"], allocations=[A("r1", 2), A("r3", 3)])
    # front of the queue (5, 6, 7) first, then the pages r2 freed in this very step, in order
    assert [(a.request_id, a.first_page_index, a.host_page_ids) for a in r.allocated] == [("r1", 3, [5, 6]), ("r3", 0, [7, 3, 4])]
    assert (r.num_freed_pages, r.num_free_host_pages) == (2, 0)
    assert svc.allocator.free_page_order() == []
    (r1,) = svc.lookup("d0", ["r1"])
    assert (r1.host_page_ids, r1.num_committed_pages, r1.owner_decoder_id) == ([0, 1, 2, 5, 6], 3, "d0")
    assert svc.stats().num_used_pages == 8 and svc.stats().num_committed_pages == 3
    assert svc.check_integrity()


def test_handshake_mismatch_is_failed_precondition_with_detail(make_service):
    svc = make_service()
    with pytest.raises(KvtierError) as err:
        svc.attach("d0", "m", PageLayout(**{**TINY, "head_dim": 8, "dtype": "bfloat16"}))
    assert err.value.code == "FAILED_PRECONDITION"
    assert "head_dim: decoder 8 != kvtier 4" in err.value.detail and "dtype" in err.value.detail
    assert not svc.leases.has("d0")
    svc.attach("d0", "model-a", LAYOUT)  # binds the model
    with pytest.raises(KvtierError, match="model mismatch") as err:
        svc.attach("d1", "model-b", LAYOUT)
    assert err.value.code == "FAILED_PRECONDITION"
    assert svc.check_integrity()


@pytest.mark.parametrize("call, code", [
    (lambda s: s.allocate("d0", [A("big", 5)]), "RESOURCE_EXHAUSTED"),
    (lambda s: s.step("d0", commits=[C("r1", 3)], allocations=[A("r9", 9)]), "RESOURCE_EXHAUSTED"),
    (lambda s: s.free("d0", ["r1", "nope"]), "NOT_FOUND"),
    (lambda s: s.commit("d0", [C("r1", 4)]), "FAILED_PRECONDITION"),  # beyond allocation
    (lambda s: s.commit("d0", [C("r1", 1)]), "FAILED_PRECONDITION"),  # decreasing
    (lambda s: s.commit("d1", [C("r1", 3)]), "FAILED_PRECONDITION"),  # not the owner
    (lambda s: s.allocate("ghost", [A("r5", 1)]), "NOT_FOUND"),  # no lease
    (lambda s: s.allocate("d0", [A("r5", 1), A("r5", 1)]), "INVALID_ARGUMENT"),
    (lambda s: s.allocate("d0", [A("bad:id", 1)]), "INVALID_ARGUMENT"),
    (lambda s: s.step("d0", free_request_ids=["r1"], allocations=[A("r1", 1)]), "INVALID_ARGUMENT"),
    (lambda s: s.lookup("d0", ["r1", "nope"]), "NOT_FOUND"),
    (lambda s: s.mark_resumable("d1", ["r1"]), "FAILED_PRECONDITION"),
    (lambda s: s.heartbeat("ghost"), "NOT_FOUND"),
])
def test_bad_requests_change_nothing(make_service, call, code):
    svc = make_service(host_pool_pages=8)
    svc.attach("d0", "m", LAYOUT)
    svc.attach("d1", "m", LAYOUT)
    svc.allocate("d0", [A("r1", 3), A("r2", 1)])
    svc.commit("d0", [C("r1", 2)])
    before = snapshot(svc)
    with pytest.raises(KvtierError) as err:
        call(svc)
    assert err.value.code == code and err.value.detail
    assert snapshot(svc) == before
    assert svc.check_integrity()


def test_expired_lease_frees_non_resumable_pages_only(make_service):
    clock = Clock()
    svc = make_service(clock=clock, lease_ttl_s=5.0)
    svc.attach("dead", "m", LAYOUT)
    svc.attach("alive", "m", LAYOUT)
    svc.allocate("dead", [A("gone", 2), A("kept", 2)])
    svc.allocate("alive", [A("other", 1)])
    svc.commit("dead", [C("kept", 2)])
    svc.mark_resumable("dead", ["kept"])
    clock.now += 4.0
    svc.heartbeat("alive")
    assert svc.reap_expired() == []
    clock.now += 1.5  # "dead" silent for 5.5 s > ttl; "alive" renewed 1.5 s ago
    assert svc.reap_expired() == ["gone"]
    assert svc.allocator.free_page_order() == [5, 6, 7, 0, 1]
    assert not svc.leases.has("dead") and svc.leases.has("alive")
    with pytest.raises(KvtierError, match="no lease"):
        svc.heartbeat("dead")
    # a new decoder claims the resumable request of the dead one
    svc.attach("heir", "m", LAYOUT)
    (kept,) = svc.lookup("heir", ["kept"], claim=True)
    assert (kept.host_page_ids, kept.num_committed_pages, kept.owner_decoder_id) == ([2, 3], 2, "heir")
    with pytest.raises(KvtierError, match="owned by live decoder") as err:
        svc.lookup("alive", ["kept"], claim=True)
    assert err.value.code == "FAILED_PRECONDITION"
    assert svc.check_integrity()


def test_detach_frees_the_decoders_non_resumable_requests(make_service):
    svc = make_service()
    svc.attach("d0", "m", LAYOUT)
    svc.allocate("d0", [A("a", 1), A("b", 2)])
    svc.mark_resumable("d0", ["b"])
    assert svc.detach("d0") == ["a"]
    assert svc.page_table.get("b") is not None and svc.page_table.get("a") is None
    assert svc.allocator.num_used_pages == 2 and svc.check_integrity()


def test_restart_recovers_page_table_leases_and_allocator(make_service):
    clock = Clock()
    svc = make_service(clock=clock)
    svc.attach("d0", "m", LAYOUT)
    svc.allocate("d0", [A("r1", 3), A("r2", 2)])
    svc.step("d0", commits=[C("r1", 2)], free_request_ids=["r2"], allocations=[A("r3", 1)])
    table_before = snapshot(svc)[1]
    svc.shutdown(remove=False)  # as if killed: segment and keys stay
    clock.now += 100.0  # kvtier was down longer than the TTL: decoders get a grace period
    again = make_service(clock=clock)
    assert again.recovered
    assert snapshot(again)[1] == table_before
    assert again.allocator.free_page_order() == [3, 4, 6, 7]  # unused pages, ascending
    assert again.reap_expired() == [] and again.heartbeat("d0") == clock.now + 5.0
    with pytest.raises(KvtierError, match="model mismatch"):
        again.attach("d1", "other-model", LAYOUT)  # the bound model id survived too
    assert again.check_integrity()


def test_restart_with_another_layout_is_refused(make_service):
    svc = make_service()
    svc.shutdown(remove=False)
    with pytest.raises(RuntimeError, match="exists with layout"):
        make_service(head_dim=8)
    make_service().shutdown(remove=True)  # the original layout re-attaches; then clean up


def test_one_process_per_instance(make_service):
    make_service()
    with pytest.raises(RuntimeError, match="already served"):
        make_service()


def test_resumable_requests_nobody_claims_are_freed_after_their_ttl(make_service):
    """A dead decoder's resumable request waits ``resumable_ttl_s`` after the lease ended for a
    claim, then is freed: no page is held for ever by a request nobody resumes. A claimed one stays."""
    clock = Clock()
    svc = make_service(clock=clock, lease_ttl_s=5.0, resumable_ttl_s=30.0)
    svc.attach("dead", "m", LAYOUT)
    svc.allocate("dead", [A("orphan", 2), A("claimed", 1), A("plain", 1)])
    svc.mark_resumable("dead", ["orphan", "claimed"])
    clock.now += 6.0
    assert svc.reap_expired() == ["plain"]  # the lease ended at t = 6: the wait starts
    clock.now += 10.0
    svc.attach("heir", "m", LAYOUT)
    svc.lookup("heir", ["claimed"], claim=True)
    clock.now += 19.0  # 29 s after the lease ended
    svc.heartbeat("heir")
    assert svc.reap_expired() == []
    clock.now += 1.0
    assert svc.reap_expired() == ["orphan"]
    assert svc.page_table.get("orphan") is None and svc.page_table.get("claimed").owner == "heir"
    assert svc.allocator.num_used_pages == 1 and svc.check_integrity()
    # the heir dies too: its claimed request starts a fresh wait from its own lease's end
    clock.now += 6.0
    assert svc.reap_expired() == []
    clock.now += 29.0
    assert svc.reap_expired() == []
    clock.now += 1.0
    assert svc.reap_expired() == ["claimed"] and svc.allocator.num_used_pages == 0


def test_after_a_restart_orphans_wait_a_full_ttl_again(make_service):
    clock = Clock()
    svc = make_service(clock=clock, lease_ttl_s=5.0, resumable_ttl_s=30.0)
    svc.attach("d0", "m", LAYOUT)
    svc.allocate("d0", [A("r", 2)])
    svc.mark_resumable("d0", ["r"])
    svc.detach("d0")  # a drain hand-off: the lease ends, the resumable request stays
    clock.now += 25.0
    svc.shutdown(remove=False)
    again = make_service(clock=clock, lease_ttl_s=5.0, resumable_ttl_s=30.0)
    clock.now += 29.0  # 54 s after the detach, 29 s after the restart
    assert again.reap_expired() == [] and again.page_table.get("r") is not None
    clock.now += 1.0
    assert again.reap_expired() == ["r"] and again.check_integrity()
