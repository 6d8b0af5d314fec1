"""The H200 projection model: hand-computed cases to the byte, monotonicity, the CLI's JSON."""

import dataclasses
import json

import pytest

from benchmarks.h200_projection import constants as C
from benchmarks.h200_projection.modes import (
    dense_fit,
    pcie_break_even,
    project_adaptive,
    project_all,
    project_dense,
    project_sparse,
    sparse_fit,
)
from benchmarks.h200_projection.run import main
from benchmarks.h200_projection.shapes import GLM5_LIKE, LLAMA_3_1_8B, QWEN3_8B
from benchmarks.h200_projection.step_model import Batch, pcie_miss_bytes, step_cost, working_set_pages
from benchmarks.h200_projection.traces import HitCurve, TraceInputs, load_trace

HW = C.Hardware()
WL = C.Workload()
SPEC = C.Speculation()
NOSPEC = C.NO_SPECULATION
LLAMA_PAGE_BYTES = 16 * 4096 * 32  # one page in all 32 layers: 2,097,152


def default_curve(spec=NOSPEC, wl=WL):
    return TraceInputs().hit_curve(working_set_pages(wl, spec), wl.context_pages)


# --- hand-computed shapes ----------------------------------------------------------------------
def test_kv_bytes_per_token_per_layer():
    assert LLAMA_3_1_8B.kv_bytes_per_token_per_layer == 2 * 8 * 128 * 2 == 4096
    assert QWEN3_8B.kv_bytes_per_token_per_layer == 4096
    assert GLM5_LIKE.kv_bytes_per_token_per_layer == (512 + 64) * 2 == 1152
    assert LLAMA_3_1_8B.kv_bytes_per_page(16) == LLAMA_PAGE_BYTES


def test_parameter_counts_match_the_published_totals():
    # per layer: q + o 2*4096*4096, k + v 2*4096*1024, MLP 3*4096*14336, two norms 2*4096
    assert LLAMA_3_1_8B.params_per_layer == 33_554_432 + 8_388_608 + 176_160_768 + 8_192 == 218_112_000
    assert LLAMA_3_1_8B.dense_total_params == 8_030_261_248  # Llama-3.1-8B's published count
    # Qwen3-8B publishes 8,190,735,360, which includes q/k norms (36 x 256 = 9,216) left out here.
    assert QWEN3_8B.dense_total_params + 36 * 256 == 8_190_735_360


def test_weight_bytes_read_per_step():
    # everything but the input embedding table (128256 x 4096), in bf16
    assert LLAMA_3_1_8B.weight_bytes_read_per_step == (8_030_261_248 - 525_336_576) * 2 == 15_009_849_344
    assert LLAMA_3_1_8B.resident_weight_bytes == 16_060_522_496
    # MoE slice: 744e9 params x 1 byte (fp8) / 8 GPUs, all of them read per step
    assert GLM5_LIKE.resident_weight_bytes == GLM5_LIKE.weight_bytes_read_per_step == 93e9


def test_digest_bytes():
    # min and max of 8 kv heads x 128 keys, bf16, per page per layer
    assert LLAMA_3_1_8B.digest_bytes_per_page_per_layer(2) == 2 * 8 * 128 * 2 == 4096
    assert LLAMA_3_1_8B.digest_bytes_per_page(1) == 2048 * 32


def test_workload_pages():
    assert WL.context_pages == 6250
    assert WL.selected_pages == 1 + 4 + 128 == 133
    assert working_set_pages(WL, SPEC) == 200  # ceil(133 x 1.5)
    assert working_set_pages(C.Workload(context_tokens=1000), SPEC) == 63  # capped at the context


# --- hand-computed steps -------------------------------------------------------------------------
def test_pcie_bytes_for_a_miss_count():
    assert pcie_miss_bytes(LLAMA_3_1_8B, WL, 10) == 10 * 16 * 4096 * 32 == 20_971_520
    cost = step_cost(LLAMA_3_1_8B, HW, WL, NOSPEC, Batch(num_sparse=2, buffer_pages=133, hit_rate=0.75))
    assert cost.pcie_h2d_bytes == 2 * 133 * 0.25 * LLAMA_PAGE_BYTES == 139_460_608
    assert cost.pcie_d2h_bytes == 2 * 1 * 4096 * 32  # one committed row per request, all layers


