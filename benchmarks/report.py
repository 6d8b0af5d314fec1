"""``report.md`` for one results folder: the headline table of every benchmark JSON found there.

    python -m benchmarks.report [--dir results/<date>-<machine>] [--gpu-dir results/<date>-h200]

One row per headline figure: what is compared, our figure, the baseline measured in the same run
(transformers, dense attention, always-full, no speculation, memcpy, the in-process engine), the
ratio, the target and pass/fail. A benchmark whose JSON is missing is listed as not run.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.machine import results_dir
from benchmarks.spec_targets import aa_band, versus_best_fixed
from services.decoder.spec.drafter import LEARNED_DRAFTERS

Row = tuple[str, str, float | None, float | None, float | None, str, bool | None]  # name, unit, ours, base, ratio, target, pass


def _decode(d: dict) -> Iterator[Row]:
    ours, peer, ratios = d["ours"], d["transformers"], d["ratios"]
    for key, label in (("batch1_prompt128_tokens_per_s", "decode batch 1, 128-token prompt"),
                       ("batch1_prompt2000_tokens_per_s", "decode batch 1, 2,000-token prompt"),
                       ("concurrent8_aggregate_decode_tokens_per_s", "decode 8 concurrent (aggregate)")):
        yield (f"{label} vs transformers", "tok/s", ours[key], peer[key], ratios[key],
               ">= 2x (batch 1)" if "batch1" in key else "", ratios[key] >= 2 if "batch1" in key else None)
    yield ("8 concurrent vs our batch 1", "x", None, None, ratios["concurrent8_vs_our_batch1"], ">= 4x",
           ratios["concurrent8_vs_our_batch1"] >= 4)
    yield ("batch 1 vs the weight-bandwidth bound", "tok/s", ours["batch1_prompt128_tokens_per_s"],
           d["bandwidth_bound_tokens_per_s"], ratios["batch1_prompt128_fraction_of_bandwidth_bound"], "", None)
    lcpp = d.get("llama_cpp") or {"unavailable": "not in this decode.json"}
    if "unavailable" in lcpp:
        yield (f"vs llama.cpp: not measured ({lcpp['unavailable'].split(':')[0]})", "", None, None, None, "", None)
        return
    for key, label in (("batch1_prompt128_tokens_per_s", "decode batch 1, 128-token prompt"),
                       ("batch1_prompt2000_tokens_per_s", "decode batch 1, 2,000-token prompt"),
                       ("concurrent8_aggregate_decode_tokens_per_s", "decode 8 concurrent (aggregate)")):
        yield (f"{label} vs llama.cpp (quantized GGUF)", "tok/s", ours[key], lcpp[key], ratios[f"{key}_vs_llama_cpp"],
               "", None)


def _context_sweep(d: dict) -> Iterator[Row]:
    score = d["settings"].get("page_score", "quest")  # sweeps before the setting existed used Quest
    for r in d["rows"]:
        ctx = r["context_len"]
        target = {1024: ">= 0.95x", 32768: ">= 3x"}.get(ctx, "")
        ok = {1024: r["sparse_vs_dense"] >= 0.95, 32768: r["sparse_vs_dense"] >= 3}.get(ctx)
        note = " (beyond trained context)" if r.get("beyond_trained_context") else ""
        yield (f"sparse ({score} page score) vs dense decode at {ctx} tokens{note}", "tok/s", r["sparse_tokens_per_s"],
               r["dense_tokens_per_s"], r["sparse_vs_dense"], target, ok)
        if "llama_cpp_dense_tokens_per_s" in r:
            yield (f"dense decode at {ctx} tokens vs llama.cpp dense{note}", "tok/s", r["dense_tokens_per_s"],
                   r["llama_cpp_dense_tokens_per_s"], r["dense_vs_llama_cpp"], "", None)
            yield (f"sparse decode at {ctx} tokens vs llama.cpp dense{note}", "tok/s", r["sparse_tokens_per_s"],
                   r["llama_cpp_dense_tokens_per_s"], r["sparse_vs_llama_cpp"], "", None)


def _sparse_quality(d: dict) -> Iterator[Row]:
    t = d["targets"]
    ppl = t["ppl_increase_at_2048_on_8k"]
    yield ("perplexity increase, 2048-token budget, 8K docs", "fraction", ppl["value"], None, None,
           f"<= {ppl['limit']}", ppl["pass"])
    for budget in ("1024", "2048"):
        p = t[f"passkey_{budget}_matches_dense"]
        yield (f"passkey at {budget}-token budget matches dense ({p['dense_correct_cases']}/{p['cases']} dense-correct)",
               "", None, None, None, "equal to dense", p["pass"])


def spec_rows(d: dict) -> Iterator[Row]:
    for r in d["rows"]:
        if r["spec"] == "none":
            continue
        budget = r.get("verify_budget", "fixed")
        where = f"{r['kind']} c={r['concurrency']}" + (", sparse" if r.get("attention") == "sparse" else "")
        learned = r["spec"] in LEARNED_DRAFTERS
        target, ok = "", None
        if r["spec"] == "ngram" and r["kind"] == "code_edit" and r["concurrency"] == 1:
            target, ok = ">= 1.5x", r["speedup_vs_none"] >= 1.5
        elif learned and r["kind"] == "chat" and r["concurrency"] == 1:
            target, ok = "> 1x", r["speedup_vs_none"] > 1.0
        elif budget == "adaptive":
            band = aa_band(r, d["rows"])  # the same run's A/A control, where it has one
            target = ">= 1x (adaptive never below none)" + (f", less the A/A band {band:.3f}" if band else "")
            ok = r["speedup_vs_none"] >= 1.0 - band
        yield (f"speculation {r['spec']} k={r['spec_tokens']} {budget}, {where} vs none",
               "tok/s", r["tokens_per_s"], r["tokens_per_s"] / r["speedup_vs_none"], r["speedup_vs_none"], target, ok)
        if learned and r["kind"] == "chat" and r["spec_tokens"] == 7 and budget == "fixed":  # adaptive drafts are cut
            length = r["mean_acceptance_length"]
            yield (f"{r['spec']} mean acceptance length, block 8, {where}", "tokens/verify", length, None, None,
                   ">= 2.0", length >= 2.0)
        if learned and budget == "fixed" and r["mean_acceptance_length"] and r["speedup_vs_none"]:
            yield from _break_even(r, where)
    yield from _adaptive_vs_best_fixed(d["rows"])


def _break_even(r: dict, where: str) -> Iterator[Row]:
    """A fixed-length row's measured acceptance against the acceptance at which the same step
    costs would break even with no speculation. Every step of a fixed-length run verifies a full
    draft and pays the drafter, so its cost per step does not depend on how much is accepted:
    tok/s = length / step cost, hence break-even length = measured length / speedup."""
    length = r["mean_acceptance_length"]
    needed = length / r["speedup_vs_none"]
    yield (f"{r['spec']} k={r['spec_tokens']} fixed, {where}: acceptance length vs the length this run's "
           "step costs need for 1x", "tokens/verify", length, needed, r["speedup_vs_none"], "", None)


def _adaptive_vs_best_fixed(rows: list[dict]) -> Iterator[Row]:
    """Each adaptive row against the best fixed draft length of the same drafter, kind and
    concurrency in the same run (when the run has fixed lengths)."""
    for r in rows:
        versus = versus_best_fixed(r, rows) if r.get("verify_budget") == "adaptive" else None
        if versus is None:
            continue
        best, ratio = versus
        yield (f"{r['spec']} adaptive vs best fixed (k={best['spec_tokens']}), {r['kind']} c={r['concurrency']}",
               "tok/s", r["tokens_per_s"], best["tokens_per_s"], ratio, ">= 0.95", ratio >= 0.95)


def _spec_peer(d: dict) -> Iterator[Row]:
    """Ours vs transformers at batch 1: tok/s per setting, and each engine's speculation speedup."""
    for c in d["comparisons"]:
        where = f"{c['kind']}, batch 1"
        if c["compare"] == "none":
            yield (f"no speculation vs transformers, {where}", "tok/s", c["ours_tokens_per_s"],
                   c["transformers_tokens_per_s"], c["ratio"], "", None)
            continue
        label = ("best speculative setting" if c["compare"] == "best" else f"n-gram vs prompt lookup, {c['compare']}")
        yield (f"{label} ({c['ours_setting']} vs {c['transformers_setting']}), {where}", "tok/s",
               c["ours_tokens_per_s"], c["transformers_tokens_per_s"], c["ratio"], "", None)
        yield (f"speedup over own no-speculation, {c['ours_setting']} vs {c['transformers_setting']}, {where}", "x",
               c["ours_speedup"], c["transformers_speedup"], c["ours_speedup"] / c["transformers_speedup"], "", None)
    rows = d["rows"]
    for kind in sorted({r["kind"] for r in rows}):
        agreement = next(r["outputs_equal_across_engines"] for r in rows if r["kind"] == kind)
        yield (f"greedy outputs equal to transformers', {kind} prompts", "fraction", agreement, None, None, "", None)


