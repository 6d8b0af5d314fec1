"""The speculation trace's summary (benchmarks/spec_trace.py) on hand-made steps: exact figures."""

import pytest

from benchmarks.spec_trace import summarize


def _step(tokens, decoding, drafted, committed, exec_s, propose_s, step_s, plain_s=None, plan=None):
    step = {"tokens": tokens, "num_decoding": decoding, "drafted": drafted, "committed": committed,
            "exec_s": exec_s, "propose_s": propose_s, "step_s": step_s, "drafter_ran": drafted > 0,
            "predicted_exec_s": plain_s, "predicted_plain_s": plain_s}
    if plan is not None:
        step.update(plan_committed=plan[0], plan_s=plan[1], plan_gain=plan[2])
    return step


def test_summary_splits_the_time_and_prices_a_drafting_step_against_a_plain_one():
    steps = [
        _step(4, 4, 0, 4, 0.080, 0.0, 0.081, plain_s=0.080),  # plain: 4 tokens in 81 ms
        _step(8, 4, 4, 6, 0.090, 0.020, 0.111, plain_s=0.080, plan=(6.5, 0.092, 1.3)),  # k=1 each
        _step(512, 1, 0, 1, 0.500, 0.0, 0.501, plain_s=0.080),  # a prefill chunk: not a decode step
    ]
    out = summarize(steps)
    assert out["decode_steps"] == 2 and out["committed"] == 10 and out["verify_steps"] == 1
    assert out["committed_per_s"] == pytest.approx(10 / 0.192)
    assert out["exec_share"] == pytest.approx(0.170 / 0.192)
    assert out["propose_share"] == pytest.approx(0.020 / 0.192)
    # 6 tokens in 111 ms against 4 tokens in 80 ms + the same 1 ms of bookkeeping
    assert out["drafting_step_gain"]["median"] == pytest.approx((6 / 0.111) / (4 / 0.081))
    assert out["plan"] == {"steps": 1, "expected_committed": 6.5, "committed": 6, "predicted_exec_s": 0.092,
                           "exec_s": 0.090, "propose_s": 0.020, "mean_predicted_gain": 1.3}
    assert out["by_tokens"][8]["propose_ms"] == pytest.approx(20.0)
    assert out["by_tokens"][8]["rest_ms"] == pytest.approx(1.0)
