"""report.md: headline rows from the benchmark JSONs, missing benchmarks listed as not run."""

import json

from benchmarks.report import build


def test_report_rows_ratios_and_verdicts(tmp_path):
    (tmp_path / "transfer.json").write_text(json.dumps({
        "gib_per_s": {"write_back": 9.0, "fetch": 6.0, "memcpy_to_shm": 10.0, "memcpy_from_shm": 10.0},
        "ratios": {"write_back_vs_memcpy": 0.9, "fetch_vs_memcpy": 0.6}}))
    (tmp_path / "residency.json").write_text(json.dumps({
        "settings": {"concurrency": [1, 2, 8]},
        "targets": {"adaptive_vs_full_at_low_load": {"1": 0.98, "2": 0.9}, "adaptive_vs_sparse_at_high_load": 1.2,
                    "full_admission_wall": 2}}))
    text = build(tmp_path)
    lines = text.splitlines()
    assert "| transfer | page write-back vs memcpy (CPU, shm) | GiB/s | 9 | 10 | 0.9 | >= 0.70 | PASS |" in lines
    assert "| transfer | page fetch vs memcpy (CPU, shm) | GiB/s | 6 | 10 | 0.6 | >= 0.70 | FAIL |" in lines
    assert any(line.startswith("| residency | adaptive vs always-full at concurrency 2 |") and line.endswith("FAIL |")
               for line in lines)
    assert "| decode | not run (no `decode.json`) | | | | | | |" in lines
    assert "gpu kernels" not in text  # no GPU folder given


def _decode_json(llama_cpp: dict) -> dict:
    keys = ("batch1_prompt128_tokens_per_s", "batch1_prompt2000_tokens_per_s", "concurrent8_aggregate_decode_tokens_per_s")
    ours = dict(zip(keys, (40.0, 30.0, 160.0), strict=True))
    ratios = {k: ours[k] / 20.0 for k in keys}
    ratios.update({f"{k}_vs_llama_cpp": ours[k] / llama_cpp[k] for k in keys if k in llama_cpp})
    ratios.update(concurrent8_vs_our_batch1=4.0, batch1_prompt128_fraction_of_bandwidth_bound=0.5)
    return {"ours": ours, "transformers": dict.fromkeys(keys, 20.0), "llama_cpp": llama_cpp, "ratios": ratios,
            "bandwidth_bound_tokens_per_s": 80.0}


def test_llama_cpp_rows_or_the_reason_it_was_not_measured(tmp_path):
    (tmp_path / "decode.json").write_text(json.dumps(_decode_json(
        {"batch1_prompt128_tokens_per_s": 80.0, "batch1_prompt2000_tokens_per_s": 60.0,
         "concurrent8_aggregate_decode_tokens_per_s": 320.0})))
    lines = build(tmp_path).splitlines()
    assert ("| decode | decode batch 1, 128-token prompt vs llama.cpp (quantized GGUF) | tok/s | 40 | 80 | 0.5 |  |  |"
            in lines)
    assert any("8 concurrent (aggregate) vs llama.cpp" in line and "| 160 | 320 | 0.5 |" in line for line in lines)
    (tmp_path / "decode.json").write_text(json.dumps(_decode_json(
        {"unavailable": "llama-cpp-python is not installed: pip install -e '.[llamacpp]' builds it"})))
    lines = build(tmp_path).splitlines()
    assert "| decode | vs llama.cpp: not measured (llama-cpp-python is not installed) |  |  |  |  |  |  |" in lines