def _transfer(d: dict) -> Iterator[Row]:
    g = d["gib_per_s"]
    for name, base in (("write_back", "memcpy_to_shm"), ("fetch", "memcpy_from_shm")):
        ratio = d["ratios"][f"{name}_vs_memcpy"]
        yield (f"page {name.replace('_', '-')} vs memcpy (CPU, shm)", "GiB/s", g[name], g[base], ratio, ">= 0.70",
               ratio >= 0.7)


def _residency(d: dict) -> Iterator[Row]:
    t = d["targets"]
    for conc, ratio in t["adaptive_vs_full_at_low_load"].items():
        yield (f"adaptive vs always-full at concurrency {conc}", "tok/s", None, None, ratio, ">= 0.97x", ratio >= 0.97)
    ratio = t["adaptive_vs_sparse_at_high_load"]
    yield ("adaptive vs always-sparse at the highest concurrency", "tok/s", None, None, ratio, ">= 1x", ratio >= 1)
    yield ("always-full admission wall (most running at once)", "requests", t["full_admission_wall"], None, None,
           "visible", t["full_admission_wall"] < max(d["settings"]["concurrency"]))


def _serve(d: dict) -> Iterator[Row]:
    ratio = d["gateway_overhead_ratio"]
    yield ("full stack vs in-process engine, concurrency 8", "tok/s", d["stack"].get("output_tokens_per_s"),
           d["in_process"]["output_tokens_per_s"], ratio, ">= 0.95x", ratio >= 0.95)


