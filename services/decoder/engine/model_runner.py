"""Turns a scheduled batch into one model forward and samples the next tokens.

Token order in the step: single-token requests first (one padded dense decode group, or with
sparse attention page-list tokens that each attend over their own selection), then each
multi-token request (a prefill chunk, always dense) as its own group. With sparse attention, pages whose last row is written in a step are digested in it.
"""

from __future__ import annotations

import torch

from services.decoder.engine.scheduler import ScheduledRequest
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.digest_pool import DigestPool
from services.decoder.model.attention import (
    AttentionMetadata,
    PagedAttention,
    SparseParams,
    PageListTokens,
    build_group,
)
from services.decoder.model.llama import LlamaModel
from services.decoder.model.sampler import sample_next


class ModelRunner:
    def __init__(self, model: LlamaModel, pool: HotPool, sparse: SparseParams | None = None):
        self.model = model
        self.pool = pool
        self.page_size = pool.page_size
        self.sparse = sparse
        cfg = model.config
        digests = None
        if sparse is not None:
            digests = DigestPool(cfg.num_layers, pool.num_slots, cfg.num_kv_heads, cfg.head_dim, pool.dtype)
        self.attention = PagedAttention(pool, cfg.num_heads, model.scale, sparse, digests)

    def build_inputs(self, batch: list[ScheduledRequest]) -> tuple[torch.Tensor, AttentionMetadata, list[ScheduledRequest]]:
        """Returns ``input_ids: [num_tokens]``, the attention metadata, and ``batch`` reordered
        to match the token order."""
        decodes = [s for s in batch if s.num_new_tokens == 1]
        chunks = [s for s in batch if s.num_new_tokens > 1]
        ordered = decodes + chunks
        input_ids: list[int] = []
        positions: list[int] = []
        write_rows: list[int] = []
        groups = []
        page_size = self.page_size

        def add_tokens(sched: ScheduledRequest) -> list[int]:
            request = sched.request
            start = request.num_computed_tokens
            end = start + sched.num_new_tokens
            input_ids.extend(request.token_ids_slice(start, end))
            pos = list(range(start, end))
            positions.extend(pos)
            write_rows.extend(request.slots[p // page_size] * page_size + p % page_size for p in pos)
            return pos

        if decodes and self.sparse is not None:
            for sched in decodes:
                add_tokens(sched)
        elif decodes:
            query_positions = [add_tokens(s) for s in decodes]
            groups.append(
                build_group(
                    0,
                    query_positions,
                    [s.request.slots for s in decodes],
                    [s.request.num_computed_tokens + 1 for s in decodes],
                    page_size,
                )
            )
        for sched in chunks:
            token_start = len(input_ids)
            pos = add_tokens(sched)
            groups.append(build_group(token_start, [pos], [sched.request.slots], [pos[-1] + 1], page_size))
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.int64),
            write_rows=torch.tensor(write_rows, dtype=torch.int64),
            groups=groups,
            page_list=self._page_list_tokens(decodes) if decodes and self.sparse is not None else None,
            sealed_slots=self._sealed_slots(ordered) if self.sparse is not None else None,
        )
        return torch.tensor(input_ids, dtype=torch.int64), meta, ordered

    def _page_list_tokens(self, decodes: list[ScheduledRequest]) -> PageListTokens:
        """Decode tokens occupy step rows ``0 .. len(decodes) - 1``, request-major."""
        max_pages = max(len(s.request.slots) for s in decodes)
        tables = torch.full((len(decodes), max_pages), -1, dtype=torch.int64)
        for row, sched in enumerate(decodes):
            tables[row, : len(sched.request.slots)] = torch.tensor(sched.request.slots, dtype=torch.int64)
        return PageListTokens(
            token_rows=torch.arange(len(decodes), dtype=torch.int64),
            token_req=torch.arange(len(decodes), dtype=torch.int64),
            token_pos=torch.tensor([s.request.num_computed_tokens for s in decodes], dtype=torch.int64),
            page_tables=tables,
        )

    def _sealed_slots(self, batch: list[ScheduledRequest]) -> torch.Tensor:
        """Slots of pages whose last row (position ``(p + 1) * page_size - 1``) is written this step."""
        page_size = self.page_size
        sealed = []
        for sched in batch:
            start = sched.request.num_computed_tokens
            end = start + sched.num_new_tokens
            first_page = start // page_size
            for page in range(first_page, end // page_size):
                sealed.append(sched.request.slots[page])
        return torch.tensor(sealed, dtype=torch.int64)

    def execute(self, batch: list[ScheduledRequest]) -> dict[str, int]:
        """Runs one forward over ``batch``; returns ``{request_id: sampled token}`` for every
        request that reached the end of its tokens. Does not mutate request bookkeeping."""
        input_ids, meta, ordered = self.build_inputs(batch)
        logit_rows: list[int] = []
        samplers: list[ScheduledRequest] = []
        offset = 0
        for sched in ordered:
            offset += sched.num_new_tokens
            if sched.samples:
                logit_rows.append(offset - 1)
                samplers.append(sched)
        if not samplers:
            self.model.forward(input_ids, meta, self.attention, logit_rows=torch.tensor([], dtype=torch.int64))
            return {}
        logits = self.model.forward(
            input_ids, meta, self.attention, logit_rows=torch.tensor(logit_rows, dtype=torch.int64)
        )  # [num_samplers, vocab]
        sampled: dict[str, int] = {}
        greedy_ids = torch.argmax(logits, dim=-1).tolist()
        for row, sched in enumerate(samplers):
            params = sched.request.params
            if params.greedy:
                sampled[sched.request.request_id] = greedy_ids[row]
            else:
                sampled[sched.request.request_id] = sample_next(
                    logits[row], params.temperature, params.top_k, params.top_p, sched.request.generator
                )
        return sampled
