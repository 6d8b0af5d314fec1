"""Paged attention for one engine step: where each new token's K/V is written in the hot pool
and which pool rows each query token reads.

The engine's model runner builds one ``AttentionMetadata`` per step; the model calls
``PagedAttention.forward`` once per layer. Requests with the same number of query tokens in a
step are attended together in one padded call (decode: 1 token each; a verify block: 1 + gamma);
a prefill chunk is its own group.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import page_select, sparse_paged_attention
from services.decoder.kv.digest_pool import DigestPool
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.sparse_step import HostLayer, SparseStep


@dataclass
class AttentionGroup:
    """``num_reqs`` requests with ``num_query_tokens`` query tokens each, contiguous in the step's
    token dimension starting at ``token_start`` (request-major). A *ragged* group (``token_rows``
    set) holds requests with fewer query tokens too: their tokens are still contiguous and
    request-major, and each is padded to ``num_query_tokens`` by repeating its last token (same
    position, same mask row), whose outputs are dropped. One padded group instead of one group
    per query count: each group costs a gather of its requests' keys and values and a few
    kernels in every layer (a c=4 verify step mixing 0-, 1- and 2-token drafts ran 3 groups and
    took ~10 ms more than one of 1-token drafts on the 2-core CPU)."""

    token_start: int
    num_reqs: int
    num_query_tokens: int
    read_rows: torch.Tensor  # [num_reqs, max_context_len] int64 pool rows of positions 0..ctx-1 (padded with 0)
    attn_mask: torch.Tensor | None  # [num_reqs, 1, num_query_tokens, max_context_len] bool; None = attend all
    # pages not hot (a SPARSE request's prefill): (flat key rows [n * page_size] into
    # [num_reqs * max_context_len], host page ids [n]) read from the host tier instead
    host_read: tuple[torch.Tensor, torch.Tensor] | None = None
    is_prefill: bool = False  # a prefill chunk: not part of ``AttentionWork`` (decode / verify only)
    key_rows: int = 0  # sum over query tokens of their request's context length (``AttentionWork``)
    context_rows: int = 0  # sum over requests of their context length: the key / value rows gathered
    # ragged: [num_reqs * num_query_tokens] int64 step rows of the padded queries (request-major),
    # and [num_tokens] int64 indices into them of the real ones, in step order; None: not ragged
    token_rows: torch.Tensor | None = None
    real_rows: torch.Tensor | None = None
    num_tokens: int = 0  # real query tokens (0: num_reqs * num_query_tokens)

    @property
    def token_end(self) -> int:
        return self.token_start + (self.num_tokens or self.num_reqs * self.num_query_tokens)

    def to(self, device: torch.device) -> AttentionGroup:
        if self.host_read is not None:
            raise ValueError("host page reads (SPARSE prefill) run on CPU tensors only")
        mask = None if self.attn_mask is None else self.attn_mask.to(device, non_blocking=True)
        ragged = [None if t is None else t.to(device, non_blocking=True) for t in (self.token_rows, self.real_rows)]
        return AttentionGroup(self.token_start, self.num_reqs, self.num_query_tokens,
                              self.read_rows.to(device, non_blocking=True), mask, is_prefill=self.is_prefill,
                              key_rows=self.key_rows, context_rows=self.context_rows,
                              token_rows=ragged[0], real_rows=ragged[1],
                              num_tokens=self.num_tokens)


@dataclass(frozen=True)
class SparseParams:
    """Per-token selection budget: sink pages + top-k pages by digest bound + recent pages."""

    top_k_pages: int
    sink_pages: int
    recent_pages: int  # >= 1: the token's own (unsealed) page is always in the window
    page_score: str = "center"  # kernels.page_select score: "center" | "quest"


@dataclass
class PageListTokens:
    """Decode / verify tokens of this step under sparse attention: each attends over exactly its
    own selection of its request's pages."""

    token_rows: torch.Tensor  # [num_list_tokens] int64 rows into the step's token dimension
    token_req: torch.Tensor  # [num_list_tokens] int64 row of page_tables
    token_pos: torch.Tensor  # [num_list_tokens] int64 absolute positions
    page_tables: torch.Tensor  # [num_list_reqs, max_pages] int64 hot slot of each logical page, -1 = not hot
    digest_rows: torch.Tensor  # [num_list_reqs, max_pages] int64 digest row of each logical page, -1 padded
    sparse: SparseStep | None = None  # SPARSE requests among the rows: buffers resolved per layer


