"""kvtier as a real process (``python -m services.kvtier``) over a real Redis, driven by the
decoder's KvtierClient: bytes through shared memory, gRPC statuses, leases, kill -9, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import torch

from kernels.gather_pages.api import gather_pages
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.kvtier_client import KvLayout, KvtierClient, KvtierClientError
from services.metadata.keys import Keys
from tests.kvtier.conftest import ROOT, TINY

LAYOUT = KvLayout(torch.float32, TINY["num_layers"], TINY["num_kv_heads"], TINY["head_dim"], TINY["page_size"])


def random_hot_pool(num_slots: int, seed: int) -> HotPool:
    """A hot pool full of random bit patterns (NaN payloads included: copies must move bits)."""
    pool = HotPool(LAYOUT.num_layers, num_slots, LAYOUT.page_size, LAYOUT.num_kv_heads, LAYOUT.head_dim)
    gen = torch.Generator().manual_seed(seed)
    for t in pool.k + pool.v:
        t.view(torch.int32).copy_(torch.randint(-2**31, 2**31 - 1, t.shape, generator=gen, dtype=torch.int32))
    return pool


def write_back(client: KvtierClient, hot: HotPool, slots: list[int], host_pages: list[int]) -> None:
    src, dst = torch.tensor(slots), torch.tensor(host_pages)
    for layer in range(LAYOUT.num_layers):
        host_k, host_v = client.host_pages(layer)
        gather_pages(hot.k[layer], host_k, src, dst)
        gather_pages(hot.v[layer], host_v, src, dst)


def fetch(client: KvtierClient, hot: HotPool, host_pages: list[int], slots: list[int]) -> None:
    src, dst = torch.tensor(host_pages), torch.tensor(slots)
    for layer in range(LAYOUT.num_layers):
        host_k, host_v = client.host_pages(layer)
        gather_pages(host_k, hot.k[layer], src, dst)
        gather_pages(host_v, hot.v[layer], src, dst)


def same_bits(a: HotPool, a_slots: list[int], b: HotPool, b_slots: list[int]) -> bool:
    return all(
        torch.equal(x[layer][a_slots].view(torch.int32), y[layer][b_slots].view(torch.int32))
        for layer in range(LAYOUT.num_layers) for x, y in ((a.k, b.k), (a.v, b.v))
    )


def assert_integrity(client: KvtierClient) -> dict:
    stats = client.stats(check_integrity=True)
    assert stats["integrity_checked"] and stats["integrity_ok"], stats["integrity_detail"]
    return stats


def test_page_round_trip_through_shared_memory_is_byte_exact(kvtier_process):
    kv = kvtier_process()
    hot = random_hot_pool(num_slots=6, seed=1)
    # the reader is a second client of the same decoder (as after a restart): only the owner learns page ids
    with KvtierClient(kv.address, "d0", "m", LAYOUT) as writer, KvtierClient(kv.address, "d0", "m", LAYOUT) as reader:
        writer.attach()
        pages = writer.step(allocations={"r1": 4, "r2": 1}).allocated
        assert pages == {"r1": [0, 1, 2, 3], "r2": [4]}
        write_back(writer, hot, slots=[5, 0, 3, 1], host_pages=pages["r1"])
        writer.step(commits={"r1": 4}, allocations={"r2": 1})
        reader.attach()
        found = reader.lookup(["r1"])["r1"]
        assert (found.host_page_ids, found.num_committed_pages, found.owner_decoder_id) == ([0, 1, 2, 3], 4, "d0")
        other = HotPool(LAYOUT.num_layers, 4, LAYOUT.page_size, LAYOUT.num_kv_heads, LAYOUT.head_dim)
        fetch(reader, other, found.host_page_ids, slots=[0, 1, 2, 3])
        assert same_bits(hot, [5, 0, 3, 1], other, [0, 1, 2, 3])
        # the layer views are strided views of one mapping: page p of layer l is bytes
        # [p*host_page_bytes + l*layer_stride + kv*kv_stride, +kv_stride) of the segment
        info = reader.attach_info
        raw = Path(f"/dev/shm/{info.segment_name}").read_bytes()
        start = 2 * info.host_page_bytes + 1 * info.layer_stride_bytes + 1 * info.kv_stride_bytes
        assert raw[start : start + info.kv_stride_bytes] == hot.v[1][3].numpy().tobytes()
        stats = assert_integrity(reader)
        assert (stats["num_used_pages"], stats["num_committed_pages"], stats["num_requests"]) == (6, 4, 2)


def test_grpc_statuses_carry_details_and_change_nothing(kvtier_process):
    kv = kvtier_process(host_pool_pages=4)
    with KvtierClient(kv.address, "d0", "m", LAYOUT) as client:
        wrong = KvtierClient(kv.address, "dx", "m", KvLayout(torch.bfloat16, 2, 2, 4, 4))
        with pytest.raises(KvtierClientError) as err:
            wrong.attach()
        wrong.close()
        assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION and "dtype: decoder 'bfloat16'" in err.value.detail
        client.attach()
        client.allocate({"r1": 3})
        before = client.stats()
        cases = [
            (lambda: client.allocate({"r2": 2}), grpc.StatusCode.RESOURCE_EXHAUSTED, "asked for 2 host pages, 1 free"),
            (lambda: client.free(["nope"]), grpc.StatusCode.NOT_FOUND, "'nope'"),
            (lambda: client.commit({"r1": 9}), grpc.StatusCode.FAILED_PRECONDITION, "allocated"),
            (lambda: client.allocate({"a b": 1}), grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
            (lambda: client.lookup(["nope"]), grpc.StatusCode.NOT_FOUND, "no host pages"),
        ]
        for call, code, detail in cases:
            with pytest.raises(KvtierClientError) as err:
                call()
            assert err.value.code == code and detail in err.value.detail
            assert client.stats() == before
        assert client.lookup(["r1"])["r1"].host_page_ids == [0, 1, 2]
        assert_integrity(client)


def test_lease_expiry_reclaims_a_dead_decoders_pages_but_not_resumable_ones(kvtier_process):
    kv = kvtier_process(lease_ttl_s=0.8, reap_interval_s=0.05)
    with KvtierClient(kv.address, "dead", "m", LAYOUT) as dead, KvtierClient(kv.address, "alive", "m", LAYOUT) as alive:
        dead.attach()
        alive.attach()
        alive.start_heartbeat(interval_s=0.1)
        dead.allocate({"gone": 2, "kept": 3})
        dead.commit({"kept": 3})
        dead.mark_resumable(["kept"])
        alive.allocate({"mine": 1})
        deadline = time.monotonic() + 10
        while alive.stats()["num_used_pages"] != 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = assert_integrity(alive)
        assert (stats["num_used_pages"], stats["num_requests"], stats["num_live_decoders"]) == (4, 2, 1)
        with pytest.raises(KvtierClientError) as err:
            dead.heartbeat()
        assert err.value.code == grpc.StatusCode.NOT_FOUND
        kept = alive.lookup(["kept"], claim=True)["kept"]
        assert (kept.host_page_ids, kept.num_committed_pages, kept.owner_decoder_id) == ([2, 3, 4], 3, "alive")
        assert alive.allocate({"next": 2})["next"] == [6, 7]  # FIFO: the reclaimed 0, 1 went to the back


def test_kill9_then_restart_reattaches_with_every_committed_page_intact(kvtier_process, redis_server, namespace):
    kv = kvtier_process(instance="crash")
    hot = random_hot_pool(num_slots=5, seed=2)
    with KvtierClient(kv.address, "d0", "m", LAYOUT) as client:
        client.attach()
        pages = client.allocate({"r1": 3, "r2": 2})
        write_back(client, hot, [0, 1, 2, 3, 4], pages["r1"] + pages["r2"])
        client.step(commits={"r1": 3, "r2": 1}, frees=[], allocations={"r3": 1})
        kv.kill9()
        assert os.path.exists(f"/dev/shm/{kv.segment_name}")
        with pytest.raises(KvtierClientError) as err:
            client.heartbeat()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
    again = kvtier_process(instance="crash")
    assert again.state == "re-attached"
    with KvtierClient(again.address, "d0", "m", LAYOUT) as client:
        view = client.attach()
        assert client.attach() is view  # same segment: the mapping is kept
        found = client.lookup(["r1", "r2", "r3"])
        assert [(f.host_page_ids, f.num_committed_pages) for f in found.values()] == [([0, 1, 2], 3), ([3, 4], 1), ([5], 0)]
        back = HotPool(LAYOUT.num_layers, 4, LAYOUT.page_size, LAYOUT.num_kv_heads, LAYOUT.head_dim)
        fetch(client, back, [0, 1, 2, 3], [0, 1, 2, 3])
        assert same_bits(hot, [0, 1, 2, 3], back, [0, 1, 2, 3])
        assert client.allocate({"r4": 2})["r4"] == [6, 7]  # no page handed out twice
        assert_integrity(client)
        assert again.terminate() == 0
        # a clean stop removed everything: a kvtier on the same port makes a new segment, and
        # the same client re-attaching maps the new one
        fresh = kvtier_process(instance="crash", port=again.address.rsplit(":", 1)[1])
        assert fresh.state == "created"
        assert client.attach() is not view
        with pytest.raises(KvtierClientError) as err:
            client.lookup(["r1"])
        assert err.value.code == grpc.StatusCode.NOT_FOUND
    assert fresh.terminate() == 0
    assert not os.path.exists(f"/dev/shm/{again.segment_name}")
    assert list(redis_server.client().scan_iter(match=Keys(namespace).kvtier_prefix("crash") + "*")) == []


@pytest.mark.parametrize("via_cli", [False, True], ids=["python-m-sigterm", "dhisparse-cli-sigint"])
def test_clean_shutdown_leaves_no_segment_and_no_key(kvtier_process, redis_server, namespace, via_cli):
    if via_cli:
        from tests.kvtier.conftest import KvtierProcess

        kv = KvtierProcess(redis_server.url, namespace, instance="cli")
        kv.args[:3] = [sys.executable, "-m", "dhisparse", "kvtier"]
        kv.start()
    else:
        kv = kvtier_process(instance="clean")
    with KvtierClient(kv.address, "d0", "m", LAYOUT) as client:
        client.attach()
        client.allocate({"r1": 2})
        client.mark_resumable(["r1"])
        assert os.path.exists(f"/dev/shm/{kv.segment_name}")
    assert kv.terminate(signal.SIGINT if via_cli else signal.SIGTERM) == 0
    assert not os.path.exists(f"/dev/shm/{kv.segment_name}")
    assert list(redis_server.client().scan_iter(match=f"{namespace}:*")) == []


def test_module_entry_point_help_runs():
    out = subprocess.run([sys.executable, "-m", "services.kvtier", "--help"], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert "--host-pool-gib" in out.stdout


def test_embedded_redis_survives_kill9_and_goes_with_a_clean_stop(tmp_path, namespace):
    """Without --redis-url kvtier runs its own Redis in --redis-dir; a kill -9 leaves it (and the
    segment) for the restart, which re-attaches; a clean stop takes both down."""
    from services.metadata.redis_server import RedisServer
    from tests.kvtier.conftest import KvtierProcess

    redis_dir = tmp_path / "r"
    kv = KvtierProcess("", namespace, instance="emb", redis_dir=str(redis_dir))
    kv.args.remove("--redis-url")
    kv.args.remove("")
    kv.start()
    try:
        with KvtierClient(kv.address, "d0", "m", LAYOUT) as client:
            client.attach()
            client.allocate({"r1": 2})
        kv.kill9()
        assert RedisServer(directory=redis_dir).ping()
        kv.start()
        assert kv.state == "re-attached"
        with KvtierClient(kv.address, "d0", "m", LAYOUT) as client:
            try:
                client.attach()
            except KvtierClientError as exc:  # seen once under CI load: keep what kvtier said
                pytest.fail(f"{exc}; kvtier {kv.address} exit code {kv.proc.poll()}; its log:\n{kv.read_log()}")
            assert client.lookup(["r1"])["r1"].host_page_ids == [0, 1]
        assert kv.terminate() == 0
        assert not RedisServer(directory=redis_dir).ping()
        assert not os.path.exists(f"/dev/shm/{kv.segment_name}")
    finally:
        kv.cleanup()
        RedisServer(directory=redis_dir).stop()
