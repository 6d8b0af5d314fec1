"""One engine step's SPARSE requests, as the attention layer sees them: per layer, the union of
their tokens' selections is resolved against their hot buffers and the misses are copied in from
the host tier before attention reads them."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kernels import gather_pages, resolve_residency
from services.decoder.kv.hot_pool import HotPool
from services.decoder.kv.sparse_buffer import SparseBuffer

HostLayer = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # layer -> host K, V [pages, page, KVH, D]
# (owner, layer, working pages [W] ascending, unpinned pages each of its query tokens selected [T]):
# what a selection trace records, once per SPARSE request per layer, before residency is resolved
SelectionObserver = Callable[[object, int, torch.Tensor, torch.Tensor], None]


def _pad_rows(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.full((len(rows), width), -1, dtype=torch.int64)
    for i, row in enumerate(rows):
        n = min(width, row.shape[0])
        out[i, :n] = row[:n]
    return out


class SparseStep:
    """``rows[b]``: the page-table row of SPARSE request b among the step's page-list rows;
    ``buffers[b]`` its buffer; ``host_pages[b]``: its host page id per logical page; ``owners[b]``:
    whatever the caller uses to credit ``hits[b]`` / ``misses[b]`` after the forward;
    ``observer``: if given, called with each request's working set per layer (a selection trace)."""

    def __init__(self, rows: list[int], buffers: list[SparseBuffer], host_pages: list[list[int]],
                 pool: HotPool, host_layer: HostLayer, owners: list | None = None,
                 observer: SelectionObserver | None = None):
        self.observer = observer
        self.rows = torch.tensor(rows, dtype=torch.int64)
        self.owners = owners if owners is not None else [None] * len(buffers)
        self.buffers = buffers
        self.host_tables = _pad_rows([torch.tensor(ids, dtype=torch.int64) for ids in host_pages],
                                     max((len(ids) for ids in host_pages), default=0))
        self.pool = pool
        self.host_layer = host_layer
        self.num_fetched_pages = 0
        self.fetch_s = 0.0  # spent copying misses host -> hot, over layers
        self.hits = [0] * len(buffers)  # per request: buffered working pages found hot, over layers
        self.misses = [0] * len(buffers)  # per request: pages copied in from the host, over layers

    def working_pages(self, selected: torch.Tensor, token_req: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """``selected: [T, S]`` logical pages (-1 padded), ``token_req: [T]`` table row of each
        token, ``table: [R, P]`` pinned slot of each page (-1 = not pinned). Returns
        ``[B, W]``: per SPARSE request, the unpinned pages its tokens selected, ascending, -1 padded."""
        return self._working_pages(selected, token_req, table)[0]

    def _working_pages(self, selected: torch.Tensor, token_req: torch.Tensor,
                       table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``working_pages`` plus the step's selection mask of unpinned SPARSE pages ``need: [T, S]``
        and each table row's SPARSE request index ``b_of_row: [R]`` (-1: not SPARSE), for the
        observer (computed only when one is set)."""
        num_rows, max_pages = table.shape
        b_of_row = torch.full((num_rows,), -1, dtype=torch.int64)
        b_of_row[self.rows] = torch.arange(len(self.buffers))
        sel_row = token_req[:, None].expand_as(selected)
        pages = selected.long().clamp(min=0)
        b = b_of_row[sel_row]
        need = (selected >= 0) & (b >= 0) & (table[sel_row, pages] < 0)
        marks = torch.zeros(len(self.buffers), max_pages, dtype=torch.bool)
        marks[b[need], pages[need]] = True
        width = max(int(marks.sum(1).max()) if marks.numel() else 0, 1)
        ids = torch.where(marks, torch.arange(max_pages), max_pages)
        ws = torch.sort(ids, dim=1).values[:, :width]
        return torch.where(ws < max_pages, ws, -1), need, b_of_row

    def layer_table(self, layer: int, selected: torch.Tensor, token_req: torch.Tensor,
                    table: torch.Tensor) -> torch.Tensor:
        """Resolves layer ``layer`` and returns ``table`` with the SPARSE rows replaced by their
        slot of every page hot in this layer (pinned or buffered). Copies misses host -> hot.
        Mutates: the buffers' state of this layer, this layer's hot pool slots of the buffers."""
        max_pages = table.shape[1]
        ws, need, b_of_row = self._working_pages(selected, token_req, table)
        if self.observer is not None:
            token_b, token_pages = b_of_row[token_req], need.sum(1)
            for b, owner in enumerate(self.owners):
                self.observer(owner, layer, ws[b][ws[b] >= 0], token_pages[token_b == b])
        capacity = max(buf.capacity for buf in self.buffers)
        slot_of_page = _pad_rows([buf.slot_of_page[layer] for buf in self.buffers], max_pages)
        lru = _pad_rows([buf.lru[layer] for buf in self.buffers], capacity)
        free = _pad_rows([buf.free[layer] for buf in self.buffers], capacity)
        plan = resolve_residency(ws, slot_of_page, lru, free, check_indices=False)
        missing = plan.miss_pages >= 0
        if bool(missing.any()):
            b_idx = torch.arange(len(self.buffers))[:, None].expand_as(plan.miss_pages)[missing]
            host_ids = self.host_tables[b_idx, plan.miss_pages[missing].long()]
            dst = plan.miss_slots[missing].long()
            start = time.perf_counter()
            host_k, host_v = self.host_layer(layer)
            gather_pages(host_k, self.pool.k[layer], host_ids, dst, check_indices=False)
            gather_pages(host_v, self.pool.v[layer], host_ids, dst, check_indices=False)
            self.fetch_s += time.perf_counter() - start
            self.num_fetched_pages += int(missing.sum())
        for b, buf in enumerate(self.buffers):
            width = min(max_pages, buf.slot_of_page.shape[1])
            buf.slot_of_page[layer, :width] = plan.new_slot_of_page[b, :width]
            buf.lru[layer] = plan.new_lru_pages[b, : buf.capacity]
            buf.free[layer] = plan.new_free_slots[b, : buf.capacity]
            self.misses[b] += int(plan.num_misses[b])
            self.hits[b] += int((plan.hit[b] & (ws[b] >= 0)).sum())
        out = table.clone()
        out[self.rows] = plan.new_slot_of_page.to(table.dtype)[:, :max_pages]
        return out
