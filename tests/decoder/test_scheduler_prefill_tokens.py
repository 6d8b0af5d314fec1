"""The scheduler's estimate of the prefill-chunk tokens the coming step schedules beside its
decodes (what the verify budget prices a step's drafts at)."""

from services.decoder.engine.request import Request
from services.decoder.engine.sampling_params import SamplingParams
from services.decoder.engine.scheduler import Scheduler
from services.decoder.engine.stop_checker import StopChecker


class _Tok:
    def decode(self, ids, **kw):
        return ""


def _request(name: str, prompt_len: int, computed: int) -> Request:
    params = SamplingParams(max_tokens=8)
    request = Request(name, list(range(1, prompt_len + 1)), params, StopChecker(_Tok(), params, ()), max_model_len=4096)
    request.num_computed_tokens = computed
    return request


def test_prefill_tokens_count_running_chunks_then_admissible_waiting_ones_within_the_budget():
    scheduler = Scheduler(controller=None, page_size=16, max_num_seqs=4, max_num_batched_tokens=512)
    assert scheduler.prefill_tokens() == 0
    scheduler.running = [_request("d1", 10, 9), _request("d2", 10, 9)]  # two decodes
    assert scheduler.prefill_tokens() == 0
    scheduler.running.append(_request("p", 100, 40))  # 60 prompt tokens left to prefill
    assert scheduler.prefill_tokens() == 60
    for name in ("w1", "w2"):
        scheduler.add(_request(name, 300, 0))
    # one sequence free (4 - 3 running): w1's 300, not w2's
    assert scheduler.prefill_tokens() == 360
    scheduler.max_num_seqs = 8
    # 660 pending, but the budget leaves 512 - 2 decodes
    assert scheduler.prefill_tokens() == 510
