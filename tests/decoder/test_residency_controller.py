"""The residency controller on its own: admission modes, demotion and promotion sequences with
the exact slot counts and modes they must produce (16-token pages, sink 1, recent 2, buffer 4)."""

import pytest

from services.decoder.engine.request import Request, Residency
from services.decoder.engine.residency_controller import ResidencyController, ResidencySettings
from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.kv.slot_allocator import SlotAllocator


def make(policy: str, num_slots: int = 64, low: int = 8, high: int = 24) -> ResidencyController:
    settings = ResidencySettings(policy=policy, page_size=16, num_layers=3, sink_pages=1, recent_pages=2,
                                 buffer_pages=4, low_watermark_slots=low, high_watermark_slots=high,
                                 promote_pages_per_step=8)
    return ResidencyController(settings, SlotAllocator(num_slots))


def request(rid: str, prompt_tokens: int, max_tokens: int = 64) -> Request:
    return Request(rid, list(range(1, prompt_tokens + 1)), SamplingParams(max_tokens=max_tokens), None, 4096)


def run_prefill(ctl: ResidencyController, req: Request, running: list[Request], chunk: int = 128) -> None:
    """As the engine drives a request through chunked prefill: admission, then per chunk the
    write-back of sealed pages and a trim; a chunk that gets no slots demotes someone first."""
    assert ctl.admit(req, min(chunk, req.num_tokens))
    running.append(req)
    while True:
        req.num_computed_tokens += min(chunk, req.num_tokens - req.num_computed_tokens)
        req.num_host_pages = req.num_computed_tokens // 16
        ctl.trim(req)
        if req.num_computed_tokens == req.num_tokens:
            return
        target = req.num_computed_tokens + min(chunk, req.num_tokens - req.num_computed_tokens)
        while not ctl.grow(req, target):
            assert ctl.demote_one(running)


def pinned(req: Request) -> list[int]:
    return [p for p, slot in enumerate(req.slots) if slot >= 0]


def test_adaptive_admits_full_while_there_is_room_and_demotes_the_fullest_under_pressure():
    ctl = make("adaptive")
    running: list[Request] = []
    a, b = request("a", 640), request("b", 640)  # 40 pages each, 64 slots
    run_prefill(ctl, a, running)
    assert a.mode is Residency.FULL and ctl.allocator.num_free_slots == 24
    # b is admitted FULL (its first chunk leaves 16 >= 8 free); at 24 pages it runs out and the
    # fullest FULL request is demoted: a frees pages 1..38 (38), keeps 4 as its buffer
    run_prefill(ctl, b, running)
    assert (a.mode, b.mode) == (Residency.SPARSE, Residency.FULL)
    assert a.stats.num_demotions == 1 and pinned(a) == [0, 39]  # sink; recent window of token 640
    assert ctl.allocator.num_free_slots == 64 - 40 - 2 - 4


def test_always_full_waits_for_the_whole_prompt_and_always_sparse_never_goes_full():
    full = make("always-full", num_slots=48)
    a, b = request("a", 640), request("b", 640)
    assert full.admit(a, 512)  # 48 free >= the 41-page context: 32 pages for this chunk
    assert not full.admit(b, 512)  # 16 free < 41: waits, changes nothing
    assert full.allocator.num_free_slots == 16 and b.slots == [] and b.mode is Residency.FULL
    sparse = make("always-sparse")
    c = request("c", 100)
    run_prefill(sparse, c, [])
    assert c.mode is Residency.SPARSE and pinned(c) == [0, 5, 6]  # sink, recent window, tail
    assert sparse.allocator.num_free_slots == 64 - 3 - 4
    assert sparse.promotion_step([c]) == [] and c.mode is Residency.SPARSE


def test_demotion_then_promotion_within_the_transfer_budget():
    ctl = make("adaptive", num_slots=100, low=10, high=15)
    running: list[Request] = []
    a, b = request("a", 320), request("b", 960)  # 20 and 60 pages
    run_prefill(ctl, a, running)
    run_prefill(ctl, b, running)
    assert (a.mode, b.mode) == (Residency.FULL, Residency.FULL) and ctl.allocator.num_free_slots == 20
    assert ctl.demote_one(running)  # b frees pages 1..58 (58), a only 1..18
    assert b.mode is Residency.SPARSE and a.mode is Residency.FULL
    assert ctl.allocator.num_free_slots == 20 + 58 - 4 and pinned(b) == [0, 59]
    # 74 free >= high, and promoting b ends at 74 - 58 + 4 = 20 >= high: 8 pages per step
    fetched, steps = [], 0
    while b.mode is Residency.SPARSE:
        ((req, pages),) = ctl.promotion_step(running)
        fetched += pages
        steps += 1
        ctl.finish_promotion(req)
    assert fetched == list(range(1, 59)) and steps == 8
    assert b.stats.num_promotions == 1 and b.buffer is None and ctl.allocator.num_free_slots == 20
    assert ctl.promotion_step(running) == []  # nothing SPARSE left


def test_no_promotion_that_would_fall_below_the_high_watermark():
    ctl = make("adaptive", num_slots=100, low=10, high=40)
    running: list[Request] = []
    for r in (request("a", 320), request("b", 960)):
        run_prefill(ctl, r, running)
    assert ctl.demote_one(running)
    assert ctl.allocator.num_free_slots == 74
    assert ctl.promotion_step(running) == []  # would end at 20 free < 40: hysteresis


def test_relieve_demotes_until_the_low_watermark_holds():
    ctl = make("adaptive", num_slots=100, low=30, high=60)
    running: list[Request] = []
    for i in range(3):
        run_prefill(ctl, request(f"r{i}", 480), running)  # 30 pages each
    assert [r.mode for r in running] == [Residency.FULL] * 3 and ctl.allocator.num_free_slots == 10
    ctl.relieve(running)  # one demotion frees 28 - 4 = 24: 34 >= 30
    assert [r.mode for r in running] == [Residency.SPARSE, Residency.FULL, Residency.FULL]
    assert ctl.allocator.num_free_slots == 34


@pytest.mark.parametrize("policy", ["adaptive", "always-sparse", "always-full"])
def test_release_returns_every_slot(policy):
    ctl = make(policy)
    r = request("r", 300)
    run_prefill(ctl, r, [])
    ctl.release(r)
    assert ctl.allocator.num_free_slots == 64 and r.buffer is None and r.slots == []
    assert ctl.allocator.check_integrity()
