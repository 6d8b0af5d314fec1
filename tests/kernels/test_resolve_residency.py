"""resolve_residency: exact hand-written scenarios, naive oracle and Triton (interpreter) on
random states, multi-step slot conservation, api validation."""

import pytest
import torch

from kernels import resolve_residency
from kernels.resolve_residency import reference
from kernels.resolve_residency import triton as triton_impl
from tests.kernels import naive

MAX_PAGES = 12


def _row(values, width):
    return values + [-1] * (width - len(values))


def _batch(scenarios, *, max_ws=4, capacity=4):
    """Stack per-request scenarios into the batched tensors (int32, -1 padded)."""
    ws = torch.tensor([_row(s["ws"], max_ws) for s in scenarios], dtype=torch.int32)
    lru = torch.tensor([_row(s["lru"], capacity) for s in scenarios], dtype=torch.int32)
    free = torch.tensor([_row(s["free"], capacity) for s in scenarios], dtype=torch.int32)
    slot_of_page = torch.full((len(scenarios), MAX_PAGES), -1, dtype=torch.int32)
    for r, s in enumerate(scenarios):
        for page, slot in s["slots"].items():
            slot_of_page[r, page] = slot
    return ws, slot_of_page, lru, free


SCENARIOS = [
    # full buffer, no free slot: the two least recently used pages outside the working set go
    dict(ws=[2, 3, 8], lru=[5, 2, 9, 7], free=[], slots={5: 10, 2: 11, 9: 12, 7: 13},
         hit=[True, False, False], ws_slots=[11, 10, 12], miss_pages=[3, 8], miss_slots=[10, 12],
         victims=[5, 9], new_lru=[7, 2, 3, 8], new_free=[]),
    # free slots are used before anything is evicted
    dict(ws=[1, 6, 9], lru=[4, 1], free=[20, 21], slots={4: 22, 1: 23},
         hit=[True, False, False], ws_slots=[23, 20, 21], miss_pages=[6, 9], miss_slots=[20, 21],
         victims=[], new_lru=[4, 1, 6, 9], new_free=[]),
    # one free slot, then one victim; a leftover free slot would stay at the front of the list
    dict(ws=[0, 5, 6], lru=[3, 0, 8], free=[30], slots={3: 40, 0: 41, 8: 42},
         hit=[True, False, False], ws_slots=[41, 30, 40], miss_pages=[5, 6], miss_slots=[30, 40],
         victims=[3], new_lru=[8, 0, 5, 6], new_free=[]),
    # pinned page 0 (hot, outside the buffer) is a hit that needs no buffer slot; all hits
    dict(ws=[0, 4], lru=[4, 7], free=[51, 52], slots={0: 99, 4: 50, 7: 53},
         hit=[True, True], ws_slots=[99, 50], miss_pages=[], miss_slots=[],
         victims=[], new_lru=[7, 4], new_free=[51, 52]),
    # empty working set (padding row): nothing moves
    dict(ws=[], lru=[1], free=[60], slots={1: 61},
         hit=[], ws_slots=[], miss_pages=[], miss_slots=[], victims=[], new_lru=[1], new_free=[60]),
]


def _check_scenarios(plan, scenarios, *, max_ws=4, capacity=4):
    for r, s in enumerate(scenarios):
        n_ws = len(s["ws"])
        assert plan.hit[r].tolist() == s["hit"] + [False] * (max_ws - n_ws)
        assert plan.ws_slots[r].tolist() == _row(s["ws_slots"], max_ws)
        assert plan.miss_pages[r].tolist() == _row(s["miss_pages"], max_ws)
        assert plan.miss_slots[r].tolist() == _row(s["miss_slots"], max_ws)
        assert int(plan.num_misses[r]) == len(s["miss_pages"])
        assert plan.victim_pages[r].tolist() == _row(s["victims"], max_ws)
        assert int(plan.num_victims[r]) == len(s["victims"])
        assert plan.new_lru_pages[r].tolist() == _row(s["new_lru"], capacity)
        assert plan.new_free_slots[r].tolist() == _row(s["new_free"], capacity)
        expected_slots = {p: sl for p, sl in s["slots"].items() if p not in s["victims"]}
        expected_slots.update(zip(s["miss_pages"], s["miss_slots"]))
        assert plan.new_slot_of_page[r].tolist() == [expected_slots.get(p, -1) for p in range(MAX_PAGES)]


@pytest.mark.parametrize("impl", ["api", "triton"])
def test_hand_written_scenarios_exact(impl):
    inputs = _batch(SCENARIOS)
    if impl == "api":
        plan = resolve_residency(*inputs)
    else:
        plan, overflow = triton_impl.resolve_residency(*inputs, block=2)  # chunks straddle lists
        assert not overflow.any()
    assert all(t.dtype == torch.int32 for t in plan[1:]) and plan.hit.dtype == torch.bool
    _check_scenarios(plan, SCENARIOS)


def test_overflow_raises_and_pinned_pages_do_not_count():
    fits = dict(ws=[0, 3, 4], lru=[1, 2], free=[], slots={0: 9, 1: 10, 2: 11})  # 0 is pinned
    plan = resolve_residency(*_batch([fits]))
    assert plan.victim_pages[0].tolist() == [1, 2, -1, -1]
    assert plan.miss_slots[0].tolist() == [10, 11, -1, -1]
    too_big = dict(ws=[1, 3, 4], lru=[1, 2], free=[], slots={1: 10, 2: 11})
    with pytest.raises(ValueError, match="request row 1 does not fit .* needs 3 buffer slots .* capacity is 2"):
        resolve_residency(*_batch([fits, too_big]))
    _, overflow = triton_impl.resolve_residency(*_batch([fits, too_big]))
    assert overflow.tolist() == [False, True]


