"""Runs one ``Engine`` in its own thread and lets many threads use it.

The engine is single-threaded, so every engine call happens on the loop thread. Other threads
talk to it through a command queue:

- ``submit`` queues a request and blocks until the loop thread has admitted (or refused) it, so a
  refusal surfaces as an exception in the caller; admitted requests stream ``Output`` objects into
  their own ``RequestHandle`` queue, the last one with ``finished=True``.
- ``cancel`` aborts a request (its slots are freed on the loop thread); its handle gets a final
  ``Output`` with ``finish_reason="abort"``.
- ``drain`` stops admitting new requests and lets the in-flight ones finish; ``stop`` drains and
  ends the thread once nothing is left. What is left after its timeout is handed off, its handle
  ending with ``finish_reason="handoff"``: a request with no output yet is freed (its client
  starts it afresh elsewhere); one with output, when the engine has a kvtier host tier, stays in
  kvtier (the lease is given up so that another decoder may claim it). The rest is aborted.
- ``submit(..., resume=Resume(...))`` continues a request another decoder handed off or left
  behind (``Engine.resume_request``).

The loop sleeps on the command queue while the engine is idle and wakes on the next command.
``stats()`` returns a snapshot taken after every step, safe to read from any thread.

On CPU the engine's own thread also sets its OpenMP regime: the decoder loads the model on the
main thread and steps it here, so the process has two OpenMP masters, more OpenMP threads than a
small machine has cores, and libgomp (torch's OpenMP) throttles its spin-waiting between parallel
regions. A process that steps on its only master spins instead (~300k iterations): much faster
while it has the cores to itself, but it collapses once anything else wants one (through the
stack on 2 shared cores: 3.7 tok/s spinning vs 81 throttled, 2026-11-30). Keep stepping here.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from services.decoder.engine.engine import Engine, TokenEvent
from services.decoder.engine.sampling_params import InvalidRequestError, SamplingParams
from services.decoder.service.output import Output, finished_stats, residency_stats


class QueueFullError(RuntimeError):
    """The decoder's queue is full (see ``queue_is_full``); try another decoder or later."""


def queue_is_full(num_running: int, num_waiting: int, max_num_seqs: int, max_num_waiting: int) -> bool:
    """Whether a new request would wait beyond ``max_num_waiting``: requests that can still take a
    free batch seat do not count as waiting, so ``max_num_seqs`` requests arriving at once onto an
    idle decoder are all admitted, whether or not a step has moved them to running yet (or a full
    hot pool has preempted some of them back to the queue)."""
    return num_running + num_waiting >= max_num_seqs + max_num_waiting


class DrainingError(RuntimeError):
    """The loop is draining or stopped and admits nothing new."""


class RequestHandle:
    """The caller's side of one request: a queue of ``Output`` ending with a finished one."""

    def __init__(self, request_id: str, num_prompt_tokens: int):
        self.request_id = request_id
        self.num_prompt_tokens = num_prompt_tokens
        self._outputs: queue.Queue[Output] = queue.Queue()

    def get(self, timeout: float | None = None) -> Output:
        """Next output; raises ``queue.Empty`` after ``timeout`` seconds."""
        return self._outputs.get(timeout=timeout)

    def __iter__(self):
        while True:
            output = self._outputs.get()
            yield output
            if output.finished:
                return


@dataclass
class LoopStats:
    num_running: int = 0
    num_waiting: int = 0
    num_free_slots: int = 0
    num_total_slots: int = 0
    num_requests_finished: int = 0
    num_generated_tokens: int = 0
    num_prompt_tokens: int = 0
    num_steps: int = 0
    draining: bool = False
    num_prefill_tokens: int = 0  # over finished (and handed-off) requests
    num_resumed_requests: int = 0
    num_handed_off_requests: int = 0
    residency_mode_counts: dict[str, int] = field(default_factory=dict)
    # live requests: id -> {state, num_prompt_tokens, num_output_tokens} and residency
    # {mode, num_hot_pages, num_host_pages, num_committed_pages} (published to Redis by the heartbeat)
    request_summaries: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class Resume:
    """What the client of a resumed request already received."""

    output_ids: list[int]
    num_streamed_chars: int | None = None


@dataclass
class _Submit:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    admitted: Future
    resume: Resume | None = None


@dataclass
class _Cancel:
    request_id: str


