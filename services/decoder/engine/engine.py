"""The in-process engine: add requests, step, stream outputs, abort. Single-threaded: one caller
drives ``step()``; servers feed it through a queue."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.decoder.config import DecoderConfig
from services.decoder.host_allocator import keep_freed_memory_in_heap
from services.decoder.engine.host_sync import (
    lost_requests,
    swap_in,
    sync_with_backpressure,
)
from services.decoder.engine.model_runner import ModelRunner
from services.decoder.engine.request import Request, RequestStatus, Residency
from services.decoder.engine.residency_controller import (
    ResidencyController,
    ResidencySettings,
)
from services.decoder.engine.sampling_params import InvalidRequestError, SamplingParams
from services.decoder.engine.scheduler import Scheduler
from services.decoder.engine.drafter_build import build_drafter
from services.decoder.engine.speculation import Speculator
from services.decoder.engine.step_profile import profile_engine
from services.decoder.engine.stop_checker import StopChecker
from services.decoder.kv.host_tier import HostTier
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.kvtier_client import KvLayout, KvtierClient, KvtierClientError
from services.decoder.kv.slot_allocator import SlotAllocator
from services.decoder.model.attention import SparseParams
from services.decoder.model.llama import LlamaModel
from services.decoder.model.loader import LoadedModel, load_model
from services.decoder.model.model_store import resolve_model_path
from services.decoder.spec.drafter import Drafter
from services.rpc.auth import InternalSecurity


@dataclass
class TokenEvent:
    """What one step produced for one request (streaming unit)."""

    request_id: str
    token_id: int | None  # None when the request finished without a new token (abort)
    text_delta: str
    finished: bool
    finish_reason: str | None


class Engine:
    def __init__(self, config: DecoderConfig | None = None, loaded: LoadedModel | None = None):
        self.config = config or DecoderConfig()
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        keep_freed_memory_in_heap()
        if self.config.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device={self.config.device!r}, but torch sees no CUDA device here")
        if loaded is None:
            loaded = load_model(resolve_model_path(self.config.model), dtype=self.config.torch_dtype)
        self.loaded = loaded
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        trained_len = loaded.config.max_position_embeddings
        self.max_model_len = self.config.max_model_len or trained_len
        if self.max_model_len > trained_len and not self.config.allow_long_context:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's trained context of {trained_len} "
                "tokens; set allow_long_context=True to run past it (outputs degrade: throughput tests only)"
            )
        self.model = LlamaModel(loaded.config, loaded.weights, self.config.torch_dtype, self.config.gemm_kernels,
                                max_positions=max(self.max_model_len, trained_len), device=self.config.device,
                                gemm_dtype=self.config.torch_gemm_dtype)
        mc = loaded.config
        cfg = self.config
        self.full_only = cfg.residency_policy == "always-full"
        if self.full_only and cfg.num_slots * cfg.page_size < self.max_model_len:
            raise ValueError(
                f"the KV pool holds {cfg.num_slots * cfg.page_size} tokens, less than one "
                f"max_model_len={self.max_model_len} sequence: raise kv_cache_tokens or lower max_model_len"
            )
        # a SPARSE request needs its buffer, sink and recent pages and one chunk's pages hot
        min_sparse_slots = (cfg.buffer_pages + cfg.sink_pages + cfg.recent_pages
                            + -(-cfg.max_num_batched_tokens // cfg.page_size) + 1)
        if not self.full_only and cfg.num_slots < min_sparse_slots:
            raise ValueError(
                f"residency={cfg.residency_policy!r} needs at least {min_sparse_slots} slots for one SPARSE "
                f"request (buffer {cfg.buffer_pages} + sink + recent + one prefill chunk), the pool has "
                f"{cfg.num_slots}: raise kv_cache_tokens or lower sparse_buffer_pages / max_num_batched_tokens"
            )
        self.pool = HotPool(mc.num_layers, self.config.num_slots, self.config.page_size, mc.num_kv_heads,
                            mc.head_dim, self.config.torch_dtype, self.config.device)
        self.allocator = SlotAllocator(self.config.num_slots)
        self.controller = ResidencyController(ResidencySettings(
            policy=cfg.residency_policy, page_size=cfg.page_size, num_layers=mc.num_layers,
            sink_pages=cfg.sink_pages, recent_pages=cfg.recent_pages, buffer_pages=cfg.buffer_pages,
            low_watermark_slots=int(cfg.residency_low_watermark * cfg.num_slots),
            high_watermark_slots=max(int(cfg.residency_high_watermark * cfg.num_slots),
                                     int(cfg.residency_low_watermark * cfg.num_slots) + 1),
            promote_pages_per_step=cfg.promote_pages_per_step,
        ), self.allocator)
        self.scheduler = Scheduler(self.controller, cfg.page_size, cfg.max_num_seqs, cfg.max_num_batched_tokens,
                                   cfg.recent_pages if cfg.attention == "sparse" else None)
        sparse = None
        if self.config.attention == "sparse":
            sparse = SparseParams(self.config.top_k_pages, self.config.sink_pages, self.config.recent_pages,
                                  self.config.page_score)
        self.runner = ModelRunner(self.model, self.pool, sparse)
        self.host_tier: HostTier | None = None
        if self.config.kvtier_address:
            client = KvtierClient(self.config.kvtier_address, self.config.decoder_id, self.config.model_id,
                                  KvLayout.of_hot_pool(self.pool), security=InternalSecurity.of(self.config))
            self.host_tier = HostTier(client, self.pool, resumable=self.config.resumable_requests)
            self.runner.attach_host_tier(self.host_tier)
        self.speculator: Speculator | None = None
        drafter = build_drafter(self.config, self.model)
        self.attach_drafter(drafter, self.config.spec_tokens)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        if drafter is not None and self.config.verify_budget == "adaptive":
            self.speculator.profile = profile_engine(self)

    def attach_drafter(self, drafter: Drafter | None, spec_tokens: int) -> None:
        """Installs (or with None removes) the drafter, and has the runner capture the target
        layers it conditions on. Drafter training's feature recorder attaches itself this way."""
        self.speculator = None if drafter is None else Speculator(drafter, spec_tokens, self.runner.query_key_rows)
        self.runner.capture_layers = () if drafter is None else drafter.feature_layers

    # ---- requests -------------------------------------------------------------------------
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> str:
        """Validates and queues a request. Raises ``InvalidRequestError`` and changes nothing on bad input."""
        request = self._new_request(prompt_ids, params, request_id)
        self.requests[request.request_id] = request
        self.scheduler.add(request)
        return request.request_id

    def resume_request(self, request_id: str, prompt_ids: list[int], output_ids: list[int],
                       params: SamplingParams, num_streamed_chars: int | None = None) -> str:
        """Continues a request another decoder (or this one before a restart) left in kvtier:
        claims its host pages, copies its committed pages back instead of recomputing them and
        goes on after ``output_ids`` (the tokens already delivered; they count towards
        ``max_tokens`` and are not streamed again; ``num_streamed_chars``: how much of their text
        the client got, when some was held back as a possible stop string). Raises
        ``InvalidRequestError`` (nothing changed) without a host tier or if the request is unknown
        to kvtier."""
        if self.host_tier is None:
            raise InvalidRequestError("resuming needs a kvtier host tier (kvtier_address)")
        request = self._new_request(prompt_ids, params, request_id)
        for token_id in output_ids:
            request.output_ids.append(int(token_id))
            if request.stop_checker.append(int(token_id)) is not None or request.num_tokens >= request.max_total_len:
                raise InvalidRequestError(f"request {request_id!r} already finished within its output tokens")
        request.stop_checker.take_stream_delta(finished=False)  # delivered before: not streamed again
        if num_streamed_chars is not None:
            request.stop_checker.num_streamed_chars = min(num_streamed_chars, len(request.stop_checker.text))
        try:
            pages = self.host_tier.claim(request_id)
        except KvtierClientError as exc:
            raise InvalidRequestError(f"cannot resume {request_id!r}: {exc.detail}") from exc
        page_size = self.config.page_size
        request.num_host_pages = min(pages.num_committed_pages, request.num_tokens // page_size)
        # at least the last token is computed again: its logits give the next token
        request.num_computed_tokens = min(request.num_host_pages * page_size, request.num_tokens - 1)
        self.runner.seal_from_host(request, self.host_tier.host_pages[request_id][: request.num_host_pages])
        self.requests[request_id] = request
        self.scheduler.add(request)
        return request_id

    def _new_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None) -> Request:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams")
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise InvalidRequestError("prompt is empty")
        if any(not 0 <= t < self.model_config.vocab_size for t in prompt_ids):
            raise InvalidRequestError(f"prompt has token ids outside [0, {self.model_config.vocab_size})")
        if len(prompt_ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt has {len(prompt_ids)} tokens; the model context is {self.max_model_len} "
                "(prompt plus at least one generated token must fit)"
            )
        pages_needed = -(-(len(prompt_ids) + 1) // self.config.page_size)
        if self.full_only and pages_needed > self.config.num_slots:
            raise InvalidRequestError(
                f"prompt needs {pages_needed} pages but the KV pool has {self.config.num_slots} "
                f"(kv_cache_tokens={self.config.kv_cache_tokens})"
            )
        if self.host_tier is not None:
            max_pages = -(-min(len(prompt_ids) + params.max_tokens, self.max_model_len) // self.config.page_size)
            if max_pages > self.host_tier.client.host_pool.num_host_pages:
                raise InvalidRequestError(
                    f"prompt plus max_tokens needs up to {max_pages} pages but kvtier's host pool has "
                    f"{self.host_tier.client.host_pool.num_host_pages}: lower max_tokens or grow the host pool"
                )
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        stop_checker = StopChecker(self.tokenizer, params, self.model_config.eos_token_ids)
        return Request(request_id, prompt_ids, params, stop_checker, self.max_model_len)

    def abort(self, request_id: str) -> bool:
        """Cancels a request, freeing every slot it holds. Returns False if it is unknown or done."""
        request = self.requests.get(request_id)
        if request is None or request.is_finished:
            return False
        self._finish(request, "abort")
        return True

    def hand_off(self, request_id: str) -> bool:
        """Stops a running request without freeing its kvtier pages, so that a decoder can
        ``resume_request`` it (a drain hand-off): its hot slots are freed, its committed host pages
        stay (the pending commit goes with the next kvtier call). The request ends with
        finish_reason "handoff". Returns False (nothing changed) without a host tier, or if the
        request is unknown, done or has no output yet (nothing to resume: abort it instead)."""
        request = self.requests.get(request_id)
        if self.host_tier is None or request is None or request.is_finished or not request.output_ids:
            return False
        self.scheduler.remove(request)
        if self.speculator is not None:
            self.speculator.release(request)
        self.runner.release_digest_rows(request)
        self.host_tier.host_pages.pop(request_id, None)  # kvtier keeps them; a pending commit is still sent
        self.host_tier.num_sealed.pop(request_id, None)
        request.status = RequestStatus.FINISHED
        request.finish_reason = "handoff"
        request.stats.finished_s = time.perf_counter()
        return True

    def pop_finished(self, request_id: str) -> Request:
        """Removes a finished request from the engine's table and returns it."""
        request = self.requests[request_id]
        if not request.is_finished:
            raise ValueError(f"request {request_id!r} is not finished")
        return self.requests.pop(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    # ---- stepping -------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, self.scheduler.prefill_tokens())
        running = self.scheduler.running
        self.controller.relieve(running)  # below the low watermark: demote before scheduling
        batch = self.scheduler.schedule()
        lost: list[TokenEvent] = []
        if self.host_tier is not None:
            batch = sync_with_backpressure(self.host_tier, self.scheduler, batch)
            for request in lost_requests(self.host_tier, self.requests):
                self._finish(request, "abort")
                lost.append(TokenEvent(request.request_id, None, "", True, "abort"))
            batch = [s for s in batch if not s.request.is_finished]
        for request, pages in self.controller.promotion_step(running, len(self.scheduler.waiting)):
            self.host_tier.fetch(request.request_id, pages, [request.slots[p] for p in pages])
            self.controller.finish_promotion(request)
        if not batch:
            return lost
        swap_in(self.host_tier, batch)
        now = time.perf_counter()
        for sched in batch:
            if sched.request.stats.first_scheduled_s is None:
                sched.request.stats.first_scheduled_s = now
            if sched.num_new_tokens > 1:
                sched.request.stats.num_prefill_tokens += sched.num_new_tokens
        output = self.runner.execute(batch)
        if self.speculator is not None:
            decoded = None
            if all(s.num_new_tokens == 1 for s in batch):
                decoded = (len(batch), sum(len(t) for t in output.committed.values()))
            self.speculator.observe_step(sum(s.num_query_tokens for s in batch), time.perf_counter() - now,
                                         output.attention, decoded)
        committed = output.committed
        events: list[TokenEvent] = []
        observed: list[tuple[Request, int]] = []  # (request, first position committed this step)
        sealed: list[tuple[Request, int]] = []  # (request, logical page)
        page_size = self.config.page_size
        for sched in batch:
            request = sched.request
            request.draft_ids = []
            tokens = committed.get(request.request_id)
            old_computed = request.num_computed_tokens
            # K/V of the step's tokens and of the accepted draft tokens are valid
            request.num_computed_tokens += sched.num_new_tokens + (len(tokens) - 1 if tokens else 0)
            if sched.draft:
                request.stats.num_verify_steps += 1
                request.stats.drafted_tokens += len(sched.draft)
                request.stats.accepted_tokens += len(tokens) - 1
                self.speculator.record(request, len(sched.draft), len(tokens) - 1)
            for token_id in tokens or []:
                self._append_token(request, token_id, events)
                if request.is_finished:
                    break
            if not request.is_finished:
                observed.append((request, old_computed))
            if not request.is_finished:
                # pages whose last row is committed now; rows of rejected drafts never count
                sealed.extend((request, page) for page in range(old_computed // page_size,
                                                                request.num_computed_tokens // page_size))
        if self.speculator is not None:
            self.speculator.observe(observed, output.features, output.first_row)
        self.runner.seal_pages(sealed)
        if self.host_tier is not None:
            self.host_tier.write_back([(r.request_id, p, r.slots[p]) for r, p in sealed])
            for sched in batch:
                request = sched.request
                if not request.is_finished:
                    request.num_host_pages = self.host_tier.num_sealed.get(request.request_id, 0)
                    self.controller.trim(request)  # SPARSE: unpin pages that left the recent window
        return lost + events

    def _append_token(self, request: Request, token_id: int, events: list[TokenEvent]) -> None:
        request.output_ids.append(token_id)
        if request.stats.first_token_s is None:
            request.stats.first_token_s = time.perf_counter()
        reason = request.stop_checker.append(token_id)
        if reason is None and request.num_tokens >= request.max_total_len:
            reason = "length"
        if reason is not None:
            self._finish(request, reason)
        delta = request.stop_checker.take_stream_delta(finished=request.is_finished)
        events.append(TokenEvent(request.request_id, token_id, delta, request.is_finished, request.finish_reason))

    def _finish(self, request: Request, reason: str) -> None:
        self.scheduler.remove(request)
        if self.speculator is not None:
            self.speculator.release(request)
        self.runner.release_digest_rows(request)
        if self.host_tier is not None:
            self.host_tier.release(request.request_id)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        request.stop_checker.finish(reason)
        request.stats.finished_s = time.perf_counter()

    def run_until_done(self, on_event: Callable[[TokenEvent], None] | None = None) -> None:
        while self.has_unfinished():
            for event in self.step():
                if on_event is not None:
                    on_event(event)
        if self.host_tier is not None:
            self.host_tier.flush()

    def close(self) -> None:
        """Flushes pending kvtier commits and frees, stops the lease heartbeat, unmaps the host pool."""
        if self.host_tier is not None:
            self.host_tier.flush()
            self.host_tier.client.close()
            self.host_tier = None
            self.runner.host_tier = None
            self.runner.attention.host_layer = None

    def check_integrity(self) -> bool:
        """Slots held by live requests (pinned pages and SPARSE buffers) plus free slots partition
        the pool exactly; every SPARSE buffer is consistent; digest rows do not leak."""
        self.allocator.check_integrity()
        live = self.scheduler.running + list(self.scheduler.waiting)
        held = [s for r in live for s in r.hot_slots()]
        assert len(held) == len(set(held)), "a slot is held by two requests"
        assert set(held).isdisjoint(self.allocator.free_slot_order()), "a held slot is also free"
        assert len(held) + self.allocator.num_free_slots == self.allocator.num_slots, "slots leaked"
        for request in live:
            if request.mode is Residency.SPARSE:
                request.buffer.check_integrity({p: s for p, s in enumerate(request.slots) if s >= 0})
            else:
                assert request.buffer is None, f"FULL request {request.request_id} holds a buffer"
        for request in self.requests.values():
            if request.is_finished:
                assert not request.slots, f"finished request {request.request_id} still holds slots"
                assert not request.digest_rows, f"finished request {request.request_id} still holds digest rows"
        if self.runner.digests is not None:
            self.runner.digests.check_integrity([row for r in self.requests.values() for row in r.digest_rows])
        return True
