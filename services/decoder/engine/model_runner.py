"""Turns a scheduled batch into one model forward, verifies drafts and samples next tokens.

Token order in the step: decode requests without a draft first, then decode requests with a
draft block (verify), then prefill chunks. Attention: prefill chunks are always dense, one group
each. Decode and verify tokens are dense groups (plain decodes and verify blocks of up to
``SMALL_QUERY_TOKENS`` tokens in one ragged causal group, longer blocks one group per length) or,
with sparse attention, page-list tokens that each attend over their own selection. Digests are
written after acceptance (``seal_pages``), so rejected draft rows never reach them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from services.decoder.engine.request import Request, Residency
from services.decoder.engine.scheduler import ScheduledRequest
from services.decoder.kv.digest_pool import DigestPool
from services.decoder.kv.host_tier import HostTier
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.sparse_step import SelectionObserver, SparseStep
from services.decoder.model.attention import (
    DIGEST_ROWS_PER_PAGE,
    SMALL_QUERY_TOKENS,
    AttentionMetadata,
    AttentionWork,
    PagedAttention,
    PageListTokens,
    SparseParams,
    build_group,
)
from services.decoder.model.llama import LlamaModel
from services.decoder.model.sampler import sample_next
from services.decoder.spec.verify import accept_greedy, accept_sampled


@dataclass
class StepOutput:
    committed: dict[str, list[int]] = field(default_factory=dict)  # request id -> committed tokens
    # with ``capture_layers``: ``[num_tokens, len(capture_layers) * hidden]`` and each request's
    # first row in it (its rows are consecutive, in position order)
    features: torch.Tensor | None = None
    first_row: dict[str, int] = field(default_factory=dict)
    attention: AttentionWork = field(default_factory=AttentionWork)  # the step's decode / verify attention


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: HotPool, sparse: SparseParams | None = None):
        self.model = model
        self.capture_layers: tuple[int, ...] = ()  # a drafter's feature layers (``StepOutput.features``)
        self.pool = pool
        self.page_size = pool.page_size
        self.sparse = sparse
        cfg = model.config
        self.digests = None
        if sparse is not None:
            self.digests = DigestPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, pool.dtype, pool.num_slots,
                                      page_score=sparse.page_score)
        self.host_tier: HostTier | None = None  # see attach_host_tier
        # benchmarks.selection_trace: sees every SPARSE request's working set per layer (None: off)
        self.selection_observer: SelectionObserver | None = None
        # every decode / verify token of a sparse engine takes the page-list path, even within the
        # selection budget (the verify budget's start-up profile times that path this way)
        self.force_selection = False
        self.attention = PagedAttention(pool, cfg.num_heads, model.scale, sparse, self.digests)

    def attach_host_tier(self, host_tier: HostTier) -> None:
        """SPARSE requests read cold pages from ``host_tier`` (no reference back to this runner:
        an engine must stay free of cycles, or its hot pool outlives it until a GC pass)."""
        self.host_tier = host_tier
        self.attention.host_layer = host_tier.client.host_pages

    def ensure_digest_rows(self, batch: list[ScheduledRequest]) -> None:
        """Gives every logical page of the scheduled requests a digest row."""
        if self.digests is None:
            return
        for sched in batch:
            request = sched.request
            missing = len(request.slots) - len(request.digest_rows)
            if missing > 0:
                request.digest_rows.extend(self.digests.allocate(missing))

    def release_digest_rows(self, request) -> None:
        if self.digests is not None and request.digest_rows:
            self.digests.free(request.digest_rows)
        request.digest_rows = []

    def _within_budget(self, sched: ScheduledRequest) -> bool:
        """True when a sparse selection would hold every page of the request at each of its query
        tokens: then dense attention is that selection, computed with no selection overhead."""
        last_pos = sched.request.num_computed_tokens + sched.num_query_tokens - 1
        return last_pos // self.page_size + 1 <= self._selection_pages

    @property
    def _selection_pages(self) -> int:
        params = self.sparse
        return params.sink_pages + params.top_k_pages + params.recent_pages

    def _selects(self, sched: ScheduledRequest) -> bool:
        """Whether the request's decode / verify tokens attend over their own selections (page-list
        tokens): every SPARSE request, and a FULL one beyond the selection budget."""
        if self.sparse is None:
            return False
        return self.force_selection or not (sched.request.mode is Residency.FULL and self._within_budget(sched))

    def query_key_rows(self, request: Request) -> tuple[str, int]:
        """What one decode / verify query token of ``request`` attends next step, summed over
        layers as ``AttentionWork`` counts it: ``("page_list", selected rows + digest rows)`` or
        ``("dense", context rows)``."""
        context_len = request.num_computed_tokens + 1
        num_layers = self.pool.num_layers
        if not self._selects(ScheduledRequest(request, 1, [])):
            return "dense", num_layers * context_len
        num_pages = -(-context_len // self.page_size)
        per_layer = min(num_pages, self._selection_pages) * self.page_size + DIGEST_ROWS_PER_PAGE * num_pages
        return "page_list", num_layers * per_layer

    def _recomputes_output(self, sched: ScheduledRequest) -> bool:
        return self.sparse is not None and sched.request.num_computed_tokens >= len(sched.request.prompt_ids)

    def build_inputs(self, batch: list[ScheduledRequest]) -> tuple[torch.Tensor, AttentionMetadata, list[ScheduledRequest]]:
        """Returns ``input_ids: [num_tokens]``, the attention metadata, and ``batch`` reordered
        to match the token order: dense decodes, dense verify blocks, page-list (sparse) tokens,
        prefill chunks."""
        singles = [s for s in batch if s.num_query_tokens == 1]
        # under sparse attention, recomputed generated tokens go where their decode steps went
        # (``Scheduler._recompute_cap``): a chunk of them is a block, prompt chunks stay dense
        blocks = [s for s in batch if s.draft or (s.num_new_tokens > 1 and self._recomputes_output(s))]
        chunks = [s for s in batch if s.num_new_tokens > 1 and not self._recomputes_output(s)]
        selecting: list[ScheduledRequest] = []
        if self.sparse is not None:
            selects = {id(s): self._selects(s) for s in singles + blocks}
            selecting = [s for s in singles + blocks if selects[id(s)]]
            singles = [s for s in singles if not selects[id(s)]]
            blocks = [s for s in blocks if not selects[id(s)]]
        blocks.sort(key=lambda s: s.num_query_tokens)  # equal-length blocks side by side: one group each length
        ordered = singles + blocks + selecting + chunks
        input_ids: list[int] = []
        positions: list[int] = []
        write_rows: list[int] = []
        groups = []
        page_size = self.page_size

        def add_tokens(sched: ScheduledRequest) -> list[int]:
            request = sched.request
            start = request.num_computed_tokens
            end = start + sched.num_new_tokens
            input_ids.extend(request.token_ids_slice(start, end) + sched.draft)
            pos = list(range(start, end + len(sched.draft)))
            positions.extend(pos)
            write_rows.extend(request.slots[p // page_size] * page_size + p % page_size for p in pos)
            return pos

        # blocks are sorted by length: the short ones follow the singles at the head of ``ordered``
        short = singles + [s for s in blocks if s.num_query_tokens <= SMALL_QUERY_TOKENS]
        long_blocks = [s for s in blocks if s.num_query_tokens > SMALL_QUERY_TOKENS]
        if short:
            query_positions = [add_tokens(s) for s in short]
            groups.append(build_group(0, query_positions, [s.request.slots for s in short],
                                      [pos[-1] + 1 for pos in query_positions], page_size))
        for _, run in itertools.groupby(long_blocks, key=lambda s: s.num_query_tokens):
            same = list(run)
            token_start = len(input_ids)
            query_positions = [add_tokens(s) for s in same]
            groups.append(build_group(token_start, query_positions, [s.request.slots for s in same],
                                      [pos[-1] + 1 for pos in query_positions], page_size))
        page_list = None
        if selecting:
            page_list = self._page_list_tokens(selecting, token_start=len(input_ids))
            for sched in selecting:
                add_tokens(sched)
        for sched in chunks:
            token_start = len(input_ids)
            pos = add_tokens(sched)
            request = sched.request
            host = [self.host_tier.host_pages[request.request_id]] if request.mode is Residency.SPARSE else None
            groups.append(build_group(token_start, [pos], [request.slots], [pos[-1] + 1], page_size, host,
                                      is_prefill=True))
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.int64),
            write_rows=torch.tensor(write_rows, dtype=torch.int64),
            groups=groups,
            page_list=page_list,
        )
        return torch.tensor(input_ids, dtype=torch.int64), meta, ordered

    def _page_list_tokens(self, scheds: list[ScheduledRequest], token_start: int) -> PageListTokens:
        """The requests' tokens occupy step rows from ``token_start`` on, request-major."""
        max_pages = max(len(s.request.slots) for s in scheds)
        tables = torch.full((len(scheds), max_pages), -1, dtype=torch.int64)
        digest_rows = torch.full((len(scheds), max_pages), -1, dtype=torch.int64)
        token_req: list[int] = []
        token_pos: list[int] = []
        sparse_rows: list[int] = []
        for row, sched in enumerate(scheds):
            request = sched.request
            tables[row, : len(request.slots)] = torch.tensor(request.slots, dtype=torch.int64)
            # a preempted request keeps its digest rows while it computes its pages again: only
            # the pages it holds slots for now are rows of this step (later ones are not candidates)
            rows = request.digest_rows[:max_pages]
            digest_rows[row, : len(rows)] = torch.tensor(rows, dtype=torch.int64)
            if request.mode is Residency.SPARSE:
                sparse_rows.append(row)
            start = request.num_computed_tokens
            token_req.extend([row] * sched.num_query_tokens)
            token_pos.extend(range(start, start + sched.num_query_tokens))
        sparse = None
        if sparse_rows:
            requests = [scheds[row].request for row in sparse_rows]
            sparse = SparseStep(sparse_rows, [r.buffer for r in requests],
                                [self.host_tier.host_pages[r.request_id] for r in requests], self.pool,
                                self.host_tier.client.host_pages, owners=requests,
                                observer=self.selection_observer)
        return PageListTokens(
            token_rows=torch.arange(token_start, token_start + len(token_req), dtype=torch.int64),
            token_req=torch.tensor(token_req, dtype=torch.int64),
            token_pos=torch.tensor(token_pos, dtype=torch.int64),
            page_tables=tables,
            digest_rows=digest_rows,
            sparse=sparse,
        )

    def execute(self, batch: list[ScheduledRequest]) -> StepOutput:
        """Runs one forward over ``batch``; returns the committed tokens of every request that
        reached the end of its tokens (one sampled token, or accepted draft tokens plus one) and
        the captured features. Does not mutate request bookkeeping."""
        self.ensure_digest_rows(batch)
        input_ids, meta, ordered = self.build_inputs(batch)
        out = StepOutput()
        self.attention.work = out.attention
        device = self.model.device
        if device.type != "cpu":  # built on the host, moved once
            input_ids, meta = input_ids.to(device, non_blocking=True), meta.to(device)
        logit_rows: list[int] = []
        samplers: list[ScheduledRequest] = []
        offset = 0
        for sched in ordered:
            out.first_row[sched.request.request_id] = offset
            offset += sched.num_query_tokens
            if sched.samples:
                logit_rows.extend(range(offset - 1 - len(sched.draft), offset))
                samplers.append(sched)
        logits = self.model.forward(
            input_ids, meta, self.attention, logit_rows=torch.tensor(logit_rows, dtype=torch.int64).to(device),
            capture_layers=self.capture_layers,
        )  # [len(logit_rows), vocab]
        if self.capture_layers:
            logits, out.features = logits
        if meta.page_list is not None and meta.page_list.sparse is not None:
            step = meta.page_list.sparse
            out.attention.fetch_s = step.fetch_s
            for request, hits, misses in zip(step.owners, step.hits, step.misses):
                request.stats.num_buffer_hits += hits
                request.stats.num_buffer_misses += misses
        if not samplers:
            return out
        greedy_ids = torch.argmax(logits, dim=-1).tolist()
        if device.type != "cpu" and not all(s.request.params.greedy for s in samplers):
            logits = logits.cpu()  # sampling draws from the requests' (host) generators
        committed = out.committed
        row = 0
        for sched in samplers:
            request, draft = sched.request, sched.draft
            rows = slice(row, row + len(draft) + 1)
            row += len(draft) + 1
            params = request.params
            if params.greedy:
                committed[request.request_id] = accept_greedy(greedy_ids[rows], draft)
            elif draft:
                committed[request.request_id] = accept_sampled(
                    logits[rows], draft, params.temperature, params.top_k, params.top_p, request.generator
                )
            else:
                committed[request.request_id] = [
                    sample_next(logits[rows.start], params.temperature, params.top_k, params.top_p, request.generator)
                ]
        return out

    def seal_from_host(self, request: Request, host_page_ids: list[int]) -> None:
        """Digests (every layer) the request's leading pages straight from their host pages:
        a resumed request's digests, without bringing the pages hot."""
        if self.digests is None or not host_page_ids:
            return
        missing = len(host_page_ids) - len(request.digest_rows)
        if missing > 0:
            request.digest_rows.extend(self.digests.allocate(missing))
        pages = torch.tensor(host_page_ids, dtype=torch.int64)
        rows = torch.tensor(request.digest_rows[: len(host_page_ids)], dtype=torch.int64)
        for layer in range(self.pool.num_layers):
            self.digests.seal(layer, self.host_tier.client.host_pages(layer)[0], pages, rows)

    def seal_pages(self, pages: list[tuple[Request, int]]) -> None:
        """Digests (every layer) the hot ``(request, logical page)`` pages, whose rows are all
        committed now, into the pages' digest rows."""
        if self.digests is None or not pages:
            return
        slots = torch.tensor([r.slots[p] for r, p in pages], dtype=torch.int64)
        rows = torch.tensor([r.digest_rows[p] for r, p in pages], dtype=torch.int64)
        for layer in range(self.pool.num_layers):
            self.digests.seal(layer, self.pool.k[layer], slots, rows)
