"""The engine's per-step traffic with its kvtier host tier: one sync call under backpressure, the
requests a lost lease took away, and the swap-in of re-admitted requests' written-back pages."""

from __future__ import annotations

import grpc

from services.decoder.engine.request import Request
from services.decoder.engine.scheduler import Scheduler
from services.decoder.kv.host_tier import HostTier
from services.decoder.kv.kvtier_client import KvtierClientError


def sync_with_backpressure(host_tier: HostTier, scheduler: Scheduler, batch: list) -> list:
    """One kvtier call for the step (``batch``: the scheduled requests). Backpressure: while kvtier
    has too few free host pages (RESOURCE_EXHAUSTED, which changes nothing there), the newest
    request holding host pages (queued ones first, then the step's) gives them all back and waits
    to be recomputed; the call is retried with its frees. The oldest requests always progress: one
    request alone fits (``Engine.add_request`` checks). Returns the batch that can run."""
    while True:
        try:
            host_tier.sync({s.request.request_id: len(s.request.slots) for s in batch})
            return batch
        except KvtierClientError as exc:
            if exc.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            held = host_tier.host_pages
            queued = [r for r in scheduler.waiting if r.request_id in held]
            if queued:
                victim = queued[-1]
            elif len(batch) > 1:
                victim = max((s.request for s in batch), key=scheduler.running.index)
                scheduler.preempt(victim)
                batch = [s for s in batch if s.request is not victim]
            else:
                raise
            host_tier.release(victim.request_id)  # its frees ride on the retried call
            victim.num_host_pages = 0
            victim.num_computed_tokens = 0
            victim.pending_fetch = []
            victim.stats.num_host_waits += 1


def lost_requests(host_tier: HostTier, requests: dict[str, Request]) -> list[Request]:
    """The unfinished requests whose kvtier pages went with a lost lease (this decoder was paused
    past its TTL: kvtier freed them, maybe for another request, or another decoder claimed them),
    in request-id order; the caller aborts them. Clears ``host_tier.lost``."""
    lost = [requests[r] for r in sorted(host_tier.lost) if r in requests]
    host_tier.lost.clear()
    return [r for r in lost if not r.is_finished]


def swap_in(host_tier: HostTier | None, batch: list) -> None:
    """Copies written-back pages of re-admitted (preempted) requests into their new slots."""
    for sched in batch:
        request = sched.request
        if request.pending_fetch:
            pages = request.pending_fetch
            host_tier.fetch(request.request_id, pages, [request.slots[p] for p in pages])
            request.stats.num_swapped_in_pages += len(pages)
            request.pending_fetch = []
