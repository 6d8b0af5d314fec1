"""Which decoder serves the next request: the least-loaded healthy one from the Redis heartbeats.

``choose_decoder`` is the pure rule; ``DecoderRegistry`` reads the heartbeats (or a static list)
and caches the read for ``refresh_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from services.gateway.errors import (
    APIError,
    no_decoder,
    registry_unavailable,
    saturated,
)
from services.metadata.keys import Keys


@dataclass(frozen=True)
class DecoderView:
    """One decoder as its last heartbeat describes it."""

    decoder_id: str
    address: str
    model: str = ""
    num_running: int = 0
    num_waiting: int = 0
    max_num_seqs: int = 1
    max_num_waiting: int = 1
    num_free_slots: int = 0
    num_total_slots: int = 0
    saturated: bool = False
    draining: bool = False
    residency_mode_counts: dict = field(default_factory=dict, compare=False)

    @classmethod
    def from_heartbeat(cls, fields: dict) -> DecoderView:
        """From the heartbeat hash (bytes or str keys and values, as Redis returns them)."""
        text = {_str(k): _str(v) for k, v in fields.items()}
        kwargs = {}
        for name, f in cls.__dataclass_fields__.items():
            if name in text:
                kwargs[name] = int(float(text[name])) if f.type in ("int", "bool") else text[name]
        kwargs["saturated"] = bool(kwargs.get("saturated", 0))
        kwargs["draining"] = bool(kwargs.get("draining", 0))
        kwargs["residency_mode_counts"] = {k[4:]: int(v) for k, v in text.items()
                                           if k in ("num_full", "num_sparse")}
        return cls(**kwargs)


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def choose_decoder(decoders: list[DecoderView], in_flight: dict[str, int], model: str | None = None,
                   exclude: frozenset[str] = frozenset(), retry_after_s: int = 1) -> DecoderView:
    """The decoder with the lowest load, where load counts the heartbeat's running + waiting
    requests or, if larger, this gateway's own in-flight requests to it (heartbeats lag), per
    batch seat. Ties go to the most free slots. Raises 503 when no decoder is alive (not draining,
    right model, not excluded) and 429 when every live one is saturated."""
    live = [d for d in decoders if not d.draining and d.address not in exclude and (not model or not d.model
                                                                                    or d.model == model)]
    if not live:
        raise no_decoder()

    def queue_len(d: DecoderView) -> int:
        return max(d.num_running + d.num_waiting, in_flight.get(d.address, 0))

    open_ = [d for d in live if not d.saturated and queue_len(d) < d.max_num_seqs + d.max_num_waiting]
    if not open_:
        raise saturated(retry_after_s)
    return min(open_, key=lambda d: (queue_len(d) / max(d.max_num_seqs, 1), -d.num_free_slots, d.decoder_id))


class DecoderRegistry:
    """Live decoders, from Redis heartbeats (``redis_url``) or a static address list."""

    def __init__(self, redis_client=None, static_addresses: list[str] | None = None, refresh_s: float = 0.25,
                 keys: Keys | None = None):
        self.redis = redis_client
        self.keys = keys or Keys()
        self.static = [DecoderView(decoder_id=a, address=a, max_num_seqs=32, max_num_waiting=64)
                       for a in static_addresses or []]
        self.refresh_s = refresh_s
        self._cached: list[DecoderView] = []
        self._cached_at = float("-inf")

    async def decoders(self) -> list[DecoderView]:
        if self.redis is None:
            return self.static
        if time.monotonic() - self._cached_at < self.refresh_s:
            return self._cached
        try:
            return await self._read()
        except (redis.RedisError, OSError) as exc:  # Redis down or restarting: 503 until it is back
            raise registry_unavailable(type(exc).__name__) from exc

    async def _read(self) -> list[DecoderView]:
        ids = sorted(_str(m) for m in await self.redis.smembers(self.keys.decoders()))
        views = []
        if ids:
            pipe = self.redis.pipeline(transaction=False)
            for decoder_id in ids:
                pipe.hgetall(self.keys.decoder_heartbeat(decoder_id))
            hashes = await pipe.execute()
            dead = [i for i, h in zip(ids, hashes) if not h]
            if dead:  # expired heartbeats: the decoder is gone
                await self.redis.srem(self.keys.decoders(), *dead)
            views = [DecoderView.from_heartbeat(h) for h in hashes if h]
        self._cached, self._cached_at = views, time.monotonic()
        return views

    def last_seen(self) -> list[DecoderView]:
        """The most recent read, without touching Redis (for metrics)."""
        return self.static if self.redis is None else self._cached

    def invalidate(self) -> None:
        self._cached_at = float("-inf")


__all__ = ["APIError", "DecoderRegistry", "DecoderView", "choose_decoder"]
