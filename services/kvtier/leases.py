"""Decoder leases: a decoder holds its requests' host pages while it keeps heartbeating.

A lease expires ``ttl_s`` after its last renewal (attach, heartbeat or step). Expired leases are
found by ``expired()``; the service then frees the decoder's non-resumable requests. Which
decoders hold a lease is persisted in Redis (hash ``leases``: decoder id -> expiry in wall-clock
unix seconds, written when the lease is created) so that a restarted kvtier knows them. Since
decoders cannot renew while kvtier is down, ``grant_grace()`` after a restart gives every lease a
full TTL from now; persisted expiries are therefore never used for reaping, and renewals of an
existing lease stay in memory (no Redis round trip per heartbeat or step).
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from services.metadata.keys import Keys


class Leases:
    def __init__(self, client: redis.Redis, keys: Keys, instance: str, ttl_s: float, clock: Callable[[], float]):
        self._redis = client
        self._key = keys.kvtier_leases(instance)
        self.ttl_s = ttl_s
        self._clock = clock
        self._expiry: dict[str, float] = {}  # decoder id -> unix seconds

    def renew(self, decoder_id: str) -> float:
        """Creates or extends ``decoder_id``'s lease to now + ttl; returns the expiry. Mutates:
        the lease (a new one in Redis first, then memory)."""
        expiry = self._clock() + self.ttl_s
        if decoder_id not in self._expiry:
            self._redis.hset(self._key, decoder_id, repr(expiry))
        self._expiry[decoder_id] = expiry
        return expiry

    def drop(self, decoder_id: str) -> None:
        self._redis.hdel(self._key, decoder_id)
        self._expiry.pop(decoder_id, None)

    def has(self, decoder_id: str) -> bool:
        return decoder_id in self._expiry

    def is_live(self, decoder_id: str) -> bool:
        expiry = self._expiry.get(decoder_id)
        return expiry is not None and expiry > self._clock()

    def expiry(self, decoder_id: str) -> float | None:
        return self._expiry.get(decoder_id)

    def expiries(self) -> dict[str, float]:
        """A copy of every lease: decoder id -> expiry (unix s)."""
        return dict(self._expiry)

    def expired(self) -> list[str]:
        """Decoders whose lease has run out, earliest first. Mutates nothing."""
        now = self._clock()
        return [d for d, e in sorted(self._expiry.items(), key=lambda kv: kv[1]) if e <= now]

    @property
    def num_live(self) -> int:
        now = self._clock()
        return sum(1 for e in self._expiry.values() if e > now)

    def load(self) -> None:
        self._expiry = {d.decode(): float(e) for d, e in self._redis.hgetall(self._key).items()}

    def grant_grace(self) -> None:
        """After a restart: every known lease runs a full TTL from now."""
        expiry = self._clock() + self.ttl_s
        self._expiry = dict.fromkeys(self._expiry, expiry)