def _selection_trace(d: dict) -> Iterator[Row]:
    plain, spec = d["runs"]
    check = plain["replay_check"]
    yield ("residency replay reproduces the engine's hits and misses", "pages", check["hits"], plain["engine_hits"],
           None, "equal", check["equal"])
    yield (f"working-set union factor, {spec['spec']} block of {spec['spec_tokens']}", "x", spec["union_factor"], None,
           None, "", None)
    yield (f"mean acceptance length, {spec['spec']} (trace for the projection)", "tokens/step",
           spec["mean_acceptance_length"], None, None, "", None)
    for point in plain["hit_rate_curve"]:
        yield (f"steady-state hit rate, buffer {point['buffer_over_working_set']:.2f}x the working set", "",
               point["hit_rate"], None, None, "", None)


def _h200_projection(d: dict) -> Iterator[Row]:
    fed = "trace-fed" if d["trace"]["source"] else "ASSUMED inputs"
    for model in d["shapes"]:
        for spec in ("off", "on"):
            rows = {r["mode"]: r for r in d["rows"] if r["model"] == model and r["speculation"] == spec}
            dense = rows["dense-resident"]["tokens_per_s"]
            for mode in ("always-sparse", "adaptive"):
                ours = rows[mode]["tokens_per_s"]
                yield (f"PROJECTED H200 {model}, spec {spec}: {mode} vs dense-resident ({fed})", "tok/s", ours, dense,
                       ours / dense if dense else None, "", None)


def _gpu_kernels(d: dict) -> Iterator[Row]:
    for r in d["attention"]:
        yield (f"H200 sparse vs SDPA dense decode attention, {r['context_tokens']} tokens x {r['batch']}", "ms",
               r["sparse_ms"], r["sdpa_dense_ms"], r["sparse_vs_sdpa_speedup"], "", None)
    t = d.get("transfer") or {}
    for name in ("write_back", "fetch"):
        if f"{name}_vs_memcpy" in t:
            ratio = t[f"{name}_vs_memcpy"]
            yield (f"H200 page {name.replace('_', '-')} vs memcpy (registered shm)", "GiB/s", t[f"{name}_gib_per_s"],
                   None, ratio, ">= 0.70", ratio >= 0.7)