def test_dense_step_bytes():
    cost = step_cost(LLAMA_3_1_8B, HW, WL, NOSPEC, Batch(num_dense=1))
    assert cost.weight_bytes == 15_009_849_344
    assert cost.dense_kv_bytes == 100_000 * 4096 * 32 == 13_107_200_000
    assert cost.hbm_read_bytes == 15_009_849_344 + 13_107_200_000
    assert cost.hbm_write_bytes == 4096 * 32  # the new row
    assert cost.pcie_h2d_bytes == cost.pcie_d2h_bytes == cost.digest_bytes == 0
    expected_hbm_s = (15_009_849_344 + 131_072) / (4.8e12 * 0.85) + 13_107_200_000 / (4.8e12 * 0.80)
    assert cost.hbm_s == pytest.approx(expected_hbm_s, rel=1e-12)
    assert cost.step_s == pytest.approx(max(expected_hbm_s, cost.compute_s) + 1e-3, rel=1e-12)


def test_sparse_step_bytes():
    cost = step_cost(LLAMA_3_1_8B, HW, WL, NOSPEC, Batch(num_sparse=3, buffer_pages=133, hit_rate=1.0))
    assert cost.sparse_kv_bytes == 3 * 133 * LLAMA_PAGE_BYTES == 836_763_648
    assert cost.digest_bytes == 3 * 6250 * 4096 * 32 == 2_457_600_000
    assert cost.pcie_h2d_bytes == 0
    assert cost.memory_bytes == 16_060_522_496 + 3 * 133 * LLAMA_PAGE_BYTES + 2_457_600_000


def test_dense_fitting_concurrency_for_a_given_budget():
    per_request = 6250 * LLAMA_PAGE_BYTES  # 13,107,200,000
    budget = 16_060_522_496 + 3 * per_request
    assert dense_fit(LLAMA_3_1_8B, C.Hardware(hbm_capacity_bytes=budget, hbm_usable_fraction=1.0), WL) == 3
    assert dense_fit(LLAMA_3_1_8B, C.Hardware(hbm_capacity_bytes=budget - 1, hbm_usable_fraction=1.0), WL) == 2
    # the default H200: floor((141e9 x 0.9 - 16.06e9) / 13.1072e9) = 8, not 128
    assert dense_fit(LLAMA_3_1_8B, HW, WL) == 8
    p = project_dense(LLAMA_3_1_8B, HW, WL, NOSPEC)
    assert p.batch.num_requests == 8 and not p.fits_target


def test_sparse_fitting_concurrency():
    per_request = 6250 * 4096 * 32 + 133 * LLAMA_PAGE_BYTES  # digests + working-set buffer
    budget = 16_060_522_496 + 5 * per_request
    assert sparse_fit(LLAMA_3_1_8B, C.Hardware(hbm_capacity_bytes=budget, hbm_usable_fraction=1.0), WL, 133) == 5


def test_speculation_tokens_and_flops():
    batch = Batch(num_sparse=4, buffer_pages=200, hit_rate=1.0)
    plain = step_cost(LLAMA_3_1_8B, HW, WL, NOSPEC, batch)
    spec = step_cost(LLAMA_3_1_8B, HW, WL, SPEC, batch)
    assert plain.tokens_per_step == 4 and spec.tokens_per_step == 4 * 2.5
    assert spec.sparse_kv_bytes == 4 * 200 * LLAMA_PAGE_BYTES  # union of the block, read once
    assert spec.flops > 9 * plain.flops * 0.99  # nine query tokens per request
    with pytest.raises(ValueError):
        C.Speculation(gamma=4, acceptance_length=5.5)


# --- monotonicity --------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [LLAMA_3_1_8B, QWEN3_8B, GLM5_LIKE])
@pytest.mark.parametrize("overlap", [True, False])
def test_higher_hit_rate_is_never_slower(shape, overlap):
    hw = C.Hardware(pcie_overlapped=overlap)
    steps = [step_cost(shape, hw, WL, SPEC, Batch(num_sparse=64, buffer_pages=200, hit_rate=h / 20)).step_s
             for h in range(21)]
    assert all(b <= a for a, b in zip(steps, steps[1:]))


@pytest.mark.parametrize("shape", [LLAMA_3_1_8B, QWEN3_8B, GLM5_LIKE])
def test_more_hbm_bandwidth_is_never_slower(shape):
    curve = default_curve()
    for mode in range(3):
        rates = [project_all(shape, C.Hardware(hbm_bandwidth_bytes_per_s=bw * 1e12), WL, NOSPEC, curve)[mode]
                 .cost.tokens_per_s for bw in (1.0, 2.0, 3.35, 4.8, 8.0)]
        assert all(b >= a for a, b in zip(rates, rates[1:]))


def test_larger_acceptance_length_never_fewer_tokens_per_s():
    batch = Batch(num_sparse=128, buffer_pages=200, hit_rate=0.9)
    costs = [step_cost(LLAMA_3_1_8B, HW, WL, C.Speculation(acceptance_length=t / 2), batch) for t in range(2, 19)]
    assert all(b.tokens_per_s >= a.tokens_per_s for a, b in zip(costs, costs[1:]))
    # the step time does not depend on tau while write-back is not the bottleneck
    assert len({round(c.step_s, 15) for c in costs}) == 1


