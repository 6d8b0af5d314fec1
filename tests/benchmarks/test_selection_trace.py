"""The selection trace that feeds the H200 projection: the LRU replay against hand-computed hits,
the trace format the projection reads, and a real run whose replay reproduces the engine's hits."""

import json

import pytest
import torch

from benchmarks.h200_projection import constants as C
from benchmarks.h200_projection.traces import load_trace
from benchmarks.selection_trace import main, replay_hits


def steps_of(*working_sets):
    """One layer per step: ``steps[step][0]`` is that step's working set."""
    return [[torch.tensor(ws, dtype=torch.int64)] for ws in working_sets]


def test_replay_hits_matches_hand_computed_lru():
    steps = steps_of([0, 1], [1, 2], [0, 2], [3])
    # capacity 2: [0,1] two misses; [1,2] hit 1, 2 evicts 0; [0,2] hit 2, 0 evicts 1; [3] evicts 0
    assert replay_hits(steps, capacity=2, max_pages=8) == (2, 5)
    assert replay_hits(steps, capacity=2, max_pages=8, warmup_steps=1) == (2, 3)
    # capacity 3: [0,1] misses; [1,2] hit 1, 2 takes the free slot; [0,2] both hit; [3] evicts 1
    assert replay_hits(steps, capacity=3, max_pages=8) == (3, 4)
    # every layer is its own buffer: a second layer with other pages does not disturb the first
    two_layers = [step + [torch.tensor([5, 6], dtype=torch.int64)] for step in steps]
    assert replay_hits(two_layers, capacity=2, max_pages=8) == (2 + 6, 5 + 2)


def test_replay_refuses_a_buffer_smaller_than_a_working_set():
    with pytest.raises(ValueError, match="capacity"):
        replay_hits(steps_of([0, 1, 2]), capacity=2, max_pages=8)


def test_projection_reads_a_selection_trace_result(tmp_path):
    result = {"benchmark": "selection_trace", "runs": [], "trace": {
        "source": "test", "context_tokens": 8192,
        "hit_rate_curve_over_working_set": [{"buffer_over_working_set": 2.0, "hit_rate": 0.9},
                                            {"buffer_over_working_set": 1.0, "hit_rate": 0.7}],
        "working_set_union_factor": 1.3, "mean_acceptance_length": 1.6, "gamma": 8}}
    path = tmp_path / "selection_trace.json"
    path.write_text(json.dumps(result))
    trace = load_trace(path)
    assert trace.hit_ratios == ((1.0, 0.7), (2.0, 0.9))
    assert trace.hit_points is None
    assert (trace.working_set_union_factor, trace.acceptance_length, trace.gamma) == (1.3, 1.6, 8)
    assert not [k for k, v in trace.provenance.items() if v.startswith("ASSUMED")]
    curve = trace.hit_curve(working_set_pages=100, full_pages=6250)
    assert curve.hit_rate(100) == pytest.approx(0.7)
    assert curve.hit_rate(150) == pytest.approx(0.8)  # halfway between the 1x and 2x points
    assert curve.hit_rate(200) == pytest.approx(0.9)
    assert curve.hit_rate(6250) == 1.0
    # the assumed curve is used only without a trace
    assert load_trace(None).hit_curve(100, 6250).hit_rate(100) == dict(C.DEFAULT_HIT_CURVE_RATIOS)[1.0]


def test_a_trace_gives_one_hit_curve_not_two(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"context_tokens": 1024, "hit_rate_curve": [{"buffer_pages": 4, "hit_rate": 0.5}],
                                "hit_rate_curve_over_working_set": [{"buffer_over_working_set": 1, "hit_rate": 0.5}]}))
    with pytest.raises(ValueError, match="not both"):
        load_trace(path)


def test_recorded_run_replays_to_the_engines_own_hits(tmp_path):
    """Real weights, real kvtier: the replay of the recorded working sets at the engine's buffer size
    gives exactly the hits and misses the engine counted; the spec run measures union and acceptance."""
    assert main(["--requests", "1", "--prompt-tokens", "512", "--max-tokens", "12", "--top-k-tokens", "64",
                 "--spec-tokens", "4", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "selection_trace.json").read_text())
    plain, spec = result["runs"]
    assert plain["replay_check"]["equal"] and plain["engine_hits"] + plain["engine_misses"] > 0
    assert plain["decode_steps_recorded"] == 11  # max_tokens - 1: the first token comes from prefill
    assert plain["mean_working_set_pages"] <= 64 // 16  # one token selects at most top-k pages unpinned
    rates = [p["hit_rate"] for p in plain["hit_rate_curve"]]
    assert rates == sorted(rates) and 0 < rates[0] <= 1  # LRU: a bigger buffer never hits less
    assert all(p["hit_rate_with_first_fill"] <= p["hit_rate"] for p in plain["hit_rate_curve"])
    assert spec["union_factor"] >= 1.0 and spec["num_verify_blocks_x_layers"] > 0
    assert 1.0 <= spec["mean_acceptance_length"] <= 4 + 1
    trace = load_trace(tmp_path / "selection_trace.json")
    assert trace.gamma == 4 and trace.hit_ratios[0][1] == rates[0]