def test_gpu_decode_rows(tmp_path):
    run = {"shape": "smollm2-135m", "dtype": "bfloat16", "bandwidth_bound_tokens_per_s": 4000.0,
           "ours": {"batch1_prompt128_tokens_per_s": 200.0, "concurrent8_aggregate_decode_tokens_per_s": 1200.0},
           "transformers": {"batch1_prompt128_tokens_per_s": 100.0, "batch8_decode_tokens_per_s": 500.0},
           "ratios": {"batch1_vs_transformers": 2.0, "batch1_fraction_of_bandwidth_bound": 0.05}}
    (tmp_path / "gpu_decode.json").write_text(json.dumps(
        {"runs": [run], "agreement": {"prompts": 3, "tokens": 96, "equal_tokens": 90, "identical_sequences": False}}))
    lines = build(tmp_path / "cpu", gpu=tmp_path).splitlines()
    name = "GPU end-to-end decode, smollm2-135m shape (random weights) bfloat16"
    assert f"| gpu decode | {name}, batch 1 vs transformers | tok/s | 200 | 100 | 2 |  |  |" in lines
    assert f"| gpu decode | {name}, 8 concurrent (aggregate) vs our batch 1 | tok/s | 1.2e+03 | 200 | 6 |  |  |" in lines
    assert "| gpu decode | GPU vs CPU greedy tokens, 135M shape fp32 | tokens | 90 | 96 | 0.938 |  |  |" in lines
    assert "| gpu kernels | not run (no `gpu_kernels.json`) | | | | | | |" in lines


def test_adaptive_rows_against_none_and_the_best_fixed_length(tmp_path):
    def row(spec, budget, k, tok_s):
        return {"spec": spec, "verify_budget": budget, "spec_tokens": k, "kind": "chat", "concurrency": 4,
                "tokens_per_s": tok_s, "speedup_vs_none": tok_s / 100.0, "mean_acceptance_length": 2.0}

    rows = [row("none", "fixed", 0, 100.0), row("ngram", "fixed", 4, 120.0), row("ngram", "fixed", 8, 110.0),
            row("ngram", "adaptive", 8, 118.0), row("dflash", "adaptive", 7, 99.0)]
    (tmp_path / "spec_pooled_acceptance.json").write_text(json.dumps({"rows": rows}))
    lines = build(tmp_path).splitlines()
    name = "adaptive budget, pooled acceptance, vs fixed lengths"
    assert (f"| {name} | ngram adaptive vs best fixed (k=4), chat c=4 | tok/s | 118 | 120 | 0.983 | >= 0.95 | PASS |"
            in lines)
    assert (f"| {name} | speculation dflash k=7 adaptive, chat c=4 vs none | tok/s | 99 | 100 | 0.99 | "
            ">= 1x (adaptive never below none) | FAIL |") in lines
    assert not any("dflash adaptive vs best fixed" in line for line in lines)  # no fixed dflash row in this run


def test_fixed_learned_rows_show_the_acceptance_their_step_costs_need(tmp_path):
    """A fixed k=7 run at 0.6x no speculation with 1.5 tokens per verify pays 2.5 plain steps per
    verify step (1.5 / 0.6), so it would break even at 2.5 tokens per verify."""
    rows = [{"spec": "none", "verify_budget": "fixed", "spec_tokens": 0, "kind": "chat", "concurrency": 1,
             "tokens_per_s": 100.0, "speedup_vs_none": 1.0, "mean_acceptance_length": 1.0},
            {"spec": "dspark", "verify_budget": "fixed", "spec_tokens": 7, "kind": "chat", "concurrency": 1,
             "tokens_per_s": 60.0, "speedup_vs_none": 0.6, "mean_acceptance_length": 1.5},
            {"spec": "dspark", "verify_budget": "adaptive", "spec_tokens": 7, "kind": "chat", "concurrency": 1,
             "tokens_per_s": 99.0, "speedup_vs_none": 0.99, "mean_acceptance_length": 1.2}]
    (tmp_path / "spec_pooled_acceptance.json").write_text(json.dumps({"rows": rows}))
    lines = build(tmp_path).splitlines()
    name = "adaptive budget, pooled acceptance, vs fixed lengths"
    assert (f"| {name} | dspark k=7 fixed, chat c=1: acceptance length vs the length this run's step costs need "
            "for 1x | tokens/verify | 1.5 | 2.5 | 0.6 |  |  |") in lines
    assert sum("step costs need" in line for line in lines) == 1  # not for the adaptive row: its steps vary