def _gpu_decode(d: dict) -> Iterator[Row]:
    """End-to-end decode on the GPU (``benchmarks/gpu_decode.py``): random weights, real shapes."""
    for r in d["runs"]:
        name = f"GPU end-to-end decode, {r['shape']} shape (random weights) {r['dtype']}"
        ours, peer = r["ours"], r["transformers"]
        if peer:
            yield (f"{name}, batch 1 vs transformers", "tok/s", ours["batch1_prompt128_tokens_per_s"],
                   peer["batch1_prompt128_tokens_per_s"], r["ratios"]["batch1_vs_transformers"], "", None)
        yield (f"{name}, batch 1 vs the HBM bandwidth bound", "tok/s", ours["batch1_prompt128_tokens_per_s"],
               r["bandwidth_bound_tokens_per_s"], r["ratios"]["batch1_fraction_of_bandwidth_bound"], "", None)
        for key, value in ours.items():
            if key.startswith("concurrent"):
                count = key.removeprefix("concurrent").split("_")[0]
                yield (f"{name}, {count} concurrent (aggregate) vs our batch 1", "tok/s", value,
                       ours["batch1_prompt128_tokens_per_s"], value / ours["batch1_prompt128_tokens_per_s"], "", None)
    agreement = d.get("agreement")
    if agreement:
        yield ("GPU vs CPU greedy tokens, 135M shape fp32", "tokens", agreement["equal_tokens"], agreement["tokens"],
               agreement["equal_tokens"] / agreement["tokens"], "", None)


SOURCES: dict[str, tuple[str, Callable[[dict], Iterator[Row]]]] = {
    "decode": ("decode.json", _decode),
    "context_sweep": ("context_sweep.json", _context_sweep),
    "sparse_quality": ("sparse_quality.json", _sparse_quality),
    "spec": ("spec.json", spec_rows),
    "verify budget": ("verify_budget/spec.json", spec_rows),
    "verify budget, drafter cost priced": ("spec_budget_calibrated.json", spec_rows),
    "adaptive budget, lazy drafter observation": ("spec_adaptive_lazy_observe.json", spec_rows),
    "adaptive budget, pooled acceptance, vs fixed lengths": ("spec_pooled_acceptance.json", spec_rows),
    "adaptive budget, pooled acceptance, median of 3": ("spec_adaptive_repeats.json", spec_rows),
    "retrained drafters, 6 engines interleaved": ("spec_retrained_interleaved.json", spec_rows),
    "calibrated confidences, 4 prompts per kind": ("spec_calibrated.json", spec_rows),
    "short learned drafts (k=1, 2) and the budget that finds them": ("spec_short_drafts.json", spec_rows),
    "speculation vs transformers": ("spec_peer.json", _spec_peer),
    "drafters": ("spec_drafters.json", spec_rows),
    "drafters, long documents": ("spec_drafters_longdoc.json", spec_rows),
    "transfer": ("transfer.json", _transfer),
    "residency": ("residency.json", _residency),
    "serve": ("serve-short_chat.json", _serve),
    "selection trace": ("selection_trace.json", _selection_trace),
    "h200 projection": ("h200_projection.json", _h200_projection),
}


def _cell(value) -> str:
    if value is None:
        return ""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def build(results: Path, gpu: Path | None = None) -> str:
    """The report's markdown for ``results`` (and GPU JSONs in ``gpu``, if given)."""
    sources = [(name, results / file, fn) for name, (file, fn) in SOURCES.items()]
    if gpu is not None:
        sources.append(("gpu kernels", gpu / "gpu_kernels.json", _gpu_kernels))
        sources.append(("gpu decode", gpu / "gpu_decode.json", _gpu_decode))
    return render(f"# Benchmark report: `{results}`", sources)


def render(title: str, sources: list[tuple[str, Path, Callable[[dict], Iterator[Row]]]]) -> str:
    """One table of every source's rows: ``(name, JSON path, rows of its JSON)``; a missing JSON
    is listed as not run."""
    lines = [title, "",
             "| benchmark | figure | unit | ours | baseline (same run) | ratio | target | pass |",
             "|---|---|---|---|---|---|---|---|"]
    for name, path, fn in sources:
        if not path.is_file():
            lines.append(f"| {name} | not run (no `{path.name}`) | | | | | | |")
            continue
        for figure, unit, ours, base, ratio, target, ok in fn(json.loads(path.read_text())):
            verdict = "" if ok is None else ("PASS" if ok else "FAIL")
            lines.append(f"| {name} | {figure} | {unit} | {_cell(ours)} | {_cell(base)} | {_cell(ratio)} | "
                         f"{target} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="results folder (default: today's for this machine)")
    parser.add_argument("--gpu-dir", type=Path, default=None, help="a folder with gpu_kernels.json / gpu_decode.json from an H200 run")
    args = parser.parse_args(argv)
    results = args.dir or results_dir()
    text = build(results, args.gpu_dir)
    (results / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