class EngineLoop:
    def __init__(self, engine: Engine, max_num_waiting: int = 64):
        self.engine = engine
        self.max_num_waiting = max_num_waiting
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._handles: dict[str, RequestHandle] = {}
        self._draining = threading.Event()
        self._stopping = threading.Event()
        self._stats_lock = threading.Lock()
        self._stats = LoopStats(num_total_slots=engine.allocator.num_slots,
                                num_free_slots=engine.allocator.num_free_slots)
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._error: BaseException | None = None

    # ---- any thread -------------------------------------------------------------------------
    def start(self) -> EngineLoop:
        self._thread.start()
        return self

    def submit(self, prompt_ids: list[int], params: SamplingParams, request_id: str,
               timeout: float | None = 30.0, resume: Resume | None = None) -> RequestHandle:
        """Queues a request (``resume``: continues it from its kvtier pages); returns its handle
        once admitted. Raises ``InvalidRequestError``, ``QueueFullError`` or ``DrainingError``
        (nothing queued in those cases)."""
        if self._draining.is_set():
            raise DrainingError("the decoder is draining and admits no new requests")
        admitted: Future = Future()
        self._commands.put(_Submit(request_id, list(prompt_ids), params, admitted, resume))
        return admitted.result(timeout=timeout)

    def cancel(self, request_id: str) -> None:
        """Asks the loop to abort ``request_id`` (no-op if unknown or finished)."""
        self._commands.put(_Cancel(request_id))

    def drain(self) -> None:
        """Stops admitting; in-flight requests keep running to completion."""
        self._draining.set()
        with self._stats_lock:
            self._stats.draining = True
        self._commands.put(None)  # wake

    def stop(self, timeout: float | None = None) -> bool:
        """Drains, waits up to ``timeout`` for in-flight requests, hands off (or aborts) the rest,
        ends the thread. Returns True when every request finished on its own."""
        self.drain()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and self.num_in_flight and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.02)
        finished_cleanly = self.num_in_flight == 0
        self._stopping.set()
        self._commands.put(None)
        self._thread.join(timeout=10)
        return finished_cleanly

    def is_active(self, request_id: str) -> bool:
        """True while ``request_id`` is admitted and not finished."""
        return request_id in self._handles

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    @property
    def num_in_flight(self) -> int:
        with self._stats_lock:
            return self._stats.num_running + self._stats.num_waiting

    def stats(self) -> LoopStats:
        with self._stats_lock:
            return dataclasses.replace(self._stats, residency_mode_counts=dict(self._stats.residency_mode_counts),
                                       request_summaries=dict(self._stats.request_summaries))

    # ---- loop thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                idle = not self.engine.has_unfinished()
                if self._stopping.is_set():
                    self._hand_off_all()
                    self._abort_all()
                    self._publish_stats()
                    return
                self._take_commands(block=idle)
                if self.engine.has_unfinished():
                    self._dispatch(self.engine.step())
                    with self._stats_lock:
                        self._stats.num_steps += 1
                if not self.engine.has_unfinished() and self.engine.host_tier is not None:
                    self._flush_host_tier()
                self._publish_stats()
        except BaseException as exc:  # the engine failed: end every stream instead of hanging them
            self._error = exc
            self._abort_all()
            raise

    def _flush_host_tier(self) -> None:
        """Idle: finished or cancelled requests' host pages go back to kvtier now, not with the next
        step. A kvtier that stays down keeps them pending (sent again on the next try)."""
        from services.decoder.kv.kvtier_client import KvtierClientError

        try:
            self.engine.host_tier.flush()
        except KvtierClientError as exc:
            logging.getLogger(__name__).warning("returning host pages to kvtier failed: %s", exc)

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(command, _Submit):
                self._admit(command)
            elif isinstance(command, _Cancel):
                self._cancel(command.request_id)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _admit(self, command: _Submit) -> None:
        if not command.admitted.set_running_or_notify_cancel():
            return
        if self._draining.is_set():
            command.admitted.set_exception(DrainingError("the decoder is draining and admits no new requests"))
            return
        scheduler = self.engine.scheduler
        if queue_is_full(len(scheduler.running), len(scheduler.waiting), scheduler.max_num_seqs, self.max_num_waiting):
            command.admitted.set_exception(QueueFullError(
                f"{len(scheduler.running)} requests are running and {len(scheduler.waiting)} waiting "
                f"(max_num_seqs={scheduler.max_num_seqs}, max_num_waiting={self.max_num_waiting})"))
            return
        try:
            if command.resume is None:
                request_id = self.engine.add_request(command.prompt_ids, command.params, command.request_id)
            else:
                request_id = self.engine.resume_request(command.request_id, command.prompt_ids,
                                                        command.resume.output_ids, command.params,
                                                        command.resume.num_streamed_chars)
                with self._stats_lock:
                    self._stats.num_resumed_requests += 1
        except InvalidRequestError as exc:
            command.admitted.set_exception(exc)
            return
        handle = RequestHandle(request_id, len(command.prompt_ids))
        self._handles[request_id] = handle
        with self._stats_lock:
            self._stats.num_prompt_tokens += len(command.prompt_ids)
        command.admitted.set_result(handle)

    def _cancel(self, request_id: str) -> None:
        if request_id in self._handles and self.engine.abort(request_id):
            self._dispatch([TokenEvent(request_id, None, "", True, "abort")])

    def _dispatch(self, events: list[TokenEvent]) -> None:
        num_new_tokens = 0
        for event in events:
            handle = self._handles.get(event.request_id)
            if handle is None:
                continue
            request = self.engine.requests[event.request_id]
            token_ids = [event.token_id] if event.token_id is not None else []
            num_new_tokens += len(token_ids)
            timing = None
            if event.finished:
                self.engine.pop_finished(event.request_id)
                del self._handles[event.request_id]
                timing = finished_stats(request.stats, len(request.output_ids))
                with self._stats_lock:
                    self._stats.num_requests_finished += 1
                    self._stats.num_prefill_tokens += timing["num_prefill_tokens"]
            pool = self.engine.pool
            handle._outputs.put(Output(
                event.request_id, token_ids, event.text_delta, event.finished, event.finish_reason,
                request.num_prompt_tokens, len(request.output_ids), timing,
                residency_stats(request, pool.bytes_per_slot, pool.num_layers), self._resumable))
        with self._stats_lock:
            self._stats.num_generated_tokens += num_new_tokens

    @property
    def _resumable(self) -> bool:
        return self.engine.host_tier is not None and self.engine.host_tier.resumable

    def _hand_off_all(self) -> None:
        """At the drain deadline: frees requests with no output yet (a client starts them afresh
        elsewhere) and, with a host tier, leaves the others in kvtier (resumable) and gives the
        kvtier lease up so that another decoder may claim them; ends both kinds of stream with
        "handoff". What is left (no host tier, or kvtier failed) ``_abort_all`` aborts."""
        from services.decoder.kv.kvtier_client import KvtierClientError

        log = logging.getLogger(__name__)
        restart = [rid for rid in list(self._handles)
                   if rid in self.engine.requests and not self.engine.requests[rid].output_ids
                   and self.engine.abort(rid)]
        tier = self.engine.host_tier
        handed = [rid for rid in list(self._handles) if rid not in restart and self.engine.hand_off(rid)]
        if tier is not None and (handed or restart):
            try:
                tier.flush()  # the last sealed pages' commits, the restarted requests' frees
                if handed:
                    tier.client.mark_resumable(handed)
                    tier.client.stop_heartbeat()
                    tier.client.detach()  # no live owner any more: another decoder may claim them
            except KvtierClientError as exc:
                log.error("hand-off to kvtier failed (%s): aborting %d requests", exc, len(handed))
                handed = []  # they stay in _handles: _abort_all ends their streams with "abort"
        if handed or restart:
            log.info("handed off %d requests to kvtier, %d to restart elsewhere", len(handed), len(restart))
        self._dispatch([TokenEvent(rid, None, "", True, "handoff") for rid in restart + handed])
        with self._stats_lock:
            self._stats.num_handed_off_requests += len(handed) + len(restart)

    def _abort_all(self) -> None:
        for request_id in list(self._handles):
            try:
                self.engine.abort(request_id)
            except Exception:  # noqa: BLE001 - the engine may be broken; still end the stream
                pass
            handle = self._handles.pop(request_id)
            self.engine.requests.pop(request_id, None)
            handle._outputs.put(Output(request_id, [], "", True, "abort", handle.num_prompt_tokens, 0))
        while True:  # refuse submits that raced with the stop
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(command, _Submit) and command.admitted.set_running_or_notify_cancel():
                command.admitted.set_exception(DrainingError("the decoder stopped"))

    def _publish_stats(self) -> None:
        scheduler = self.engine.scheduler
        with self._stats_lock:
            self._stats.num_running = len(scheduler.running)
            self._stats.num_waiting = len(scheduler.waiting)
            self._stats.num_free_slots = self.engine.allocator.num_free_slots
            live = scheduler.running + list(scheduler.waiting)
            modes = [r.mode.value for r in live]
            self._stats.residency_mode_counts = {"full": modes.count("full"), "sparse": modes.count("sparse")}
            self._stats.request_summaries = {
                r.request_id: {"state": r.status.value, "num_prompt_tokens": r.num_prompt_tokens,
                               "num_output_tokens": len(r.output_ids), "mode": r.mode.value,
                               "num_hot_pages": len(r.hot_slots()),
                               "num_host_pages": len(r.slots), "num_committed_pages": r.num_host_pages}
                for r in live}
