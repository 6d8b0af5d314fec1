"""KvtierService: the kvtier logic as a plain class (the gRPC servicer only translates).

State: the host pool segment, the host page allocator, the page table and the decoder leases.
Every public method holds one lock, validates its whole input first and raises ``KvtierError``
(nothing changed) on bad input; then it persists to Redis and applies in memory.
Ownership: each request belongs to the decoder that allocated it (or claimed it in ``lookup``);
only the owner may allocate, commit, free, mark or look it up (learn its host page ids).
Orphans: when a decoder's lease ends (expiry or detach) its non-resumable requests are freed at
once; its resumable ones wait ``resumable_ttl_s`` for another (or the restarted) decoder to claim
them, then are freed too, so that a request nobody resumes never holds pages for ever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import redis

from services.kvtier.allocator import HostPageAllocator
from services.kvtier.config import KvtierConfig
from services.kvtier.instance import InstanceLock, open_instance, remove_instance
from services.kvtier.leases import Leases
from services.kvtier.messages import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    NOT_FOUND,
    RESOURCE_EXHAUSTED,
    AllocatedPages,
    AllocateItem,
    AttachInfo,
    CommitItem,
    KvtierError,
    PageLayout,
    RequestPagesInfo,
    Stats,
    StepResult,
)
from services.kvtier.page_table import PageTable, PageTableUpdate
from services.metadata.keys import Keys, check_name

log = logging.getLogger(__name__)


def _check_id(what: str, value: str) -> None:
    try:
        check_name(what, value)
    except ValueError as exc:
        raise KvtierError(INVALID_ARGUMENT, str(exc)) from None


def _check_distinct(what: str, ids: list[str]) -> None:
    for rid in ids:
        _check_id("request_id", rid)
    if len(set(ids)) != len(ids):
        raise KvtierError(INVALID_ARGUMENT, f"{what}: a request id appears twice in {ids}")


class KvtierService:
    def __init__(self, config: KvtierConfig, client: redis.Redis, clock: Callable[[], float] = time.time):
        self.config = config
        self.instance = config.instance
        self._keys = Keys(config.namespace)
        self._redis = client
        self._lock = threading.RLock()
        self._instance_lock = InstanceLock(config.segment_name)
        try:
            self.pool, info = open_instance(config, client, self._keys)
        except BaseException:
            self._instance_lock.release(remove=False)
            raise
        self._model_id = info.get("model_id", "")
        self.page_table = PageTable(client, self._keys, self.instance)
        self.leases = Leases(client, self._keys, self.instance, config.lease_ttl_s, clock)
        self._clock = clock
        self._orphaned_since: dict[str, float] = {}  # resumable request -> when its owner's lease ended
        if self.pool.created:
            self.allocator = HostPageAllocator(config.num_host_pages)
        else:
            self.page_table.load()
            self.leases.load()
            self.leases.grant_grace()
            self.allocator = HostPageAllocator(config.num_host_pages, self.page_table.used_pages())
            for e in self.page_table.entries():  # orphaned before the restart: their wait starts again now
                if not self.leases.has(e.owner):
                    self._orphaned_since[e.request_id] = clock()
            log.info("recovered %d requests, %d used host pages", len(self.page_table), self.allocator.num_used_pages)
        self.layout = PageLayout(config.dtype, config.num_layers, config.num_kv_heads, config.head_dim, config.page_size)
        self._closed = False

    @property
    def recovered(self) -> bool:
        return not self.pool.created

    # --- decoders -----------------------------------------------------------------------------
    def attach(self, decoder_id: str, model_id: str, layout: PageLayout) -> AttachInfo:
        """Layout handshake. Mutates: the decoder's lease (created or renewed); binds the instance's
        model id on the first attach if the config left it empty."""
        _check_id("decoder_id", decoder_id)
        if not model_id:
            raise KvtierError(INVALID_ARGUMENT, "model_id must not be empty")
        with self._lock:
            if layout != self.layout:
                diffs = [
                    f"{name}: decoder {getattr(layout, name)!r} != kvtier {getattr(self.layout, name)!r}"
                    for name in ("dtype", "num_layers", "num_kv_heads", "head_dim", "page_size")
                    if getattr(layout, name) != getattr(self.layout, name)
                ]
                raise KvtierError(FAILED_PRECONDITION, "page layout mismatch: " + "; ".join(diffs))
            if self._model_id and model_id != self._model_id:
                raise KvtierError(
                    FAILED_PRECONDITION, f"model mismatch: decoder {model_id!r} != kvtier {self._model_id!r}"
                )
            if not self._model_id:
                self._redis.hset(self._keys.kvtier_info(self.instance), "model_id", model_id)
                self._model_id = model_id
            self.leases.renew(decoder_id)
            pl = self.pool.layout
            return AttachInfo(
                instance=self.instance, segment_name=self.pool.segment_name, segment_bytes=pl.segment_bytes,
                pool_offset_bytes=0, num_host_pages=pl.num_host_pages, host_page_bytes=pl.host_page_bytes,
                layer_stride_bytes=pl.layer_stride_bytes, kv_stride_bytes=pl.kv_stride_bytes,
                element_bytes=pl.element_bytes, layout=self.layout, lease_ttl_s=self.leases.ttl_s,
            )

    def heartbeat(self, decoder_id: str) -> float:
        """Renews the lease; returns its expiry (unix s). NOT_FOUND if the decoder holds none."""
        _check_id("decoder_id", decoder_id)
        with self._lock:
            self._require_lease(decoder_id)
            return self.leases.renew(decoder_id)

    def detach(self, decoder_id: str) -> list[str]:
        """Drops the lease and frees the decoder's non-resumable requests; returns their ids."""
        _check_id("decoder_id", decoder_id)
        with self._lock:
            self._require_lease(decoder_id)
            freed = self._release_decoder(decoder_id)
            self.leases.drop(decoder_id)
            return freed

    def reap_expired(self) -> list[str]:
        """Frees the non-resumable requests of every decoder whose lease ran out and drops those
        leases (resumable requests stay, owned by the dead decoder until claimed), then frees the
        resumable requests nobody claimed within ``resumable_ttl_s``; returns the freed ids."""
        with self._lock:
            freed: list[str] = []
            for decoder_id in self.leases.expired():
                released = self._release_decoder(decoder_id)
                self.leases.drop(decoder_id)
                log.warning("lease of decoder %r expired: freed %d requests", decoder_id, len(released))
                freed += released
            return freed + self._free_unclaimed_orphans()

    def _free_unclaimed_orphans(self) -> list[str]:
        now = self._clock()
        due = [rid for rid, since in self._orphaned_since.items() if now - since >= self.config.resumable_ttl_s]
        victims = []
        for rid in due:
            del self._orphaned_since[rid]
            entry = self.page_table.get(rid)
            if entry is not None and not self.leases.has(entry.owner):  # nobody claimed it
                victims.append(entry)
        if victims:
            self.page_table.apply(PageTableUpdate(removals=[e.request_id for e in victims]))
            self.allocator.free([p for e in victims for p in e.host_pages])
            log.warning("freed %d resumable requests nobody claimed within %g s: %s", len(victims),
                        self.config.resumable_ttl_s, [e.request_id for e in victims])
        return [e.request_id for e in victims]

    # --- pages --------------------------------------------------------------------------------
    def step(
        self,
        decoder_id: str,
        commits: Iterable[CommitItem] = (),
        free_request_ids: Iterable[str] = (),
        allocations: Iterable[AllocateItem] = (),
    ) -> StepResult:
        """One engine step, all-or-nothing: commits, then frees, then allocations (appended to each
        request's pages, taken from the front of the free queue in item order). Renews the lease.
        Errors: INVALID_ARGUMENT (malformed), NOT_FOUND (unknown request), FAILED_PRECONDITION
        (not the owner, commit out of range or decreasing, no lease), RESOURCE_EXHAUSTED (too few
        free host pages)."""
        commits, frees, allocations = list(commits), list(free_request_ids), list(allocations)
        _check_id("decoder_id", decoder_id)
        _check_distinct("commits", [c.request_id for c in commits])
        _check_distinct("frees", frees)
        _check_distinct("allocations", [a.request_id for a in allocations])
        for a in allocations:
            if a.num_pages < 0:
                raise KvtierError(INVALID_ARGUMENT, f"allocation for {a.request_id!r}: num_pages {a.num_pages} < 0")
            if a.request_id in frees:
                raise KvtierError(INVALID_ARGUMENT, f"request {a.request_id!r} is both freed and allocated in one step")
        with self._lock:
            self._require_lease(decoder_id)
            update = PageTableUpdate()
            for c in commits:
                entry = self._owned(decoder_id, c.request_id)
                n = c.num_committed_pages
                if not entry.num_committed <= n <= len(entry.host_pages):
                    raise KvtierError(
                        FAILED_PRECONDITION,
                        f"commit of {c.request_id!r} to {n} pages: must be in [{entry.num_committed} (committed), "
                        f"{len(entry.host_pages)} (allocated)]",
                    )
                update.commits[c.request_id] = n
            freed_pages: list[int] = []
            for rid in frees:
                freed_pages += self._owned(decoder_id, rid).host_pages
                update.removals.append(rid)
            for a in allocations:
                if a.request_id in self.page_table:
                    self._owned(decoder_id, a.request_id)
            num_wanted = sum(a.num_pages for a in allocations)
            num_free = self.allocator.num_free_pages + len(freed_pages)
            if num_wanted > num_free:
                raise KvtierError(
                    RESOURCE_EXHAUSTED, f"asked for {num_wanted} host pages, {num_free} free of {self.allocator.num_host_pages}"
                )
            # Pages the allocator will hand out once the frees are applied (FIFO: front first).
            front = self.allocator.peek(min(num_wanted, self.allocator.num_free_pages))
            upcoming = front + freed_pages[: num_wanted - len(front)]
            allocated: list[AllocatedPages] = []
            cursor = 0
            for a in allocations:
                if a.num_pages == 0:
                    continue
                pages = upcoming[cursor : cursor + a.num_pages]
                cursor += a.num_pages
                existing = self.page_table.get(a.request_id)
                update.appends[a.request_id] = (decoder_id, pages)
                allocated.append(AllocatedPages(a.request_id, len(existing.host_pages) if existing else 0, pages))
            self.page_table.apply(update)
            self.allocator.free(freed_pages)
            taken = self.allocator.allocate(num_wanted)
            assert taken == upcoming, (taken, upcoming)
            self.leases.renew(decoder_id)
            return StepResult(allocated, len(freed_pages), self.allocator.num_free_pages)

    def allocate(self, decoder_id: str, allocations: Iterable[AllocateItem]) -> StepResult:
        return self.step(decoder_id, allocations=allocations)

    def commit(self, decoder_id: str, commits: Iterable[CommitItem]) -> StepResult:
        return self.step(decoder_id, commits=commits)

    def free(self, decoder_id: str, request_ids: Iterable[str]) -> StepResult:
        return self.step(decoder_id, free_request_ids=request_ids)

    def mark_resumable(self, decoder_id: str, request_ids: Iterable[str], resumable: bool = True) -> None:
        """Sets the resumable flag of the caller's requests. Mutates: their page-table entries."""
        request_ids = list(request_ids)
        _check_id("decoder_id", decoder_id)
        _check_distinct("mark_resumable", request_ids)
        with self._lock:
            self._require_lease(decoder_id)
            for rid in request_ids:
                self._owned(decoder_id, rid)
            self.page_table.apply(PageTableUpdate(resumable={rid: resumable for rid in request_ids}))

    def lookup(self, decoder_id: str, request_ids: Iterable[str], claim: bool = False) -> list[RequestPagesInfo]:
        """The caller's requests' pages (logical order) and state; needs a lease (attach first).
        Without ``claim`` every request must be the caller's: another decoder's page ids are never
        handed out (FAILED_PRECONDITION). With ``claim`` the caller becomes their owner: allowed
        for its own requests, and for another decoder's only when that request is resumable and its
        owner holds no live lease (FAILED_PRECONDITION otherwise)."""
        request_ids = list(request_ids)
        _check_distinct("lookup", request_ids)
        _check_id("decoder_id", decoder_id)
        with self._lock:
            self._require_lease(decoder_id)
            entries = []
            for rid in request_ids:
                entry = self.page_table.get(rid)
                if entry is None:
                    raise KvtierError(NOT_FOUND, f"request {rid!r} has no host pages")
                entries.append(entry)
            for e in entries:
                if e.owner == decoder_id:
                    continue
                if not claim:
                    raise KvtierError(FAILED_PRECONDITION, f"request {e.request_id!r} is owned by decoder {e.owner!r}")
                if self.leases.is_live(e.owner):
                    raise KvtierError(
                        FAILED_PRECONDITION, f"request {e.request_id!r} is owned by live decoder {e.owner!r}"
                    )
                if not e.resumable:
                    raise KvtierError(FAILED_PRECONDITION, f"request {e.request_id!r} of decoder {e.owner!r} is "
                                                           "not resumable: only its owner may claim it")
            if claim:
                changed = {e.request_id: decoder_id for e in entries if e.owner != decoder_id}
                if changed:
                    self.page_table.apply(PageTableUpdate(owners=changed))
                for e in entries:
                    self._orphaned_since.pop(e.request_id, None)
            return [
                RequestPagesInfo(e.request_id, list(e.host_pages), e.num_committed, e.owner, e.resumable)
                for e in entries
            ]

    def stats(self) -> Stats:
        with self._lock:
            pl = self.pool.layout
            used = self.allocator.num_used_pages
            return Stats(
                instance=self.instance, num_host_pages=pl.num_host_pages, num_used_pages=used,
                num_free_pages=self.allocator.num_free_pages, num_committed_pages=self.page_table.num_committed_pages,
                num_requests=len(self.page_table), num_live_decoders=self.leases.num_live,
                host_page_bytes=pl.host_page_bytes, used_bytes=used * pl.host_page_bytes,
                free_bytes=self.allocator.num_free_pages * pl.host_page_bytes, segment_bytes=pl.segment_bytes,
            )

    def check_integrity(self) -> bool:
        """Allocator consistent; used pages == exactly the page table's pages (no page twice);
        commits within allocations."""
        with self._lock:
            self.allocator.check_integrity()
            used = self.page_table.used_pages()
            assert len(set(used)) == len(used), "a host page belongs to two requests"
            assert all(not self.allocator.is_free(p) for p in used), "a page-table page is free in the allocator"
            assert len(used) == self.allocator.num_used_pages, "the allocator has used pages that no request holds"
            for e in self.page_table.entries():
                assert 0 <= e.num_committed <= len(e.host_pages), f"{e.request_id}: commit beyond allocation"
            return True

    def integrity_problem(self) -> str | None:
        """``check_integrity()`` as a value: None when it holds, else the failed check."""
        try:
            self.check_integrity()
        except AssertionError as exc:
            return str(exc) or "integrity check failed"
        return None

    # --- lifecycle ----------------------------------------------------------------------------
    def shutdown(self, remove: bool = True) -> None:
        """Clean shutdown: with ``remove``, deletes the segment and every Redis key of the
        instance; otherwise only unmaps (the state survives for a restart). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if remove:
                remove_instance(self.pool, self._redis, self._keys, self.instance)
            else:
                self.pool.close()
            self._instance_lock.release(remove=remove)

    # --- helpers ------------------------------------------------------------------------------
    def _require_lease(self, decoder_id: str) -> None:
        if not self.leases.has(decoder_id):
            raise KvtierError(NOT_FOUND, f"decoder {decoder_id!r} holds no lease (expired or never attached): attach")

    def host_pages_for(self, decoder_id: str, items: Iterable[tuple[str, int]]) -> list[int]:
        """Host page ids of the caller's ``(request_id, logical page)`` pairs; NOT_FOUND /
        FAILED_PRECONDITION (not the caller's, or the page is not allocated). Reads only."""
        _check_id("decoder_id", decoder_id)
        with self._lock:
            self._require_lease(decoder_id)
            ids = []
            for request_id, page in items:
                entry = self._owned(decoder_id, request_id)
                if not 0 <= page < len(entry.host_pages):
                    raise KvtierError(FAILED_PRECONDITION, f"request {request_id!r} has no page {page} "
                                                           f"({len(entry.host_pages)} allocated)")
                ids.append(entry.host_pages[page])
            return ids

    def _owned(self, decoder_id: str, request_id: str):
        entry = self.page_table.get(request_id)
        if entry is None:
            raise KvtierError(NOT_FOUND, f"request {request_id!r} has no host pages")
        if entry.owner != decoder_id:
            raise KvtierError(FAILED_PRECONDITION, f"request {request_id!r} is owned by decoder {entry.owner!r}")
        return entry

    def _release_decoder(self, decoder_id: str) -> list[str]:
        """Its lease is ending: frees its non-resumable requests, starts the wait of the others."""
        for e in self.page_table.requests_of(decoder_id):
            if e.resumable:
                self._orphaned_since[e.request_id] = self._clock()
        victims = [e for e in self.page_table.requests_of(decoder_id) if not e.resumable]
        if not victims:
            return []
        pages = [p for e in victims for p in e.host_pages]
        self.page_table.apply(PageTableUpdate(removals=[e.request_id for e in victims]))
        self.allocator.free(pages)
        return [e.request_id for e in victims]
