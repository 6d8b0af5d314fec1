"""The GEMM plan: the fastest measured kernel per row count, one measurement per machine."""

import json
import time

import pytest
import torch
import torch.nn.functional as F

from services.decoder.model import gemm_plan
from services.decoder.model.gemm_plan import GemmPlan, apply_plan, measure_plan, plan_for, plan_key
from services.decoder.model.linear import Linear


def _slowed(monkeypatch, delay_ms):
    """Every ``Linear.run`` sleeps ``delay_ms(kernel, rows)`` first: a machine whose kernel speeds are known."""
    real = Linear.run

    def run(self, x, kernel):
        time.sleep(delay_ms(kernel, x.shape[0]) / 1e3)
        return real(self, x, kernel)

    monkeypatch.setattr(Linear, "run", run)


def _linears(out_features=(24, 16)):
    g = torch.Generator().manual_seed(0)
    return [Linear(torch.randn(n, 8, generator=g)) for n in out_features]


def test_the_plan_takes_the_fastest_kernel_at_each_row_count(monkeypatch):
    def delay_ms(kernel, rows):  # mm_w_xt wins at 1-2 rows, oneDNN above, MKL packs at 8 exactly
        return {"f_linear": 6.0, "mm_w_xt": 1.0 if rows <= 2 else 4.0, "onednn": 2.0,
                "mkl_pack": 0.5 if rows == 8 else 5.0}[kernel]

    _slowed(monkeypatch, delay_ms)
    monkeypatch.setattr(gemm_plan, "PAD_MIN_SAVING", 1.0)  # the kernel choice alone (8 rows would pad 1-3 here)
    plan = measure_plan(_linears(), rows=(1, 2, 3, 8, 16, 128))
    assert plan.kernels == ("mm_w_xt", "mm_w_xt", "onednn", "mkl_pack", "onednn", "onednn")
    for ms, kernel in zip(plan.ms, plan.kernels):
        assert min(ms, key=ms.get) == kernel
    assert "mkl_pack" not in plan.ms[0] and "mkl_pack" in plan.ms[3]  # packs only where they serve
    assert plan.kernel(5) == "mkl_pack" and plan.kernel(9) == "onednn" and plan.kernel(1000) == "onednn"


def test_one_stalled_pass_of_the_fastest_kernel_does_not_drop_it(monkeypatch):
    stalled = []

    def delay_ms(kernel, rows):  # oneDNN wins at 16 rows, but its first pass there stalls 40 ms (a busy machine)
        if kernel == "onednn" and rows == 16 and not stalled:
            stalled.append(rows)
            return 40.0
        return {"f_linear": 6.0, "mm_w_xt": 4.0, "onednn": 2.0, "mkl_pack": 5.0}[kernel]

    _slowed(monkeypatch, delay_ms)
    plan = measure_plan(_linears(), rows=(1, 16))  # 1 row first: oneDNN's weight copy is built before 16 rows
    assert stalled == [16]
    assert plan.kernels[1] == "onednn"  # one round alone dropped it: 42 ms > 1.5 x mm_w_xt's 8


def test_apply_plan_frees_the_copies_of_kernels_it_never_runs(monkeypatch):
    linears = _linears()
    plan = measure_plan(linears, rows=(3, 8, 128))  # builds MKL packs and the oneDNN copy while timing
    assert "mkl_pack" not in plan.ms[0] and "mkl_pack" not in plan.ms[2]  # 1-3 rows, beyond the grid: no packs
    forced = GemmPlan((1, 8), ("onednn", "onednn"))
    apply_plan(linears, forced)
    assert all(lin.plan is forced and not lin._packs and lin._onednn_pack is not None for lin in linears)
    assert set(plan.ms[1]) == {"f_linear", "mm_w_xt", "mkl_pack", "onednn"}  # 4-8 rows: every kernel


def test_a_plan_is_measured_once_per_machine_and_read_back(monkeypatch, tmp_path):
    linears = _linears()
    calls = []
    real = gemm_plan.measure_plan
    monkeypatch.setattr(gemm_plan, "measure_plan", lambda lins: calls.append(1) or real(lins, rows=(1, 4, 128)))
    monkeypatch.setattr(gemm_plan, "_MEMO", {})
    first = plan_for(linears, tmp_path)
    assert len(calls) == 1 and json.loads((tmp_path / f"{plan_key(linears)}.json").read_text())["kernels"] == list(first.kernels)
    assert plan_for(linears, tmp_path) is first  # memoised in this process
    monkeypatch.setattr(gemm_plan, "_MEMO", {})  # a new process: reads the file
    assert plan_for(linears, tmp_path) == first and len(calls) == 1
    (tmp_path / f"{plan_key(linears)}.json").write_text("{not json")
    monkeypatch.setattr(gemm_plan, "_MEMO", {})
    assert plan_for(linears, tmp_path).rows == (1, 4, 128) and len(calls) == 2  # unreadable: measured again
    assert json.loads((tmp_path / f"{plan_key(linears)}.json").read_text())["rows"] == [1, 4, 128]


