"""One full run: every budget over every task; JSON + PNG."""

from __future__ import annotations

import argparse
import math
import sysconfig
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.progress import echo, progress
from benchmarks.sparse_quality.driver import (
    QUICK,
    Settings,
    make_llm,
    reset_counters,
    selection_ratio,
    teacher_forced_nll,
)
from benchmarks.sparse_quality.report import plot, print_report, summarize
from benchmarks.sparse_quality.tasks import (
    budget_label,
    make_key,
    passkey_correct,
    passkey_prompt,
    stdlib_documents,
)


def run(settings: Settings, quick: bool, out_dir: Path | None = None, model: str | None = None) -> dict:
    from dhisparse import SamplingParams
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    torch.set_num_threads(settings.threads)
    t_start = time.perf_counter()
    model_path = resolve_model_path(model)
    loaded = load_model(model_path)
    tok = loaded.tokenizer
    configs: list[int | None] = [None] + list(settings.budgets)
    timings: dict[str, float] = {}

    # ---- inputs --------------------------------------------------------------------------
    ppl_docs = {w: stdlib_documents(tok, w, settings.ppl_documents) for w in settings.ppl_windows}
    greedy_docs = stdlib_documents(tok, settings.greedy_window, settings.greedy_documents)
    greedy_prompts = [ids[: settings.greedy_window - settings.greedy_tokens] for _, ids in greedy_docs]
    passkey_cases = []
    for ci, ctx in enumerate(settings.passkey_contexts):
        for di, depth in enumerate(settings.passkey_depths):
            key = make_key(ci * len(settings.passkey_depths) + di)
            passkey_cases.append({"context": ctx, "depth": depth, "key": key,
                                  "prompt": passkey_prompt(tok, ctx, depth, key, reserve=settings.passkey_tokens + 4)})

    ppl: dict[str, dict] = {}
    greedy: dict[str, list[list[int]]] = {}
    passkey: dict[str, list[dict]] = {}
    selection: dict[str, dict] = {}
    in_flight = max([w * len(d) for w, d in ppl_docs.items()]
                    + [settings.greedy_window * max(len(greedy_prompts), 1)]
                    + [sum(len(c["prompt"]) + settings.passkey_tokens + 16 for c in passkey_cases)])
    bar = progress(desc="sparse_quality", total=len(configs) * (len(ppl_docs) + 2), unit="phase")
    for budget in configs:
        label = budget_label(budget)
        t0 = time.perf_counter()
        llm = make_llm(loaded, settings, budget, in_flight)  # one engine per configuration, reused by phase
        selection[label] = {}
        # perplexity, per window (all documents of a window batched together)
        ppl[label] = {}
        for window, docs in ppl_docs.items():
            bar.set_postfix_str(f"{label} perplexity {window}")
            reset_counters(llm)
            recs = teacher_forced_nll(llm, [ids for _, ids in docs], settings.ppl_scored_tokens)
            total_nll = sum(r["nll"] for r in recs)
            total = sum(r["tokens"] for r in recs)
            ppl[label][str(window)] = {
                "perplexity": math.exp(total_nll / total),
                "argmax_accuracy": sum(r["argmax_hits"] for r in recs) / total,
                "scored_tokens": total,
                "per_document": [
                    {"document": name, "perplexity": math.exp(r["nll"] / r["tokens"]), "scored_tokens": r["tokens"]}
                    for (name, _), r in zip(docs, recs)
                ],
            }
            selection[label][f"perplexity_{window}"] = selection_ratio(llm)
            bar.update()
        # greedy
        bar.set_postfix_str(f"{label} greedy")
        reset_counters(llm)
        outs = llm.generate(greedy_prompts, SamplingParams(max_tokens=settings.greedy_tokens, ignore_eos=True))
        greedy[label] = [o.token_ids for o in outs]
        selection[label]["greedy"] = selection_ratio(llm)
        bar.update()
        # passkey
        bar.set_postfix_str(f"{label} passkey")
        reset_counters(llm)
        outs = llm.generate([c["prompt"] for c in passkey_cases],
                            SamplingParams(max_tokens=settings.passkey_tokens, ignore_eos=True))
        passkey[label] = [
            {"context": c["context"], "prompt_tokens": len(c["prompt"]), "depth": c["depth"], "key": c["key"],
             "answer": o.text, "correct": passkey_correct(o.text, c["key"])}
            for c, o in zip(passkey_cases, outs)
        ]
        selection[label]["passkey"] = selection_ratio(llm)
        bar.update()
        del llm
        timings[label] = time.perf_counter() - t0
        echo(f"[{label}] done in {timings[label]:.1f}s")
    bar.close()

    summary, targets = summarize(settings, ppl, greedy, passkey)
    result = {
        "benchmark": "sparse_quality",
        "machine": machine_info(),
        "model": str(model_path),
        "quick": quick,
        "settings": asdict(settings),
        "documents": {
            "stdlib": sysconfig.get_paths()["stdlib"],
            "perplexity": {str(w): [n for n, _ in d] for w, d in ppl_docs.items()},
            "greedy": [n for n, _ in greedy_docs],
        },
        "perplexity": ppl,
        "greedy_tokens": greedy,
        "passkey": passkey,
        "selected_page_fraction": selection,
        "summary": summary,
        "targets": targets,
        "timings_s": {**timings, "total": time.perf_counter() - t_start},
    }
    out_dir = Path(out_dir) if out_dir else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "sparse_quality.json", result)
    plot(result, out_dir / "sparse_quality.png")
    return result



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sparse_quality", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings (< 60 s), for the test and smoke runs")
    parser.add_argument("--model", default=None)
    parser.add_argument("--budgets", type=int, nargs="+", default=None)
    parser.add_argument("--ppl-windows", type=int, nargs="+", default=None)
    parser.add_argument("--ppl-documents", type=int, default=None)
    parser.add_argument("--ppl-scored-tokens", type=int, default=None)
    parser.add_argument("--greedy-window", type=int, default=None)
    parser.add_argument("--greedy-documents", type=int, default=None)
    parser.add_argument("--greedy-tokens", type=int, default=None)
    parser.add_argument("--passkey-contexts", type=int, nargs="+", default=None)
    parser.add_argument("--passkey-depths", type=float, nargs="+", default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--page-score", choices=["center", "quest"], default=None)
    parser.add_argument("--out", default=None, help="output folder (default results/<date>-<machine>/)")
    args = parser.parse_args([a for a in (argv or []) if a != "--"] if argv is not None else None)
    settings = Settings(**(QUICK if args.quick else {}))
    for name in ("budgets", "ppl_windows", "ppl_documents", "ppl_scored_tokens", "greedy_window", "greedy_documents",
                 "greedy_tokens", "passkey_contexts", "passkey_depths", "threads", "page_score"):
        value = getattr(args, name)
        if value is not None:
            setattr(settings, name, value)
    result = run(settings, args.quick, args.out, args.model)
    print_report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
