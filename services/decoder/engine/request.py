"""One generation request as the engine tracks it: tokens, page table, status, output text.

Token bookkeeping: ``all_ids = prompt_ids + output_ids``; the hot pool holds K/V of the first
``num_computed_tokens`` of them. A step computes ``all_ids[num_computed_tokens:...]`` and, when
it reaches the end of ``all_ids``, samples one new token. Preemption resets
``num_computed_tokens`` to 0 (recompute) and never drops an output token.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.engine.stop_checker import StopChecker
from services.decoder.kv.sparse_buffer import SparseBuffer
from services.decoder.spec.depth_survival import RequestSurvival


class Residency(enum.Enum):
    """FULL: every page hot (same slot in every layer). SPARSE: only pinned pages (sink, recent
    window, unsealed tail) plus a per-layer LRU buffer of selected pages; the rest on the host."""

    FULL = "full"
    SPARSE = "sparse"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestStats:
    arrival_s: float = field(default_factory=time.perf_counter)
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    num_preemptions: int = 0
    num_host_waits: int = 0  # preemptions because kvtier's host pool was full (backpressure)
    num_prefill_tokens: int = 0  # tokens computed in prefill chunks (recompute included)
    num_swapped_in_pages: int = 0
    num_demotions: int = 0  # FULL -> SPARSE
    num_promotions: int = 0  # SPARSE -> FULL
    num_buffer_hits: int = 0  # SPARSE: selected pages found in the layer's hot buffer
    num_buffer_misses: int = 0  # SPARSE: selected pages copied in from the host tier
    num_verify_steps: int = 0  # decode steps that verified a non-empty draft
    drafted_tokens: int = 0
    accepted_tokens: int = 0

    def as_dict(self, num_output_tokens: int) -> dict:
        prefill_s = (self.first_token_s - self.first_scheduled_s) if self.first_token_s and self.first_scheduled_s else 0.0
        decode_s = (self.finished_s - self.first_token_s) if self.finished_s and self.first_token_s else 0.0
        decode_tokens = max(num_output_tokens - 1, 0)
        return {
            "queue_s": (self.first_scheduled_s - self.arrival_s) if self.first_scheduled_s else 0.0,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
            "num_preemptions": self.num_preemptions,
            "num_host_waits": self.num_host_waits,
            "num_prefill_tokens": self.num_prefill_tokens,
            "num_swapped_in_pages": self.num_swapped_in_pages,
            "num_demotions": self.num_demotions,
            "num_promotions": self.num_promotions,
            "num_buffer_hits": self.num_buffer_hits,
            "num_buffer_misses": self.num_buffer_misses,
            "num_verify_steps": self.num_verify_steps,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            # tokens committed per verify step, bonus token included (as DFlash / DSpark report it)
            "mean_acceptance_length": (
                (self.accepted_tokens + self.num_verify_steps) / self.num_verify_steps if self.num_verify_steps else 0.0
            ),
        }


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        stop_checker: StopChecker,
        max_model_len: int,
    ):
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.stop_checker = stop_checker
        self.max_total_len = min(max_model_len, len(prompt_ids) + params.max_tokens)
        self.slots: list[int] = []  # page table: logical page -> hot-pool slot (-1: not hot, SPARSE only)
        self.digest_rows: list[int] = []  # logical page -> digest row (sparse attention)
        self.mode = Residency.FULL
        self.buffer: SparseBuffer | None = None  # SPARSE only
        self.num_computed_tokens = 0
        self.draft_ids: list[int] = []  # proposed for the next step; never part of the request's tokens
        self.survival: RequestSurvival | None = None  # its drafts' survival vs the pooled profile (set by the Speculator)
        self.num_host_pages = 0  # leading pages whose bytes the host tier holds (written back)
        self.pending_fetch: list[int] = []  # pages to copy host -> their slots before the next forward
        self.promoting = False  # SPARSE -> FULL under way: cold pages are being fetched
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.stats = RequestStats()
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)

    def hot_slots(self) -> list[int]:
        """Every hot-pool slot the request holds: its pinned pages' and (SPARSE) its buffer's."""
        pinned = [slot for slot in self.slots if slot >= 0]
        return pinned + self.buffer.slots if self.buffer is not None else pinned

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_pending_tokens(self) -> int:
        """Tokens whose K/V is not in the pool yet."""
        return self.num_tokens - self.num_computed_tokens

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        prompt_len = len(self.prompt_ids)
        if end <= prompt_len:
            return self.prompt_ids[start:end]
        if start >= prompt_len:
            return self.output_ids[start - prompt_len : end - prompt_len]
        return self.prompt_ids[start:] + self.output_ids[: end - prompt_len]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def text(self) -> str:
        return self.stop_checker.text
