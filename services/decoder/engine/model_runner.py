"""Turns a scheduled batch into one model forward, verifies drafts and samples next tokens.

Token order in the step: decode requests without a draft first, then decode requests with a
draft block (verify), then prefill chunks. Attention: prefill chunks are always dense, one group
each. Decode and verify tokens are dense groups (all plain decodes in one padded group, each
verify block its own causal group) or, with sparse attention, page-list tokens that each attend
over their own selection. Digests are written after acceptance (``seal_pages``), so rejected
draft rows never reach them.
"""

from __future__ import annotations

import torch

from services.decoder.engine.scheduler import ScheduledRequest
from services.decoder.kv.digest_pool import DigestPool
from services.decoder.kv.hot_pool import HotPool
from services.decoder.model.attention import (
    AttentionMetadata,
    PagedAttention,
    PageListTokens,
    SparseParams,
    build_group,
)
from services.decoder.model.llama import LlamaModel
from services.decoder.model.sampler import sample_next
from services.decoder.spec.verify import accept_greedy, accept_sampled


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: HotPool, sparse: SparseParams | None = None):
        self.model = model
        self.pool = pool
        self.page_size = pool.page_size
        self.sparse = sparse
        cfg = model.config
        self.digests = None
        if sparse is not None:
            self.digests = DigestPool(cfg.num_layers, pool.num_slots, cfg.num_kv_heads, cfg.head_dim, pool.dtype)
        self.attention = PagedAttention(pool, cfg.num_heads, model.scale, sparse, self.digests)

    def _within_budget(self, sched: ScheduledRequest) -> bool:
        """True when a sparse selection would hold every page of the request at each of its query
        tokens: then dense attention is that selection, computed with no selection overhead."""
        params = self.sparse
        last_pos = sched.request.num_computed_tokens + sched.num_query_tokens - 1
        return last_pos // self.page_size + 1 <= params.sink_pages + params.top_k_pages + params.recent_pages

    def build_inputs(self, batch: list[ScheduledRequest]) -> tuple[torch.Tensor, AttentionMetadata, list[ScheduledRequest]]:
        """Returns ``input_ids: [num_tokens]``, the attention metadata, and ``batch`` reordered
        to match the token order: dense decodes, dense verify blocks, page-list (sparse) tokens,
        prefill chunks."""
        singles = [s for s in batch if s.num_query_tokens == 1]
        blocks = [s for s in batch if s.draft]
        chunks = [s for s in batch if s.num_new_tokens > 1]
        selecting: list[ScheduledRequest] = []
        if self.sparse is not None:
            selecting = [s for s in singles + blocks if not self._within_budget(s)]
            singles = [s for s in singles if self._within_budget(s)]
            blocks = [s for s in blocks if self._within_budget(s)]
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

        if singles:
            query_positions = [add_tokens(s) for s in singles]
            contexts = [s.request.num_computed_tokens + 1 for s in singles]
            groups.append(build_group(0, query_positions, [s.request.slots for s in singles], contexts, page_size))
        for sched in blocks:
            token_start = len(input_ids)
            pos = add_tokens(sched)
            groups.append(build_group(token_start, [pos], [sched.request.slots], [pos[-1] + 1], page_size))
        page_list = None
        if selecting:
            page_list = self._page_list_tokens(selecting, token_start=len(input_ids))
            for sched in selecting:
                add_tokens(sched)
        for sched in chunks:
            token_start = len(input_ids)
            pos = add_tokens(sched)
            groups.append(build_group(token_start, [pos], [sched.request.slots], [pos[-1] + 1], page_size))
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
        token_req: list[int] = []
        token_pos: list[int] = []
        for row, sched in enumerate(scheds):
            tables[row, : len(sched.request.slots)] = torch.tensor(sched.request.slots, dtype=torch.int64)
            start = sched.request.num_computed_tokens
            token_req.extend([row] * sched.num_query_tokens)
            token_pos.extend(range(start, start + sched.num_query_tokens))
        return PageListTokens(
            token_rows=torch.arange(token_start, token_start + len(token_req), dtype=torch.int64),
            token_req=torch.tensor(token_req, dtype=torch.int64),
            token_pos=torch.tensor(token_pos, dtype=torch.int64),
            page_tables=tables,
        )

    def execute(self, batch: list[ScheduledRequest]) -> dict[str, list[int]]:
        """Runs one forward over ``batch``; returns ``{request_id: committed tokens}`` for every
        request that reached the end of its tokens (one sampled token, or accepted draft tokens
        plus one). Does not mutate request bookkeeping."""
        input_ids, meta, ordered = self.build_inputs(batch)
        logit_rows: list[int] = []
        samplers: list[ScheduledRequest] = []
        offset = 0
        for sched in ordered:
            offset += sched.num_query_tokens
            if sched.samples:
                logit_rows.extend(range(offset - 1 - len(sched.draft), offset))
                samplers.append(sched)
        logits = self.model.forward(
            input_ids, meta, self.attention, logit_rows=torch.tensor(logit_rows, dtype=torch.int64)
        )  # [len(logit_rows), vocab]
        if not samplers:
            return {}
        greedy_ids = torch.argmax(logits, dim=-1).tolist()
        committed: dict[str, list[int]] = {}
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
        return committed

    def seal_pages(self, slots: list[int]) -> None:
        """Digests (every layer) the pages at ``slots``, whose rows are all committed now."""
        if self.digests is None or not slots:
            return
        index = torch.tensor(slots, dtype=torch.int64)
        for layer in range(self.pool.num_layers):
            self.digests.seal(layer, self.pool.k[layer], index, index)
