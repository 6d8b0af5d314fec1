"""Plain Python-loop oracles, written for clarity, never for speed. Tests only."""

from __future__ import annotations

import math

import torch


def page_digest(k_pool: torch.Tensor, slot_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_pages, num_kv_heads, head_dim] min and max of each page's keys over its tokens."""
    mins, maxs = [], []
    for slot in slot_ids:
        page = k_pool[slot].float()  # [page_size, num_kv_heads, head_dim]
        mins.append(page.min(dim=0).values)
        maxs.append(page.max(dim=0).values)
    return torch.stack(mins).to(k_pool.dtype), torch.stack(maxs).to(k_pool.dtype)


def page_select(q, digest_min, digest_max, token_req, token_pos, *, top_k_pages, sink_pages, recent_pages, page_size,
                score="quest"):
    """Per token, per page, per head, per dim: the literal formula (Quest bound, or the center
    logit's softmax over the candidates summed over heads), then sort by hand.

    Returns (list of selected page lists, list of candidate score dicts).
    """
    num_heads = q.shape[1]
    num_kv_heads = digest_min.shape[2]
    group = num_heads // num_kv_heads
    selections, all_scores = [], []
    for t in range(q.shape[0]):
        pos = int(token_pos[t])
        req = int(token_req[t])
        cur = pos // page_size
        recent_start = max(0, cur - recent_pages + 1)
        sink_end = min(sink_pages, recent_start)
        scores = {}
        for p in range(sink_end, recent_start):
            total = 0.0
            for h in range(num_heads):
                kv = h // group
                qh = q[t, h].double()
                lo = digest_min[req, p, kv].double()
                hi = digest_max[req, p, kv].double()
                total += float(torch.maximum(qh * lo, qh * hi).sum())
            scores[p] = total
        if score == "center" and scores:
            scores = dict.fromkeys(scores, 0.0)
            for h in range(num_heads):
                kv = h // group
                logit = {p: float((q[t, h].double() * (digest_min[req, p, kv].double() + digest_max[req, p, kv].double())
                                   / 2).sum()) / math.sqrt(q.shape[2]) for p in scores}
                peak = max(logit.values())
                total = sum(math.exp(v - peak) for v in logit.values())
                for p in scores:
                    scores[p] += math.exp(logit[p] - peak) / total
        ranked = sorted(scores, key=lambda p: (-scores[p], p))[:top_k_pages]
        pages = list(range(sink_end)) + sorted(ranked) + list(range(recent_start, cur + 1))
        selections.append(pages)
        all_scores.append(scores)
    return selections, all_scores


def sparse_paged_attention(q, k_pool, v_pool, token_slots, token_pages, token_pos, *, scale, page_size):
    """Per token and head: collect the visible keys one by one, softmax in float64."""
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k_pool.shape[2]
    out = torch.zeros((num_tokens, num_heads, head_dim), dtype=torch.float64)
    for t in range(num_tokens):
        for h in range(num_heads):
            kv = h // group
            logits, values = [], []
            for j in range(token_slots.shape[1]):
                slot = int(token_slots[t, j])
                if slot < 0:
                    continue
                for i in range(page_size):
                    if int(token_pages[t, j]) * page_size + i <= int(token_pos[t]):
                        key = k_pool[slot, i, kv].double()
                        logits.append(float(q[t, h].double() @ key) * scale)
                        values.append(v_pool[slot, i, kv].double())
            if not logits:
                continue
            peak = max(logits)
            weights = [math.exp(x - peak) for x in logits]
            total = sum(weights)
            for w, v in zip(weights, values):
                out[t, h] += (w / total) * v
    return out


def resolve_residency(working: list[int], slot_of_page: list[int], lru: list[int], free: list[int]):
    """One request, written as the contract reads. Returns a dict of plain lists, or None on
    overflow."""
    slot_of_page = list(slot_of_page)
    hits = [slot_of_page[p] >= 0 for p in working]
    misses = [p for p in working if slot_of_page[p] < 0]
    if len([p for p in working if p in lru]) + len(misses) > len(lru) + len(free):
        return None
    evictable = [p for p in lru if p not in working]
    from_free = min(len(misses), len(free))
    victims = evictable[: len(misses) - from_free]
    miss_slots = free[:from_free] + [slot_of_page[v] for v in victims]
    for v in victims:
        slot_of_page[v] = -1
    for p, s in zip(misses, miss_slots):
        slot_of_page[p] = s
    survivors = [p for p in evictable if p not in victims]
    touched = [p for p in working if p in lru or p in misses]
    return {
        "hit": hits,
        "ws_slots": [slot_of_page[p] for p in working],
        "miss_pages": misses,
        "miss_slots": miss_slots,
        "victim_pages": victims,
        "new_lru_pages": survivors + touched,
        "new_free_slots": free[from_free:],
        "new_slot_of_page": slot_of_page,
    }
