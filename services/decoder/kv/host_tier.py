"""Eager write-back of sealed pages to kvtier host pages, with one batched kvtier call per step.

Every logical page of a request gets a host page (allocated when its hot slot is allocated).
Per engine step, one ``Step`` RPC, sent before the forward, carries:
  - allocations: host pages for the logical pages the scheduler just gave slots to;
  - commits: pages sealed (and copied to the host) during the previous step;
  - frees: requests that finished during the previous step.
After the forward and acceptance, the pages sealed in this step are copied from the hot pool
straight into their host pages in shared memory (``kv/page_copy.py``; on CUDA kvtier drives it
from the exported hot pool); their commit rides on the
next step's call. A clean page can then leave the hot pool at no cost: a preempted request
comes back by ``fetch`` (host -> hot) instead of recomputing its written-back pages.
"""

from __future__ import annotations

import logging
import time

import grpc

from services.decoder.kv import page_copy
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.kvtier_client import KvLayout, KvtierClient, KvtierClientError

log = logging.getLogger(__name__)


class HostTier:
    def __init__(self, client: KvtierClient, pool: HotPool, resumable: bool = False, retry_s: float = 60.0):
        if KvLayout.of_hot_pool(pool) != client.layout:
            raise ValueError("the kvtier client's layout does not match the hot pool")
        self.client = client
        self.pool = pool
        self.resumable = resumable  # mark every request resumable: its pages outlive this decoder
        self.retry_s = retry_s  # how long a step waits for a restarting kvtier before failing
        self.num_kvtier_retries = 0
        client.attach()
        # on CUDA kvtier drives write-back from the exported hot pool (CUDA IPC); the decoder
        # reads the host pool zero-copy for fetches (cudaHostRegister)
        self.kvtier_driven = pool.storage.is_cuda
        if self.kvtier_driven:
            client.host_pool.register_with_cuda()
            client.export_hot_pool(pool.storage)
        client.start_heartbeat()  # keeps the lease while the engine is idle (steps renew it too)
        self.host_pages: dict[str, list[int]] = {}  # request -> host page id per logical page
        self.num_sealed: dict[str, int] = {}  # request -> leading pages copied to the host
        self._pending_commits: dict[str, int] = {}
        self._pending_frees: list[str] = []
        # requests whose kvtier pages this decoder lost with its lease (it was paused past the
        # lease TTL: kvtier freed them or another decoder claimed them); the engine aborts them
        self.lost: set[str] = set()
        self._lease_lost = False
        self.num_written_pages = 0
        self.num_fetched_pages = 0
        self.num_step_calls = 0

    def sync(self, page_counts: dict[str, int]) -> None:
        """Before the forward: ``page_counts`` maps each scheduled request to its number of
        logical pages (slots). One RPC: allocations for new pages, the previous step's commits
        and frees. Mutates: host page tables, pending queues."""
        def allocations() -> dict[str, int]:  # from the current state: a retry may follow a lost lease
            return {rid: count - len(self.host_pages.get(rid, ())) for rid, count in page_counts.items()
                    if rid not in self.lost and count > len(self.host_pages.get(rid, ()))}

        if not (allocations() or self._pending_commits or self._pending_frees):
            return
        outcome = self._riding_out_restarts(lambda: self.client.step(
            commits=self._pending_commits, frees=self._pending_frees, allocations=allocations()))
        self.num_step_calls += 1
        self._pending_commits = {}
        self._pending_frees = []
        new_ids = [rid for rid in outcome.allocated if rid not in self.host_pages]
        for rid, ids in outcome.allocated.items():
            self.host_pages.setdefault(rid, []).extend(ids)
        if self.resumable and new_ids:
            self._riding_out_restarts(lambda: self.client.mark_resumable(new_ids))  # one call per step

    def _riding_out_restarts(self, call):
        """Runs a kvtier call; while kvtier is down (UNAVAILABLE) or restarted without this
        decoder's lease (NOT_FOUND), waits with backoff and re-attaches (the restarted kvtier
        re-attaches to the surviving segment; pages and commits are in its Redis page table),
        for at most ``retry_s`` seconds. Calls are all-or-nothing, so a retry repeats nothing."""
        deadline = time.monotonic() + self.retry_s
        delay_s = 0.05
        while True:
            try:
                return call()
            except KvtierClientError as exc:
                if exc.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND) \
                        or time.monotonic() + delay_s > deadline:
                    raise
                if exc.code == grpc.StatusCode.NOT_FOUND and "lease" not in exc.detail:
                    raise  # an unknown request is a real error, not a restart
                if exc.code == grpc.StatusCode.NOT_FOUND:
                    self._lease_lost = True  # kvtier may have freed or handed out this decoder's pages
                log.warning("kvtier unavailable (%s); retrying in %.2f s", exc.code.name, delay_s)
                self.num_kvtier_retries += 1
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)
                try:
                    self.client.attach()  # new lease after a restart; same mapping if same segment
                    if self.kvtier_driven:
                        self.client.export_hot_pool(self.pool.storage)
                    if self._lease_lost:
                        self._forget_lost_requests()
                except KvtierClientError:
                    pass  # still down: the next round tries again

    def _forget_lost_requests(self) -> None:
        """After the lease was lost and attach() made a new one: asks kvtier which of this tier's
        requests are still this decoder's. The others' pages were freed (and may belong to another
        request by now) or claimed by another decoder: they are dropped here (no copy, commit or
        free is sent for them again) and listed in ``lost`` for the engine to abort."""
        gone = []
        for rid in sorted(set(self.host_pages) | set(self._pending_commits) | set(self._pending_frees)):
            try:
                self.client.lookup([rid])
            except KvtierClientError as exc:
                if exc.code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                    raise
                gone.append(rid)
        for rid in gone:
            if self.host_pages.pop(rid, None) is not None:
                self.lost.add(rid)
            self.num_sealed.pop(rid, None)
            self._pending_commits.pop(rid, None)
            if rid in self._pending_frees:
                self._pending_frees.remove(rid)
        self._lease_lost = False
        log.warning("kvtier lease was lost (this decoder was silent past its TTL): %d requests lost their host "
                    "pages %s", len(gone), gone)

    def ensure_lease(self) -> None:
        """Before writing into host pages: the lease must surely be live, or the pages may belong to
        another request by now. When it may have run out (this process was paused), renews it,
        and after a lost lease drops the requests kvtier took back (``lost``)."""
        if self.client.lease_left_s() < self.client.attach_info.lease_ttl_s / 3:
            self._riding_out_restarts(self.client.heartbeat)

    def write_back(self, sealed: list[tuple[str, int, int]]) -> None:
        """After acceptance: ``sealed`` = (request, logical page, hot slot) of pages whose rows
        are all committed. Copies them into their host pages, every layer; queues the commit."""
        if not sealed:
            return
        self.ensure_lease()
        sealed = [item for item in sealed if item[0] in self.host_pages]  # not a lost request's
        if not sealed:
            return
        if self.kvtier_driven:
            self._riding_out_restarts(lambda: self.client.write_back(sealed))  # kvtier copies from the GPU
        else:
            self._copy_to_host(sealed)
        self.num_written_pages += len(sealed)
        for rid, page, _ in sealed:
            done = max(self.num_sealed.get(rid, 0), page + 1)
            self.num_sealed[rid] = done
            self._pending_commits[rid] = done

    def _copy_to_host(self, sealed: list[tuple[str, int, int]]) -> None:
        page_copy.to_host(self.pool.storage, self.client.host_pool.pool, [slot for _, _, slot in sealed],
                          [self.host_pages[rid][page] for rid, page, _ in sealed])

    def fetch(self, request_id: str, pages: list[int], slots: list[int]) -> None:
        """Copies the request's host pages of logical ``pages`` into hot ``slots`` (every layer)."""
        if not pages:
            return
        table = self.host_pages[request_id]
        page_copy.from_host(self.client.host_pool.pool, self.pool.storage, [table[p] for p in pages], list(slots))
        self.num_fetched_pages += len(pages)

    def claim(self, request_id: str):
        """Takes over a request kvtier holds (after a decoder restart): its host pages and
        committed count become this tier's. Returns kvtier's ``RequestPages``."""
        pages = self.client.lookup([request_id], claim=True)[request_id]
        self.host_pages[request_id] = list(pages.host_page_ids)
        self.num_sealed[request_id] = pages.num_committed_pages
        return pages

    def release(self, request_id: str) -> None:
        """The request finished: its host pages are freed with the next call."""
        self._pending_commits.pop(request_id, None)
        if self.host_pages.pop(request_id, None) is not None:
            self._pending_frees.append(request_id)
        self.num_sealed.pop(request_id, None)

    def flush(self) -> None:
        """Sends pending commits and frees now (idle engine, shutdown)."""
        self.sync({})
