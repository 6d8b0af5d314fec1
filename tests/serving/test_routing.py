"""Decoder choice (pure) and the Redis registry fed by real decoder heartbeats (embedded Redis)."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.decoder.service.engine_loop import LoopStats
from services.decoder.service.heartbeat import DecoderIdentity, Heartbeat, heartbeat_fields
from services.gateway.errors import APIError
from services.gateway.routing import DecoderRegistry, DecoderView, choose_decoder
from services.metadata.keys import Keys


def view(name, running=0, waiting=0, **kw):
    return DecoderView(decoder_id=name, address=f"{name}:1", model="m", num_running=running, num_waiting=waiting,
                       max_num_seqs=4, max_num_waiting=2, num_free_slots=kw.pop("free", 10), **kw)


def test_least_loaded_wins_and_ties_go_to_free_slots():
    decoders = [view("a", running=3), view("b", running=1), view("c", running=1, free=50)]
    assert choose_decoder(decoders, {}).decoder_id == "c"
    # this gateway's own in-flight requests count when the heartbeat lags behind
    assert choose_decoder(decoders, {"c:1": 4}).decoder_id == "b"


def test_draining_wrong_model_and_excluded_are_skipped():
    decoders = [view("a", draining=True), view("b"), DecoderView("c", "c:1", model="other", max_num_seqs=4)]
    assert choose_decoder(decoders, {}, model="m").decoder_id == "b"
    with pytest.raises(APIError) as exc_info:
        choose_decoder(decoders, {}, model="m", exclude=frozenset({"b:1"}))
    assert exc_info.value.status == 503


def test_no_decoder_is_503_and_all_saturated_is_429():
    with pytest.raises(APIError) as exc_info:
        choose_decoder([], {})
    assert exc_info.value.status == 503 and exc_info.value.body()["error"]["code"] == "no_decoder_available"
    with pytest.raises(APIError) as exc_info:
        choose_decoder([view("a", saturated=True), view("b", running=4, waiting=2)], {}, retry_after_s=3)
    assert exc_info.value.status == 429 and exc_info.value.headers == {"Retry-After": "3"}


@pytest.fixture
def redis_server(tmp_path):
    from services.metadata.redis_server import RedisServer

    server = RedisServer(directory=tmp_path / "r").start()
    yield server
    server.stop()


def test_registry_sees_heartbeats_until_they_expire(redis_server):
    import redis.asyncio as aioredis

    keys = Keys("routingtest")
    stats = LoopStats(num_running=2, num_waiting=1, num_free_slots=7, num_total_slots=9,
                      residency_mode_counts={"full": 3, "sparse": 0})
    # 2 seats, both taken, and the 1 waiting place taken: saturated (1 seat fewer would not be)
    beat = Heartbeat(redis_server.client(), DecoderIdentity("d1", "h:5", "m", 2, 1), lambda: stats,
                     interval_s=10, ttl_s=0.3, keys=keys)
    assert heartbeat_fields(DecoderIdentity("d1", "h:5", "m", 3, 1), stats)["saturated"] == 0
    fields = beat.beat()
    assert fields["saturated"] == 1 and fields["load"] == 1.5

    async def read():
        client = aioredis.Redis.from_url(redis_server.url)
        try:
            return await DecoderRegistry(client, refresh_s=0, keys=keys).decoders()
        finally:
            await client.aclose()

    [seen] = asyncio.run(read())
    assert (seen.decoder_id, seen.address, seen.num_running, seen.num_waiting, seen.saturated) == ("d1", "h:5", 2, 1,
                                                                                                   True)
    assert seen.residency_mode_counts == {"full": 3, "sparse": 0}
    time.sleep(0.5)  # the TTL passes without a beat: the decoder is gone, and dropped from the set
    assert asyncio.run(read()) == []
    assert redis_server.client().smembers(keys.decoders()) == set()
    beat.beat()
    beat.deregister()
    assert asyncio.run(read()) == []


def test_heartbeat_keeps_live_request_state_and_residency_and_removes_gone_ones(redis_server):
    keys = Keys("residencytest")
    client = redis_server.client()
    base = {"state": "running", "num_prompt_tokens": 640, "num_output_tokens": 5}
    summaries = {"a": {**base, "mode": "sparse", "num_hot_pages": 7, "num_host_pages": 40, "num_committed_pages": 38},
                 "b": {**base, "mode": "full", "num_hot_pages": 3, "num_host_pages": 3, "num_committed_pages": 2}}
    stats = LoopStats(request_summaries=summaries)
    beat = Heartbeat(client, DecoderIdentity("d1", "h:5", "m", 4, 1), lambda: stats, interval_s=10, ttl_s=5, keys=keys)
    beat.beat()

    def hash_of(key):
        return {k.decode(): v.decode() for k, v in client.hgetall(key).items()}

    res, req = hash_of(keys.residency("a")), hash_of(keys.request("a"))
    assert (res["mode"], res["num_hot_pages"], res["num_host_pages"], res["decoder_id"]) == ("sparse", "7", "40", "d1")
    assert (req["state"], req["owner_decoder"], req["num_prompt_tokens"]) == ("running", "d1", "640")
    assert client.smembers(keys.requests()) == {b"a", b"b"}
    assert 0 < client.pttl(keys.residency("a")) <= 5000 and 0 < client.pttl(keys.request("a")) <= 5000
    stats.request_summaries = {"b": summaries["b"]}  # a finished
    beat.beat()
    assert not client.exists(keys.residency("a"), keys.request("a")) and client.smembers(keys.requests()) == {b"b"}
    beat.deregister()  # clean shutdown: no key of any of its requests is left
    assert not client.exists(keys.residency("b"), keys.request("b"), keys.requests())