def test_the_key_changes_with_what_the_timings_depend_on():
    linears = _linears()
    key = plan_key(linears)
    assert plan_key(_linears((24, 16))) == key
    assert plan_key(_linears((24, 32))) != key  # other shapes
    assert plan_key([Linear(lin.weight.bfloat16()) for lin in linears]) != key  # another dtype
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads != 1 else 2)
        assert plan_key(linears) != key
    finally:
        torch.set_num_threads(threads)


def test_the_model_runs_its_measured_plan(loaded_model):
    """``LlamaModel``'s default: every projection follows the one plan measured for this machine."""
    from services.decoder.model.llama import LlamaModel

    model = LlamaModel(loaded_model.config, loaded_model.weights, torch.float32)
    plan = model.gemm_plan
    assert plan is not None and plan.rows == gemm_plan.PLAN_ROWS
    assert all(lin.plan is plan for lin in model.projections)
    for i, (ms, kernel) in enumerate(zip(plan.ms, plan.kernels)):
        assert min(ms, key=ms.get) == kernel
        if plan.pad_to and plan.pad_to[i]:  # decided head to head (choose_pads), not from these first timings
            assert plan.rows[i] < plan.pad_to[i] <= gemm_plan.PAD_MAX_ROWS
    assert LlamaModel(loaded_model.config, loaded_model.weights, gemm_plan="default").gemm_plan is None
    with pytest.raises(ValueError, match="gemm_plan"):
        LlamaModel(loaded_model.config, loaded_model.weights, gemm_plan="fastest")


def test_counts_run_padded_where_a_larger_count_is_measured_faster(monkeypatch):
    """oneDNN on the AVX512 EPYC: 6 rows at once is its fastest count, 1-4 take slower paths."""
    def delay_ms(kernel, rows):
        if kernel == "onednn":
            return {6: 1.0, 8: 2.5}.get(rows, 4.0)
        return 3.0 if kernel == "f_linear" else 3.5

    _slowed(monkeypatch, delay_ms)
    plan = measure_plan(_linears(), rows=(1, 2, 4, 6, 8, 128))
    assert plan.pad_to == (6, 6, 6, None, None, None)
    assert [plan.kernel(n) for n in (1, 4, 6)] == ["onednn"] * 3 and plan.kernels[0] == "f_linear"  # as measured
    assert [plan.run_rows(n) for n in (1, 3, 4, 5, 6, 7, 9, 500)] == [6, 6, 6, 5, 6, 7, 9, 500]
    assert plan.describe().startswith("1->6:onednn 2->6:onednn 4->6:onednn 6:onednn")
    assert plan.unpadded().pad_to == () and plan.unpadded().kernel(1) == "f_linear"
    assert GemmPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_a_pad_within_the_noise_is_not_taken(monkeypatch):
    def delay_ms(kernel, rows):  # 6 rows 2% faster than 1-4: less than PAD_MIN_SAVING
        return 2.94 if rows == 6 else 3.0

    _slowed(monkeypatch, delay_ms)
    plan = measure_plan(_linears(), rows=(1, 4, 6, 128))
    assert plan.pad_to == () and all(plan.run_rows(n) == n for n in (1, 3, 6))


def test_a_padded_linear_computes_the_unpadded_product():
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(48, 16, generator=g), torch.randn(48, generator=g)
    plan = GemmPlan((2, 6, 8, 128), ("mm_w_xt", "onednn", "mkl_pack", "f_linear"), pad_to=(6, None, None, None))
    lin = Linear(weight, bias, plan=plan)
    assert [lin.padded_rows(n) for n in (1, 2, 3, 7, 9)] == [6, 6, 3, 8, 9]
    for n in (1, 2, 5, 7):
        x = torch.randn(n, 16, generator=g)
        got = lin(x)
        assert got.shape == (n, 48) and got.is_contiguous()
        torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)  # fp32 rounding only
    packed = Linear(weight, plan=GemmPlan((3, 8, 128), ("f_linear", "mkl_pack", "f_linear"), pad_to=(8, None, None)))
    assert packed.kernel(1) == "mkl_pack" and packed.padded_rows(1) == 8
    torch.testing.assert_close(packed(x[:1]), F.linear(x[:1], weight), rtol=1e-5, atol=1e-5)


def test_pads_that_cannot_run_are_refused():
    with pytest.raises(ValueError, match="pad_to needs one entry"):
        GemmPlan((1, 6, 128), ("onednn",) * 3, pad_to=(6, None))
    with pytest.raises(ValueError, match="only pad to a larger grid point"):
        GemmPlan((1, 6, 128), ("onednn",) * 3, pad_to=(5, None, None))  # not a grid point
    with pytest.raises(ValueError, match="only pad to a larger grid point"):
        GemmPlan((1, 6, 128), ("onednn",) * 3, pad_to=(None, None, 256))  # the last point serves every larger count