def _random_state(gen, *, max_pages, capacity, max_ws):
    """One consistent request state: buffered pages with distinct slots, free slots, pinned pages."""
    perm = torch.randperm(max_pages, generator=gen).tolist()
    num_held = int(torch.randint(0, capacity + 1, (1,), generator=gen))
    num_lru = int(torch.randint(0, num_held + 1, (1,), generator=gen))
    lru, pinned = perm[:num_lru], perm[num_lru : num_lru + 2]
    slot_ids = (torch.randperm(200, generator=gen) + 100).tolist()
    slot_of_page = [-1] * max_pages
    for page in lru + pinned:
        slot_of_page[page] = slot_ids.pop()
    free = [slot_ids.pop() for _ in range(num_held - num_lru)]
    ws_len = int(torch.randint(0, max_ws + 1, (1,), generator=gen))
    ws = sorted(torch.randperm(max_pages, generator=gen)[:ws_len].tolist())
    return ws, slot_of_page, lru, free


def _random_batch(seed, *, batch=5, max_pages=40, capacity=9, max_ws=8):
    gen = torch.Generator().manual_seed(seed)
    states = [_random_state(gen, max_pages=max_pages, capacity=capacity, max_ws=max_ws) for _ in range(batch)]
    ws = torch.tensor([_row(s[0], max_ws) for s in states], dtype=torch.int64)
    slot_of_page = torch.tensor([s[1] for s in states], dtype=torch.int64)
    lru = torch.tensor([_row(s[2], capacity) for s in states], dtype=torch.int32)
    free = torch.tensor([_row(s[3], capacity) for s in states], dtype=torch.int32)
    return states, (ws, slot_of_page, lru, free)


@pytest.mark.parametrize("seed", range(6))
def test_reference_matches_naive_on_random_states(seed):
    states, inputs = _random_batch(seed)
    plan, overflow = reference.resolve_residency(*inputs)
    for r, state in enumerate(states):
        want = naive.resolve_residency(*state)
        assert bool(overflow[r]) == (want is None)
        if want is None:
            continue
        n_ws = len(state[0])
        assert plan.hit[r, :n_ws].tolist() == want["hit"]
        for field in ("ws_slots", "miss_pages", "miss_slots", "victim_pages", "new_lru_pages", "new_free_slots"):
            row = getattr(plan, field)[r].tolist()
            assert row == _row(want[field], len(row)), field
        assert plan.new_slot_of_page[r].tolist() == want["new_slot_of_page"]


@pytest.mark.parametrize("seed", range(4))
def test_triton_matches_reference_on_random_states(seed):
    _, inputs = _random_batch(100 + seed)
    want, want_overflow = reference.resolve_residency(*inputs)
    got, got_overflow = triton_impl.resolve_residency(*inputs, block=4)
    assert torch.equal(got_overflow, want_overflow)
    ok = ~want_overflow
    for field, w, g in zip(want._fields, want, got):
        assert torch.equal(g[ok], w[ok]), field


def test_multi_step_conserves_buffer_slots():
    """Apply plans step after step: the buffer's slots (LRU pages' + free) never change."""
    gen = torch.Generator().manual_seed(7)
    capacity, max_pages = 6, 30
    slot_of_page = torch.full((1, max_pages), -1, dtype=torch.int32)
    lru = torch.full((1, capacity), -1, dtype=torch.int32)
    free = torch.arange(200, 200 + capacity, dtype=torch.int32)[None]
    for _ in range(12):
        ws_len = int(torch.randint(1, capacity + 1, (1,), generator=gen))
        ws = sorted(torch.randperm(max_pages, generator=gen)[:ws_len].tolist())
        plan = resolve_residency(torch.tensor([_row(ws, capacity)], dtype=torch.int32), slot_of_page, lru, free)
        slot_of_page, lru, free = plan.new_slot_of_page, plan.new_lru_pages, plan.new_free_slots
        held = lru[0][lru[0] >= 0]
        buffer_slots = slot_of_page[0][held.long()].tolist() + free[0][free[0] >= 0].tolist()
        assert sorted(buffer_slots) == list(range(200, 200 + capacity))
        assert lru[0, held.numel() - len(ws) : held.numel()].tolist() == ws  # MRU tail, ascending
        assert int((slot_of_page >= 0).sum()) == held.numel()


def test_validation_messages():
    ws, slot_of_page, lru, free = _batch(SCENARIOS[:1])
    with pytest.raises(ValueError, match=r"free_slots must have shape \[batch=1, capacity=4\]"):
        resolve_residency(ws, slot_of_page, lru, free[:, :3])
    with pytest.raises(ValueError, match="working_pages: valid entries of each row must be strictly ascending"):
        resolve_residency(torch.tensor([[3, 2, 8, -1]], dtype=torch.int32), slot_of_page, lru, free)
    with pytest.raises(ValueError, match=r"working_pages entries must be in \[0, 12\)"):
        resolve_residency(ws + 20, slot_of_page, lru, free)
    with pytest.raises(ValueError, match="every page in lru_pages must have a slot"):
        resolve_residency(ws, torch.full_like(slot_of_page, -1), lru, free)
    with pytest.raises(ValueError, match="lru_pages: row 0 repeats an entry"):
        resolve_residency(ws, slot_of_page, torch.tensor([[5, 5, 9, 7]], dtype=torch.int32), free)
    with pytest.raises(ValueError, match="holds 5 LRU pages \\+ free slots, more than capacity 4"):
        resolve_residency(ws, slot_of_page, lru, torch.tensor([[1, -1, -1, -1]], dtype=torch.int32))
    with pytest.raises(TypeError, match="lru_pages must have dtype int32/int64"):
        resolve_residency(ws, slot_of_page, lru.float(), free)