# scoring one page reads its min and max digests, each the size of one key row
DIGEST_ROWS_PER_PAGE = 2


@dataclass
class AttentionWork:
    """What one step's decode / verify attention did, summed over layers (CPU only: on another
    device the work is launched, not done, when the host clock reads it, so nothing is counted).

    ``dense_*``: dense groups of decode and verify tokens (prefill chunks are not counted), one
    key row per query token per position of its request's context (a group's padding to its
    longest context is not counted: the budget prices each request's own rows);
    ``dense_context_rows``: each request's context once (the key / value rows its group gathers,
    whatever its query count: a verify token beyond the first only scores them).
    ``page_list_*``: sparse tokens, each token's selected pages x page size plus
    ``DIGEST_ROWS_PER_PAGE`` per page of its context (the scoring that picked them).
    ``fetch_s``: the part of ``page_list_s`` spent copying SPARSE misses in from the host
    (the verify budget prices fetches per missed page, apart)."""

    dense_s: float = 0.0
    dense_rows: int = 0
    dense_context_rows: int = 0
    page_list_s: float = 0.0
    page_list_rows: int = 0
    fetch_s: float = 0.0

    @property
    def seconds(self) -> float:
        """All decode / verify attention seconds, fetches included."""
        return self.dense_s + self.page_list_s


@dataclass
class AttentionMetadata:
    positions: torch.Tensor  # [num_tokens] int64 absolute position of each query token
    write_rows: torch.Tensor  # [num_tokens] int64 pool row receiving each token's K/V
    groups: list[AttentionGroup]  # dense: prefill chunks, and decode tokens unless sparse
    page_list: PageListTokens | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    def to(self, device: torch.device) -> AttentionMetadata:
        """The metadata with every tensor on ``device`` (built on the host, moved once per step)."""
        if self.page_list is not None:
            raise ValueError("page-list (sparse) tokens run on CPU tensors only")
        return AttentionMetadata(self.positions.to(device, non_blocking=True),
                                 self.write_rows.to(device, non_blocking=True),
                                 [group.to(device) for group in self.groups])


