"""A ragged attention group (requests with different query counts, each padded by its last
token) gives every real query token exactly what a per-token torch reference gives, and the
model runner puts a step's decodes and short verify blocks into one such group."""

import pytest
import torch

from services.decoder.kv.hot_pool import HotPool
from services.decoder.model.attention import SMALL_QUERY_TOKENS, AttentionMetadata, PagedAttention, build_group

PAGE = 16
HEADS, KV_HEADS, DIM = 6, 2, 8


def _reference(q, pool, slots, positions, scale):
    """One query token at ``position`` of a request with pages ``slots``: softmax over keys
    0..position, GQA by repeating each kv head over its group of query heads."""
    rows = torch.tensor([slots[p // PAGE] * PAGE + p % PAGE for p in range(positions + 1)])
    keys = pool.k_rows(0)[rows].repeat_interleave(HEADS // KV_HEADS, dim=1)  # [L, H, D]
    values = pool.v_rows(0)[rows].repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, keys) * scale
    return torch.einsum("hl,lhd->hd", torch.softmax(scores, dim=-1), values)


@pytest.mark.parametrize("counts", [[1, 2, 3], [3, 1, 1, 2], [2, 2, 5]])
def test_a_ragged_group_equals_the_per_token_reference(counts):
    gen = torch.Generator().manual_seed(sum(counts))
    pool = HotPool(1, 12, PAGE, KV_HEADS, DIM)
    pool.k_rows(0).copy_(torch.randn(pool.k_rows(0).shape, generator=gen))
    pool.v_rows(0).copy_(torch.randn(pool.v_rows(0).shape, generator=gen))
    tables = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9, 10]][: len(counts)]
    ends = [40, 30, 45, 20][: len(counts)]  # context after the step; the last `count` positions are queried
    query_positions = [list(range(end - n, end)) for end, n in zip(ends, counts)]
    group = build_group(0, query_positions, tables, ends, PAGE)
    ragged = len(set(counts)) > 1
    assert (group.token_rows is not None) == ragged and group.num_query_tokens == max(counts)
    assert group.token_end == sum(counts)
    assert group.key_rows == sum(n * end for n, end in zip(counts, ends))
    num_tokens = sum(counts)
    q = torch.randn(num_tokens, HEADS, DIM, generator=gen)
    positions = torch.tensor([p for pos in query_positions for p in pos])
    write_rows = torch.tensor([t[p // PAGE] * PAGE + p % PAGE for t, pos in zip(tables, query_positions) for p in pos])
    # the step writes the queried positions' own k/v: keep what the pool holds there
    k = pool.k_rows(0)[write_rows].clone()
    v = pool.v_rows(0)[write_rows].clone()
    attention = PagedAttention(pool, HEADS, DIM**-0.5)
    out = attention.forward(0, q, k, v, AttentionMetadata(positions, write_rows, [group]))
    out = out.view(num_tokens, HEADS, DIM)
    row = 0
    for table, pos in zip(tables, query_positions):
        for p in pos:
            torch.testing.assert_close(out[row], _reference(q[row], pool, table, p, DIM**-0.5), rtol=1e-5, atol=1e-5)
            row += 1
    assert attention.work.dense_rows == group.key_rows


def test_the_runner_puts_decodes_and_short_blocks_in_one_group_and_long_blocks_apart(loaded_model):
    from dhisparse import LLM, SamplingParams

    engine = LLM(loaded=loaded_model, spec="ngram", spec_tokens=SMALL_QUERY_TOKENS + 4).engine
    ids = [engine.add_request([1, 2, 3, 4, 5, 6, 7, 8, 9][: 5 + i], SamplingParams(max_tokens=32)) for i in range(4)]
    while any(not engine.requests[i].output_ids for i in ids):
        engine.step()
    requests = [engine.requests[i] for i in ids]
    drafts = [[], [7], [7, 7], [7] * (SMALL_QUERY_TOKENS + 2)]
    for request, draft in zip(requests, drafts):
        request.draft_ids = draft
    batch = engine.scheduler.schedule()  # allocates the blocks' pages
    assert sorted(len(s.draft) for s in batch) == [len(d) for d in drafts]
    _, meta, ordered = engine.runner.build_inputs(batch)
    assert [s.draft for s in ordered] == drafts
    short, long = meta.groups
    assert short.num_reqs == 3 and short.num_query_tokens == 3 and short.token_end == 1 + 2 + 3
    assert short.token_rows.tolist() == [0, 0, 0, 1, 2, 2, 3, 4, 5]  # each request padded by its last token
    assert short.real_rows.tolist() == [0, 3, 4, 6, 7, 8]
    assert long.token_rows is None and long.token_start == 6 and long.num_query_tokens == SMALL_QUERY_TOKENS + 3
