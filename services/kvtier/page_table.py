"""kvtier's page table: per request, its host pages in logical order and their state.

The table lives in memory and in Redis (keys from ``services.metadata.keys``): every change is
written to Redis in one MULTI/EXEC transaction *before* it is applied in memory, so a kvtier that
is killed at any point restarts with a table that matches what it last acknowledged.
Redis form per request: hash ``pt:{rid}`` (owner, num_committed, resumable) and list
``pt:{rid}:pages`` (host page ids, appended as the request grows), plus the set ``reqs``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from services.metadata.keys import Keys


@dataclass
class RequestPages:
    request_id: str
    owner: str  # decoder id
    host_pages: list[int] = field(default_factory=list)  # logical page i -> host page id
    num_committed: int = 0  # logical pages [0, num_committed) hold final bytes
    resumable: bool = False


@dataclass
class PageTableUpdate:
    """One atomic change. Applied in this order: commits, owners, resumable flags, removals, appends."""

    commits: dict[str, int] = field(default_factory=dict)  # request -> new num_committed
    owners: dict[str, str] = field(default_factory=dict)  # request -> new owner
    resumable: dict[str, bool] = field(default_factory=dict)
    removals: list[str] = field(default_factory=list)
    appends: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # request -> (owner, new pages)


class PageTable:
    def __init__(self, client: redis.Redis, keys: Keys, instance: str):
        self._redis = client
        self._keys = keys
        self._instance = instance
        self._entries: dict[str, RequestPages] = {}

    # --- reads ----------------------------------------------------------------------------------
    def get(self, request_id: str) -> RequestPages | None:
        return self._entries.get(request_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[RequestPages]:
        return list(self._entries.values())

    def requests_of(self, owner: str) -> list[RequestPages]:
        return [e for e in self._entries.values() if e.owner == owner]

    def used_pages(self) -> list[int]:
        return [p for e in self._entries.values() for p in e.host_pages]

    @property
    def num_committed_pages(self) -> int:
        return sum(e.num_committed for e in self._entries.values())

    # --- writes ---------------------------------------------------------------------------------
    def apply(self, update: PageTableUpdate) -> None:
        """Persists ``update`` in one Redis transaction, then applies it in memory. The caller has
        validated it (requests exist or are new, counts in range); a Redis error raises before
        anything changes in memory."""
        k, inst = self._keys, self._instance
        pipe = self._redis.pipeline(transaction=True)
        for rid, n in update.commits.items():
            pipe.hset(k.kvtier_page_table(inst, rid), "num_committed", n)
        for rid, owner in update.owners.items():
            pipe.hset(k.kvtier_page_table(inst, rid), "owner", owner)
        for rid, flag in update.resumable.items():
            pipe.hset(k.kvtier_page_table(inst, rid), "resumable", int(flag))
        for rid in update.removals:
            pipe.delete(k.kvtier_page_table(inst, rid), k.kvtier_page_list(inst, rid))
            pipe.srem(k.kvtier_requests(inst), rid)
        for rid, (owner, pages) in update.appends.items():
            if rid not in self._entries or rid in update.removals:
                pipe.hset(k.kvtier_page_table(inst, rid), mapping={"owner": owner, "num_committed": 0, "resumable": 0})
                pipe.sadd(k.kvtier_requests(inst), rid)
            if pages:
                pipe.rpush(k.kvtier_page_list(inst, rid), *pages)
        pipe.execute()

        for rid, n in update.commits.items():
            self._entries[rid].num_committed = n
        for rid, owner in update.owners.items():
            self._entries[rid].owner = owner
        for rid, flag in update.resumable.items():
            self._entries[rid].resumable = flag
        for rid in update.removals:
            del self._entries[rid]
        for rid, (owner, pages) in update.appends.items():
            entry = self._entries.setdefault(rid, RequestPages(rid, owner))
            entry.host_pages.extend(pages)

    def load(self) -> None:
        """Replaces the in-memory table with the one persisted in Redis."""
        k, inst = self._keys, self._instance
        rids = sorted(m.decode() for m in self._redis.smembers(k.kvtier_requests(inst)))
        pipe = self._redis.pipeline(transaction=False)
        for rid in rids:
            pipe.hgetall(k.kvtier_page_table(inst, rid))
            pipe.lrange(k.kvtier_page_list(inst, rid), 0, -1)
        replies = pipe.execute()
        entries: dict[str, RequestPages] = {}
        for i, rid in enumerate(rids):
            meta, pages = replies[2 * i], replies[2 * i + 1]
            if not meta:
                raise RuntimeError(f"page table of request {rid!r} is listed but has no entry in Redis")
            entries[rid] = RequestPages(
                request_id=rid,
                owner=meta[b"owner"].decode(),
                host_pages=[int(p) for p in pages],
                num_committed=int(meta[b"num_committed"]),
                resumable=meta[b"resumable"] == b"1",
            )
        self._entries = entries