def build_group(
    token_start: int,
    query_positions: list[list[int]],
    page_tables: list[list[int]],
    context_lens: list[int],
    page_size: int,
    host_page_tables: list[list[int]] | None = None,
    is_prefill: bool = False,
) -> AttentionGroup:
    """Builds one group (``is_prefill``: a prompt chunk, see ``AttentionGroup``).
    ``query_positions[r]``: positions of request r's query tokens (a different count per request
    makes a ragged group); ``page_tables[r]``: its slots in logical page order (-1: the page is
    not hot and is read from host page ``host_page_tables[r][page]``); ``context_lens[r]``: tokens
    it holds after this step's writes."""
    num_reqs = len(query_positions)
    counts = [len(p) for p in query_positions]
    num_query_tokens = max(counts)
    token_rows = real_rows = None
    if min(counts) != num_query_tokens:
        starts = list(itertools.accumulate(counts, initial=token_start))
        token_rows = torch.tensor([starts[r] + min(j, counts[r] - 1) for r in range(num_reqs)
                                   for j in range(num_query_tokens)], dtype=torch.int64)
        real_rows = torch.tensor([r * num_query_tokens + j for r in range(num_reqs) for j in range(counts[r])],
                                 dtype=torch.int64)
        key_rows = sum(n * length for n, length in zip(counts, context_lens))
        query_positions = [p + [p[-1]] * (num_query_tokens - len(p)) for p in query_positions]
    else:
        key_rows = num_query_tokens * sum(context_lens)
    # keys padded to whole pages: the same key count the page-list (sparse) kernel sees, so that a
    # selection covering the context reproduces these numbers exactly
    max_len = -(-max(context_lens) // page_size) * page_size
    offsets = torch.arange(max_len, dtype=torch.int64)  # [max_len]
    read_rows = torch.zeros(num_reqs, max_len, dtype=torch.int64)
    host_dst: list[torch.Tensor] = []
    host_ids: list[int] = []
    for r in range(num_reqs):
        length = context_lens[r]
        num_pages = -(-length // page_size)
        slots = torch.tensor(page_tables[r][:num_pages], dtype=torch.int64)  # [num_pages]
        cold = (slots < 0).nonzero().flatten()
        if cold.numel():
            if host_page_tables is None:
                raise ValueError(f"request row {r} has pages that are not hot and no host pages to read")
            host_ids.extend(host_page_tables[r][p] for p in cold.tolist())
            host_dst.append(((r * max_len + cold * page_size)[:, None] + torch.arange(page_size)).reshape(-1))
        rows = (slots.clamp(min=0)[:, None] * page_size + torch.arange(page_size)).reshape(-1)[:length]
        read_rows[r, :length] = rows
    needs_mask = num_query_tokens > 1 or any(length != max_len for length in context_lens)
    attn_mask = None
    if needs_mask:
        q_pos = torch.tensor(query_positions, dtype=torch.int64)  # [num_reqs, num_query_tokens]
        lens = torch.tensor(context_lens, dtype=torch.int64)[:, None, None]
        key_pos = offsets[None, None, :]
        attn_mask = ((key_pos <= q_pos[:, :, None]) & (key_pos < lens)).unsqueeze(1)
    host_read = (torch.cat(host_dst), torch.tensor(host_ids, dtype=torch.int64)) if host_ids else None
    return AttentionGroup(token_start, num_reqs, num_query_tokens, read_rows, attn_mask, host_read,
                          is_prefill=is_prefill, key_rows=key_rows, context_rows=sum(context_lens),
                          token_rows=token_rows, real_rows=real_rows,
                          num_tokens=sum(counts) if token_rows is not None else 0)


SMALL_QUERY_TOKENS = 16  # decode / verify groups: two batched matmuls beat CPU flash SDPA by 20-40%


def _grouped_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """GQA attention as two batched matmuls, each kv head serving its group of query heads.
    ``q: [B, num_heads, Q, D]``, ``keys, values: [B, num_kv_heads, L, D]``, ``mask: [B, 1, Q, L]``
    (True = attend) or None. Returns ``[B, num_heads, Q, D]``; softmax in fp32."""
    batch, num_heads, num_q, head_dim = q.shape
    num_kv_heads = keys.shape[1]
    group = num_heads // num_kv_heads
    grouped_q = q.reshape(batch, num_kv_heads, group * num_q, head_dim)  # heads h = kv * group + g
    scores = torch.matmul(grouped_q, keys.transpose(-1, -2)).float() * scale  # [B, KVH, group * Q, L]
    if mask is not None:
        full_mask = mask.unsqueeze(2).expand(batch, 1, group, num_q, mask.shape[-1])
        scores = scores.masked_fill(~full_mask.reshape(batch, 1, group * num_q, -1), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).view(batch, num_heads, num_q, head_dim)


class PagedAttention:
    """Dense attention over the hot pool (every page of a request is read)."""

    def __init__(
        self,
        pool: HotPool,
        num_heads: int,
        scale: float,
        sparse: SparseParams | None = None,
        digests: DigestPool | None = None,
        host_layer: HostLayer | None = None,
    ):
        if (sparse is None) != (digests is None):
            raise ValueError("sparse attention needs both SparseParams and a DigestPool")
        self.pool = pool
        self.num_heads = num_heads
        self.scale = scale
        self.sparse = sparse
        self.digests = digests
        self.host_layer = host_layer  # the host tier's K, V of a layer (SPARSE prefill reads)
        # counters over layers x sparse tokens (read by benchmarks and stats)
        self.num_selected_pages = 0
        self.num_context_pages = 0
        # the current step's decode / verify attention (the model runner starts a new one per step)
        self.work = AttentionWork()
        self._timed = pool.storage.device.type == "cpu"

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """``q: [num_tokens, num_heads, head_dim]``, ``k, v: [num_tokens, num_kv_heads, head_dim]``.
        Writes k, v into the pool, then attends. Returns ``[num_tokens, num_heads * head_dim]``."""
        k_rows = self.pool.k_rows(layer)
        v_rows = self.pool.v_rows(layer)
        k_rows.index_copy_(0, meta.write_rows, k)
        v_rows.index_copy_(0, meta.write_rows, v)
        num_tokens, num_heads, head_dim = q.shape
        out = q.new_empty(num_tokens, num_heads, head_dim)
        work, timed = self.work, self._timed
        for group in meta.groups:
            start = time.perf_counter()
            group_q = q[group.token_start : group.token_end] if group.token_rows is None else \
                torch.index_select(q, 0, group.token_rows)  # ragged: each request padded by its last token
            group_q = group_q.view(group.num_reqs, group.num_query_tokens, num_heads, head_dim).transpose(1, 2)
            # [num_reqs, num_heads, num_query_tokens, head_dim]
            rows = group.read_rows
            # index_select, not advanced indexing: ~4x faster for row gathers on CPU
            keys = torch.index_select(k_rows, 0, rows.view(-1))  # [num_reqs * max_context_len, KVH, D]
            values = torch.index_select(v_rows, 0, rows.view(-1))
            if group.host_read is not None:
                self._read_host(layer, group.host_read, keys, values)
            keys = keys.view(*rows.shape, -1, head_dim).transpose(1, 2)
            values = values.view(*rows.shape, -1, head_dim).transpose(1, 2)
            # keys, values: [num_reqs, num_kv_heads, max_context_len, head_dim]
            if group.num_query_tokens <= SMALL_QUERY_TOKENS:
                attended = _grouped_attention(group_q, keys, values, group.attn_mask, self.scale)
            else:
                attended = F.scaled_dot_product_attention(
                    group_q, keys, values, attn_mask=group.attn_mask, scale=self.scale, enable_gqa=True
                )  # [num_reqs, num_heads, num_query_tokens, head_dim]
            attended = attended.transpose(1, 2).reshape(-1, num_heads, head_dim)
            if group.real_rows is not None:
                attended = torch.index_select(attended, 0, group.real_rows)
            out[group.token_start : group.token_end] = attended
            if timed and not group.is_prefill:
                work.dense_s += time.perf_counter() - start
                work.dense_rows += group.key_rows
                work.dense_context_rows += group.context_rows
        if meta.page_list is not None:
            start = time.perf_counter()
            out[meta.page_list.token_rows] = self._page_list_forward(layer, q, meta.page_list)
            if timed:
                work.page_list_s += time.perf_counter() - start
        return out.view(num_tokens, num_heads * head_dim)

    def _read_host(self, layer: int, host_read: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor,
                   values: torch.Tensor) -> None:
        """Fills the key/value rows of pages that are not hot from their host pages."""
        dst, host_ids = host_read
        host_k, host_v = self.host_layer(layer)
        kv_heads, head_dim = keys.shape[1:]
        keys.index_copy_(0, dst, torch.index_select(host_k, 0, host_ids).view(-1, kv_heads, head_dim))
        values.index_copy_(0, dst, torch.index_select(host_v, 0, host_ids).view(-1, kv_heads, head_dim))

    def _page_list_forward(self, layer: int, q: torch.Tensor, tokens: PageListTokens) -> torch.Tensor:
        """Each token attends over exactly its own selection. Returns ``[num_list_tokens, H, D]``.
        The kernel's arithmetic matches ``_grouped_attention`` (same scaling, softmax and matmul
        order), so a selection that covers the context reproduces dense decoding."""
        page_size = self.pool.page_size
        list_q = torch.index_select(q, 0, tokens.token_rows)  # [num_list_tokens, H, D]
        params = self.sparse
        # padding rows are never candidates (pages past the token's window are not read)
        digests = self.digests.gather(layer, tokens.digest_rows.clamp(min=0))  # the score's tables
        selected, num_selected = page_select(
            list_q, digests.get("digest_min"), digests.get("digest_max"), tokens.token_req, tokens.token_pos,
            top_k_pages=params.top_k_pages, sink_pages=params.sink_pages, recent_pages=params.recent_pages,
            score=params.page_score, digest_center=digests.get("digest_center"),
            page_size=page_size, check_indices=False,
        )  # selected: [num_sparse_tokens, sink + top_k + recent] logical pages, -1 padded
        selected = selected[:, : int(num_selected.max())]  # drop all-padding columns
        table = tokens.page_tables
        if tokens.sparse is not None:
            table = tokens.sparse.layer_table(layer, selected, tokens.token_req, table)
        slots = table[tokens.token_req[:, None], selected.long().clamp(min=0)]
        token_slots = torch.where(selected >= 0, slots, -1)
        step_selected = int(num_selected.sum())
        step_context = int((tokens.token_pos // page_size + 1).sum())
        self.num_selected_pages += step_selected
        self.num_context_pages += step_context
        if self._timed:
            self.work.page_list_rows += step_selected * page_size + DIGEST_ROWS_PER_PAGE * step_context
        return sparse_paged_attention(
            list_q, self.pool.k[layer], self.pool.v[layer], token_slots, selected, tokens.token_pos,
            scale=self.scale, page_size=page_size, check_indices=False,
        )