def test_no_overlap_is_never_faster():
    batch = Batch(num_sparse=32, buffer_pages=133, hit_rate=0.8)
    a = step_cost(LLAMA_3_1_8B, HW, WL, NOSPEC, batch)
    b = step_cost(LLAMA_3_1_8B, C.Hardware(pcie_overlapped=False), WL, NOSPEC, batch)
    assert b.step_s == pytest.approx(max(a.hbm_s, a.compute_s) + a.pcie_s + 1e-3)
    assert b.step_s >= a.step_s


def test_hit_curve_is_monotone_and_full_at_the_context():
    curve = default_curve()
    values = [curve.hit_rate(b) for b in range(0, 6400, 25)]
    assert all(b >= a for a, b in zip(values, values[1:]))
    assert curve.hit_rate(133) == pytest.approx(0.80) and curve.hit_rate(6250) == 1.0
    with pytest.raises(ValueError):
        HitCurve(((10, 0.9), (20, 0.5)), 100)


# --- modes ---------------------------------------------------------------------------------------
def test_light_load_is_all_hot_and_adaptive_beats_sparse():
    wl = C.Workload(num_requests=4)
    curve = default_curve(wl=wl)
    adaptive = project_adaptive(LLAMA_3_1_8B, HW, wl, NOSPEC, curve)
    sparse = project_sparse(LLAMA_3_1_8B, HW, wl, NOSPEC, curve)
    assert adaptive.batch.num_resident == 4 and adaptive.cost.pcie_h2d_bytes == 0
    assert adaptive.cost.tokens_per_s >= sparse.cost.tokens_per_s


def test_break_even_buffer_is_the_smallest_not_pcie_bound():
    wl = C.Workload(digest_bytes_per_value=1)
    curve = default_curve(wl=wl)
    be = pcie_break_even(LLAMA_3_1_8B, HW, wl, NOSPEC, curve)
    n, b = be["concurrency"], be["buffer_pages"]
    assert be["pcie_bound_at_working_set_buffer"]

    def cost(pages):
        return step_cost(LLAMA_3_1_8B, HW, wl, NOSPEC, Batch(num_sparse=n, buffer_pages=pages,
                                                              hit_rate=curve.hit_rate(pages)))

    at, below = cost(b), cost(b - 1)
    assert at.pcie_s <= max(at.hbm_s, at.compute_s)
    assert below.pcie_s > max(below.hbm_s, below.compute_s)


# --- traces and CLI ------------------------------------------------------------------------------
def write_trace(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({
        "source": "unit test", "context_tokens": 8192,
        "hit_rate_curve": [{"buffer_pages": 16, "hit_rate": 0.5}, {"buffer_pages": 64, "hit_rate": 0.9}],
        "working_set_union_factor": 1.25, "mean_acceptance_length": 3.0,
    }))
    return path


def test_trace_page_counts_scale_linearly(tmp_path):
    trace = load_trace(write_trace(tmp_path), 100_000)
    assert trace.hit_points == ((16 * 100_000 / 8192, 0.5), (64 * 100_000 / 8192, 0.9))
    assert trace.working_set_union_factor == 1.25 and trace.acceptance_length == 3.0
    assert trace.provenance["gamma"].startswith("ASSUMED")
    assert "linear" in trace.scaling


def test_cli_writes_json_with_every_constant(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--out", str(out), "--no-plot"]) == 0
    result = json.loads((out / "h200_projection.json").read_text())
    names = {k for k in vars(C) if k.isupper()}
    assert set(result["constants"]) == names
    assert result["constants"]["HBM_BANDWIDTH_BYTES_PER_S"] == 4.8e12
    assert result["hardware"] == json.loads(json.dumps(dataclasses.asdict(HW)))
    assert set(result["assumed_inputs"]) == {"hit_rate_curve", "working_set_union_factor",
                                             "mean_acceptance_length", "gamma"}
    assert len(result["rows"]) == 3 * 3 * 2  # models x modes x speculation
    assert {r["mode"] for r in result["rows"]} == {"dense-resident", "always-sparse", "adaptive"}
    assert "ASSUMED" in capsys.readouterr().out


def test_cli_with_trace_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    assert main(["--out", str(out), "--models", "llama-3.1-8b", "--trace", str(write_trace(tmp_path))]) == 0
    result = json.loads((out / "h200_projection.json").read_text())
    assert result["trace"]["source"] == "unit test"
    assert result["speculation_on"]["acceptance_length"] == 3.0
    assert "gamma" in result["assumed_inputs"] and "hit_rate_curve" not in result["assumed_inputs"]
    assert (out / "h200_projection.png").stat().st_size > 0
    assert "linear in page count" in capsys.readouterr().out
