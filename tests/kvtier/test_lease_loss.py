"""A decoder that outlives its kvtier lease (paused past the TTL: a long GC or VM pause, SIGSTOP)
must not write into the host pages kvtier took back: by then they may hold another request's KV.
Real kvtier process, the decoder's ``HostTier`` (no model).

**Before**, the thawed decoder copied its next sealed pages straight into its old host page ids
(another request's pages by then), and retried the commit/free of the reaped request forever.
Now a write-back first checks that the lease is surely live; when it may not be, it renews it,
learns that the lease was lost, takes a new one, and drops the requests kvtier no longer gives it
(``lost``: the engine aborts them) without touching their old pages."""

from __future__ import annotations

import gc
import time
import weakref

import torch

from services.decoder.kv.host_tier import HostTier
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.kvtier_client import KvLayout, KvtierClient

LAYOUT = KvLayout(torch.float32, num_layers=2, num_kv_heads=2, head_dim=4, page_size=4)  # tests/kvtier TINY
LEASE_TTL_S = 1.0


def test_a_decoder_paused_past_its_lease_writes_nothing_into_pages_it_lost(kvtier_process):
    kv = kvtier_process(host_pool_pages=4, lease_ttl_s=LEASE_TTL_S, reap_interval_s=0.1)
    pool = HotPool(LAYOUT.num_layers, 8, LAYOUT.page_size, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    pool.storage.normal_()
    a = HostTier(KvtierClient(kv.address, "A", "m", LAYOUT), pool)
    try:
        a.sync({"r": 2, "s": 1})
        a.write_back([("r", 0, 3)])  # a live lease: written, committed with the next call
        a.sync({"r": 2, "s": 1})
        old_pages = a.host_pages["r"] + a.host_pages["s"]
        a.client.stop_heartbeat()  # A is paused from here: nothing renews its lease
        with KvtierClient(kv.address, "B", "m", LAYOUT) as b:
            b.attach()
            b.start_heartbeat()  # B stays live
            deadline = time.monotonic() + 10
            while b.stats()["num_used_pages"] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert b.stats()["num_used_pages"] == 0  # A's lease ran out and kvtier freed its pages
            taken = b.allocate({"other": 4})["other"]  # every page, A's old ones among them
            assert set(old_pages) <= set(taken)
            b.host_pool.pool.fill_(7.0)  # B's KV
            before = b.host_pool.pool.clone()
            # A wakes up and carries on where it stopped: the page it sealed meanwhile
            a.write_back([("r", 1, 5)])
            assert torch.equal(b.host_pool.pool, before), "A wrote into pages kvtier had given to B"
            assert a.lost == {"r", "s"} and not a.host_pages and not a.num_sealed
            calls = a.num_step_calls
            a.sync({})  # nothing of r or s is pending: no commit or free is sent for them again
            assert a.num_step_calls == calls
            a.client.heartbeat()  # A works on under a new lease
            stats = b.stats(check_integrity=True)
            assert stats["integrity_ok"] and stats["num_requests"] == 1, stats  # B's only
            assert b.lookup(["other"])["other"].host_page_ids == taken
            assert stats["num_live_decoders"] == 2  # A holds a new lease
    finally:
        a.client.close()


def test_a_client_dropped_without_close_is_collected_and_its_heartbeat_stops(kvtier_process):
    """The heartbeat thread holds its client weakly: an engine dropped without ``close()`` must not
    keep its client (shared-memory mapping, channel) alive through the thread, and the lease lapses
    as a dead decoder's does. **Before**, the thread's closure held the client for ever."""
    kv = kvtier_process(host_pool_pages=4, lease_ttl_s=LEASE_TTL_S, reap_interval_s=0.1)
    client = KvtierClient(kv.address, "A", "m", LAYOUT)
    client.attach()
    client.start_heartbeat(interval_s=0.05)
    thread = client._heartbeat_thread
    ref = weakref.ref(client)
    del client
    gc.collect()
    assert ref() is None
    thread.join(timeout=5)
    assert not thread.is_alive()
