"""Registers a decoder in Redis and keeps its heartbeat fresh so gateways can route to it.

Each beat writes one hash (load, free slots, running/waiting counts, residency mode counts,
draining flag: ``heartbeat_fields``) under ``Keys.decoder_heartbeat`` with a TTL of ``ttl_s``, and
each live request's state (``Keys.request``, listed in ``Keys.requests``) and residency summary
(``Keys.residency``), same TTL, removed at the first beat after the request is gone and by
``deregister``; a decoder that
stops beating disappears from gateways' view once the key expires. ``deregister`` removes it at
once (clean shutdown).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from services.decoder.service.engine_loop import LoopStats, queue_is_full
from services.metadata.keys import Keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderIdentity:
    decoder_id: str
    address: str  # host:port gateways dial
    model: str
    max_num_seqs: int
    max_num_waiting: int


def heartbeat_fields(identity: DecoderIdentity, stats: LoopStats) -> dict[str, str | int | float]:
    """The hash one beat writes. ``load`` is requests per batch seat (1.0 = every seat taken);
    ``saturated`` (0/1) means the queue is full (``queue_is_full``); ``num_<mode>`` counts live requests per
    residency mode."""
    num_live = stats.num_running + stats.num_waiting
    fields = {
        "decoder_id": identity.decoder_id,
        "address": identity.address,
        "model": identity.model,
        "num_running": stats.num_running,
        "num_waiting": stats.num_waiting,
        "max_num_seqs": identity.max_num_seqs,
        "max_num_waiting": identity.max_num_waiting,
        "num_free_slots": stats.num_free_slots,
        "num_total_slots": stats.num_total_slots,
        "load": num_live / identity.max_num_seqs,
        "saturated": int(queue_is_full(stats.num_running, stats.num_waiting, identity.max_num_seqs,
                                       identity.max_num_waiting)),
        "draining": int(stats.draining),
        "num_generated_tokens": stats.num_generated_tokens,
        "updated_unix_s": time.time(),
    }
    for mode, count in stats.residency_mode_counts.items():
        fields[f"num_{mode}"] = count
    return fields


class Heartbeat:
    def __init__(self, client: redis.Redis, identity: DecoderIdentity, stats: Callable[[], LoopStats],
                 interval_s: float = 1.0, ttl_s: float = 5.0, keys: Keys | None = None):
        self.client = client
        self.keys = keys or Keys()
        self.identity = identity
        self.stats = stats
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._summarised: set[str] = set()  # requests whose residency summary this decoder wrote

    def beat(self) -> dict:
        """Writes one heartbeat now. Mutates: the heartbeat key and the decoders set in Redis."""
        stats = self.stats()
        fields = heartbeat_fields(self.identity, stats)
        key = self.keys.decoder_heartbeat(self.identity.decoder_id)
        pipe = self.client.pipeline()
        pipe.sadd(self.keys.decoders(), self.identity.decoder_id)
        pipe.delete(key)  # fields of a mode that is gone must not linger
        pipe.hset(key, mapping=fields)
        pipe.pexpire(key, self.ttl_ms)
        # live requests' state and residency summary: refreshed (same TTL); gone ones removed now
        now = time.time()
        live = stats.request_summaries
        for request_id, summary in live.items():
            state = {k: summary[k] for k in ("state", "num_prompt_tokens", "num_output_tokens")}
            residency = {k: summary[k] for k in ("mode", "num_hot_pages", "num_host_pages", "num_committed_pages")}
            for key, mapping in ((self.keys.request(request_id), {**state, "owner_decoder": self.identity.decoder_id}),
                                 (self.keys.residency(request_id), {**residency, "decoder_id": self.identity.decoder_id})):
                pipe.hset(key, mapping={**mapping, "updated_unix_s": now})
                pipe.pexpire(key, self.ttl_ms)
        if live:
            pipe.sadd(self.keys.requests(), *live)
        self._forget(pipe, self._summarised - live.keys())
        pipe.execute()
        self._summarised = set(live)
        return fields

    def _forget(self, pipe, request_ids) -> None:
        for request_id in request_ids:
            pipe.delete(self.keys.request(request_id), self.keys.residency(request_id))
            pipe.srem(self.keys.requests(), request_id)

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except redis.RedisError as exc:  # Redis restarts: keep serving, beat again later
                log.warning("heartbeat failed: %s", exc)

    def stop(self, deregister: bool = True) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if deregister:
            try:
                self.deregister()
            except redis.RedisError as exc:
                log.warning("deregister failed: %s", exc)

    def deregister(self) -> None:
        """Removes this decoder from the registry and its requests' residency summaries."""
        pipe = self.client.pipeline()
        pipe.srem(self.keys.decoders(), self.identity.decoder_id)
        pipe.delete(self.keys.decoder_heartbeat(self.identity.decoder_id))
        self._forget(pipe, self._summarised)
        pipe.execute()
        self._summarised = set()
