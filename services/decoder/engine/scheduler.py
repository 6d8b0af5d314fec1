"""Continuous-batching scheduler with chunked prefill and recompute preemption.

Each step: running requests first (a decoding request needs 1 token plus its draft block, if
speculation proposed one, a prefilling one a chunk),
then waiting requests in arrival order while the token budget, the sequence limit and the
residency controller (which picks each admitted request's FULL or SPARSE mode) allow. A running
request that cannot get a slot first makes the controller demote a FULL request (adaptive policy);
failing that it preempts the most recently admitted running request (its slots are freed, its
tokens kept; written-back pages come back by copy, the rest is recomputed).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.decoder.engine.request import Request, RequestStatus, Residency
from services.decoder.engine.residency_controller import ResidencyController


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens computed this step, starting at request.num_computed_tokens
    draft: list[int] = field(default_factory=list)  # draft tokens verified after them (decode only)

    @property
    def num_query_tokens(self) -> int:
        return self.num_new_tokens + len(self.draft)

    @property
    def samples(self) -> bool:
        """True when this step reaches the end of the request's tokens, so it samples one."""
        return self.request.num_computed_tokens + self.num_new_tokens == self.request.num_tokens


class Scheduler:
    def __init__(self, controller: ResidencyController, page_size: int, max_num_seqs: int,
                 max_num_batched_tokens: int, sparse_recent_pages: int | None = None):
        """``sparse_recent_pages``: the recent window under sparse attention (None: dense)."""
        self.controller = controller
        self.page_size = page_size
        self.sparse_recent_pages = sparse_recent_pages
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def _ensure_slots(self, request: Request, num_tokens: int) -> bool:
        """Gives ``request`` slots for its pages up to ``num_tokens`` tokens. Mutates: allocator, request.slots."""
        return self.controller.grow(request, num_tokens)

    def release(self, request: Request) -> None:
        """Frees every slot of ``request``. Mutates: allocator, request.slots, request.buffer."""
        self.controller.release(request)

    def preempt(self, victim: Request) -> None:
        """Puts a running request back at the front of the queue, freeing its hot slots."""
        self.running.remove(victim)
        self.release(victim)
        # pages already written back to the host tier come back by copy (admission lists them
        # in pending_fetch), not recompute
        victim.num_computed_tokens = victim.num_host_pages * self.page_size
        victim.draft_ids = []
        victim.status = RequestStatus.WAITING
        victim.stats.num_preemptions += 1
        self.waiting.appendleft(victim)

    def remove(self, request: Request) -> None:
        """Takes a finished or aborted request out of the queues and frees its slots."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.release(request)

    def _recompute_cap(self, request: Request, num_new: int) -> int:
        """Under sparse attention a recompute (after preemption, or of a resumed request's tail)
        computes each token as it was computed first: prompt tokens densely in prefill chunks,
        generated tokens with their own page selection (``ModelRunner`` sends a chunk of generated
        tokens down the selecting path). So a chunk stops at the prompt's end, and a chunk of
        generated tokens spans at most ``recent_pages`` pages: every token's candidates are then
        pages sealed before the step (they have digests), as they were in its decode step."""
        if self.sparse_recent_pages is None or num_new <= 1:
            return num_new
        start, prompt_len = request.num_computed_tokens, len(request.prompt_ids)
        if start < prompt_len:
            return min(num_new, prompt_len - start)
        window_end = (start // self.page_size + self.sparse_recent_pages) * self.page_size
        return min(num_new, window_end - start)

    def prefill_tokens(self) -> int:
        """The prefill-chunk tokens the coming step schedules beside its decodes if nothing
        drafts: the running requests' pending chunks, then the waiting requests' (as many as the
        sequence limit admits), within the token budget the decodes leave. An estimate (an
        admission may fail for want of slots, a chunk be capped by residency) that the verify
        budget prices a step's drafts at: beside a chunk, a drafted position costs what one
        more token costs at the chunk's size, and in a full step it displaces a prefill token
        that a later step computes."""
        decoding = sum(1 for r in self.running if r.num_pending_tokens == 1)
        chunks = sum(r.num_pending_tokens for r in self.running if r.num_pending_tokens > 1)
        admissible = max(self.max_num_seqs - len(self.running), 0)
        chunks += sum(r.num_pending_tokens for r, _ in zip(self.waiting, range(admissible)))
        return max(min(chunks, self.max_num_batched_tokens - decoding), 0)

    def schedule(self) -> list[ScheduledRequest]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledRequest] = []
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = self._recompute_cap(request, min(request.num_pending_tokens, budget))
            if num_new > 1 and request.mode is Residency.SPARSE:
                # a SPARSE prefill chunk takes the slots there are rather than preempting anyone
                num_new = max(1, min(num_new, self.controller.chunk_room(request)))
            draft = request.draft_ids[: budget - 1] if request.num_pending_tokens == 1 else []
            while not self._ensure_slots(request, request.num_computed_tokens + num_new + len(draft)):
                if self.controller.demote_one(self.running):
                    continue
                victim = self.running[-1]
                self.preempt(victim)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break  # preempted itself: nothing later in the list can run either
            scheduled.append(ScheduledRequest(request, num_new, draft))
            budget -= num_new + len(draft)
            index += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            num_new = self._recompute_cap(request, min(request.num_pending_tokens, budget))
            admitted = self.controller.admit(request, num_new)
            # load beyond the hot pool: demote FULL requests (adaptive) until the head of the queue fits
            while not admitted and self.controller.demote_one(self.running):
                admitted = self.controller.admit(request, num_new)
            if not admitted:
                break
            num_new = admitted
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        return scheduled
