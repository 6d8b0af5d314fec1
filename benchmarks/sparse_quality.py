"""Quality of sparse (Quest-style top-k page) attention against dense attention, on real weights.

Three measurements, dense vs sparse at several top-k budgets (sink and recent pages fixed):

1. **Perplexity under teacher-forced decode.** Sparse attention applies to decode tokens only
   (prefill is dense), so perplexity must be measured the way sparse decoding sees the context:
   one token per step. For each document window of ``n`` tokens we add a request whose prompt is
   ``doc[: n - S - 1]`` (prefilled densely, in chunks) with ``max_tokens = S + 1``. After every
   ``Engine.step`` the token the engine sampled is overwritten with the true next document token
   (``request.output_ids[-1] = doc[...]``), so the next decode step feeds the real text. The
   logits are captured by wrapping ``engine.model.forward`` (as ``tests/decoder/test_sparse_engine.py``
   does) and the rows are mapped to requests by wrapping ``engine.runner.build_inputs`` (which
   returns the batch in logit-row order). A logit row is scored only when its input position is
   at or beyond the prompt end, i.e. when it came from a decode step: exactly the last ``S``
   tokens of the window are scored, each predicted by a one-token (sparse) decode step. This
   drives the ordinary engine (scheduler, page tables, digests, page-list sparse path, batching
   of several documents) unchanged; nothing in ``services/`` is patched beyond instance wrappers.
2. **Greedy agreement.** 256 greedy tokens (fewer with ``--quick``) from the same prompt, dense vs
   sparse: the length of the common prefix and the position-wise agreement.
3. **Passkey retrieval** at several context lengths and depths: repeated filler sentences with
   "The pass key is NNNNN. Remember it." inserted at a depth, then the question, in the chat
   template. Greedy 12 tokens; correct when the key's digits appear in the answer.

Documents: large modules of the CPython standard library shipped with this interpreter (a fixed,
sorted list of file names; the files actually used are recorded in the JSON), each file's first
``window`` tokens, nothing stripped.

Writes ``results/<date>-<machine>/sparse_quality.json`` and ``sparse_quality.png``.

Run: ``python -m benchmarks.sparse_quality [--quick]`` (``--quick``: tiny settings, < 60 s).
"""

from __future__ import annotations

import argparse
import math
import re
import sysconfig
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks.machine import machine_info, results_dir, write_json

# Fixed document list (large, stable stdlib modules). Missing files are skipped and the used list recorded.
STDLIB_DOCUMENTS = (
    "argparse.py",
    "difflib.py",
    "doctest.py",
    "inspect.py",
    "pydoc.py",
    "subprocess.py",
    "tarfile.py",
    "typing.py",
)

FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
PASSKEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = "What is the pass key?"
PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n\n"
)

PPL_TARGET_BUDGET = 2048
PPL_TARGET_CONTEXT = 8192
PPL_TARGET_MAX_INCREASE = 0.02
PASSKEY_TARGET_BUDGETS = (1024, 2048)


# ---------------------------------------------------------------------------------------------
# pure helpers (unit-tested)
# ---------------------------------------------------------------------------------------------
def nll_sum(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Sum of ``-log softmax(logits)[target]`` over rows. ``logits: [n, vocab]``, ``targets: [n]``."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return float(-logp.gather(1, targets.view(-1, 1).long()).sum())


def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """``exp(mean NLL)`` of ``targets`` under ``logits``."""
    return math.exp(nll_sum(logits, targets) / max(int(targets.numel()), 1))


def agreement(reference: list[int], other: list[int]) -> dict:
    """Common-prefix length and position-wise agreement of two token sequences (over the
    reference's length)."""
    n = len(reference)
    prefix = 0
    while prefix < min(n, len(other)) and reference[prefix] == other[prefix]:
        prefix += 1
    same = sum(1 for a, b in zip(reference, other) if a == b)
    return {"tokens": n, "prefix_match": prefix, "positionwise": same / n if n else 1.0}


def passkey_text(num_filler: int, depth: float, key: str) -> str:
    """The user message: intro, ``num_filler`` filler blocks with the key sentence inserted after
    ``round(depth * num_filler)`` of them, then the question."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError("depth must be in [0, 1]")
    at = round(depth * num_filler)
    body = FILLER * at + PASSKEY_SENTENCE.format(key=key) + FILLER * (num_filler - at)
    return PASSKEY_INTRO + body + "\n" + PASSKEY_QUESTION


def passkey_depth(text: str, key: str) -> float:
    """Where the key sentence sits in the filler, as a fraction of filler blocks before it."""
    body = text[len(PASSKEY_INTRO):]
    before, _, after = body.partition(PASSKEY_SENTENCE.format(key=key))
    n_before, n_after = before.count(FILLER), after.count(FILLER)
    return n_before / max(n_before + n_after, 1)


def passkey_correct(answer: str, key: str) -> bool:
    """True when the key's digits appear in ``answer`` (spaces/commas between digits tolerated)."""
    return key in re.sub(r"[\s,]", "", answer)


def make_key(index: int) -> str:
    """Deterministic 5-digit keys."""
    return str(10000 + (index * 7919 + 4271) % 90000)


def budget_label(budget: int | None) -> str:
    return "dense" if budget is None else f"sparse{budget}"


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
def stdlib_documents(tokenizer, window: int, count: int) -> list[tuple[str, list[int]]]:
    """The first ``window`` tokens of up to ``count`` files of ``STDLIB_DOCUMENTS`` that are long enough."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for name in sorted(STDLIB_DOCUMENTS):
        path = root / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        # a prefix of the file is enough (code is >2 chars/token); fall back to the whole file
        ids = tokenizer.encode(text[: window * 8], add_special_tokens=False)
        if len(ids) < window:
            ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= window:
            docs.append((name, ids[:window]))
        if len(docs) == count:
            break
    return docs


def passkey_prompt(tokenizer, context: int, depth: float, key: str, reserve: int = 16) -> list[int]:
    """Chat-templated passkey prompt of at most ``context - reserve`` tokens (as many filler blocks as fit)."""
    limit = context - reserve

    def encode(n: int) -> list[int]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": passkey_text(n, depth, key)}])
        return tokenizer.encode(text, add_special_tokens=False)

    base = len(encode(0))
    per_block = max((len(encode(8)) - base) / 8, 1.0)
    n = max(int((limit - base) / per_block), 0)
    ids = encode(n)
    while len(ids) > limit and n > 0:
        n -= max(1, int((len(ids) - limit) / per_block))
        n = max(n, 0)
        ids = encode(n)
    while True:  # grow back to the tightest fit
        bigger = encode(n + 1)
        if len(bigger) > limit:
            break
        n, ids = n + 1, bigger
    return ids


# ---------------------------------------------------------------------------------------------
# engine drivers
# ---------------------------------------------------------------------------------------------
@dataclass
class Settings:
    budgets: list[int] = field(default_factory=lambda: [512, 1024, 2048])
    sink_pages: int = 1
    recent_pages: int = 4
    ppl_windows: list[int] = field(default_factory=lambda: [4096, 8192])
    ppl_documents: int = 4
    ppl_scored_tokens: int = 256
    greedy_window: int = 8192
    greedy_documents: int = 2
    greedy_tokens: int = 256
    passkey_contexts: list[int] = field(default_factory=lambda: [2048, 4096, 8192])
    passkey_depths: list[float] = field(default_factory=lambda: [0.1, 0.5, 0.9])
    passkey_tokens: int = 12
    max_num_batched_tokens: int = 2048
    threads: int = torch.get_num_threads()


QUICK = dict(
    budgets=[128, 256],
    ppl_windows=[1024],
    ppl_documents=1,
    ppl_scored_tokens=24,
    greedy_window=1024,
    greedy_documents=1,
    greedy_tokens=16,
    passkey_contexts=[1024],
    passkey_depths=[0.5],
    passkey_tokens=8,
    max_num_batched_tokens=1024,
)


def make_llm(loaded, settings: Settings, budget: int | None, max_tokens_in_flight: int):
    from dhisparse import LLM

    page = 16
    kv_tokens = max(16384, -(-(max_tokens_in_flight + 2 * page) // page) * page, 8192 + page)
    kwargs = dict(loaded=loaded, max_num_batched_tokens=settings.max_num_batched_tokens, kv_cache_tokens=kv_tokens)
    if budget is not None:
        kwargs.update(attention="sparse", top_k_tokens=budget, sink_pages=settings.sink_pages,
                      recent_pages=settings.recent_pages)
    return LLM(**kwargs)


def reset_counters(llm) -> None:
    attention = llm.engine.runner.attention
    attention.num_selected_pages = 0
    attention.num_context_pages = 0


def selection_ratio(llm) -> float | None:
    attention = llm.engine.runner.attention
    if attention.num_context_pages == 0:
        return None
    return attention.num_selected_pages / attention.num_context_pages


def teacher_forced_nll(llm, docs: list[list[int]], scored: int) -> list[dict]:
    """Scores the last ``scored`` tokens of every document, each predicted by a one-token decode
    step over the true preceding text. Returns per document ``{"nll": sum, "tokens": n, "argmax_hits": k}``."""
    from dhisparse import SamplingParams

    engine = llm.engine
    model_forward = engine.model.forward
    build_inputs = engine.runner.build_inputs
    step_rows: list[tuple[object, int]] = []  # (request, input position) per logit row, this step
    step_logits: list[torch.Tensor] = []

    def recording_build_inputs(batch):
        input_ids, meta, ordered = build_inputs(batch)
        step_rows.clear()
        for sched in ordered:
            if sched.samples:
                step_rows.append((sched.request, sched.request.num_computed_tokens + sched.num_new_tokens - 1))
        return input_ids, meta, ordered

    def recording_forward(*args, **kwargs):
        logits = model_forward(*args, **kwargs)
        step_logits.clear()
        step_logits.append(logits)
        return logits

    engine.runner.build_inputs = recording_build_inputs
    engine.model.forward = recording_forward
    try:
        by_id = {}
        for i, doc in enumerate(docs):
            prompt = doc[: len(doc) - scored - 1]
            rid = engine.add_request(prompt, SamplingParams(max_tokens=scored + 1, ignore_eos=True), f"ppl-{i}")
            by_id[rid] = {"doc": doc, "prompt_len": len(prompt), "nll": 0.0, "tokens": 0, "argmax_hits": 0}
        while engine.has_unfinished():
            step_rows.clear()
            step_logits.clear()
            engine.step()
            if not step_rows:
                continue
            logits = step_logits[0]
            for row, (request, pos) in enumerate(step_rows):
                rec = by_id[request.request_id]
                doc = rec["doc"]
                target = doc[pos + 1]
                if pos >= rec["prompt_len"]:
                    lp = torch.log_softmax(logits[row].double(), dim=-1)
                    rec["nll"] += float(-lp[target])
                    rec["tokens"] += 1
                    rec["argmax_hits"] += int(int(torch.argmax(logits[row])) == target)
                if request.output_ids:
                    request.output_ids[-1] = target  # teacher forcing: feed the true token next
        for rid in by_id:
            if engine.pop_finished(rid).stats.num_preemptions:
                raise RuntimeError("a request was preempted (recomputed densely): raise kv_cache_tokens")
    finally:
        engine.runner.build_inputs = build_inputs
        engine.model.forward = model_forward
    return [{k: v for k, v in rec.items() if k not in ("doc",)} for rec in by_id.values()]


def summarize(settings: Settings, ppl: dict, greedy: dict, passkey: dict) -> tuple[dict, dict]:
    """Summary (relative perplexity, greedy agreement, passkey accuracy) and the targets with pass/fail,
    from the per-configuration figures keyed by ``budget_label``."""
    summary: dict = {"perplexity_increase": {}, "greedy_agreement": {}, "passkey_accuracy": {}}
    dense_pk = passkey["dense"]
    for budget in settings.budgets:
        label = budget_label(budget)
        summary["perplexity_increase"][label] = {
            w: ppl[label][w]["perplexity"] / ppl["dense"][w]["perplexity"] - 1.0 for w in ppl["dense"]
        }
        per_doc = [agreement(d, s) for d, s in zip(greedy["dense"], greedy[label])]
        summary["greedy_agreement"][label] = {
            "per_document": per_doc,
            "mean_prefix_match": sum(a["prefix_match"] for a in per_doc) / max(len(per_doc), 1),
            "mean_positionwise": sum(a["positionwise"] for a in per_doc) / max(len(per_doc), 1),
        }
    for label in ["dense"] + [budget_label(b) for b in settings.budgets]:
        cases = passkey[label]
        by_ctx = {}
        for ctx in settings.passkey_contexts:
            sub = [c for c in cases if c["context"] == ctx]
            by_ctx[str(ctx)] = sum(c["correct"] for c in sub) / len(sub)
        summary["passkey_accuracy"][label] = {
            "overall": sum(c["correct"] for c in cases) / len(cases),
            "by_context": by_ctx,
            "matches_dense_where_dense_correct": all(
                s["correct"] for d, s in zip(dense_pk, cases) if d["correct"]
            ),
        }

    targets = {}
    ppl_key = budget_label(PPL_TARGET_BUDGET)
    if ppl_key in summary["perplexity_increase"] and str(PPL_TARGET_CONTEXT) in ppl["dense"]:
        inc = summary["perplexity_increase"][ppl_key][str(PPL_TARGET_CONTEXT)]
        targets["ppl_increase_at_2048_on_8k"] = {"value": inc, "limit": PPL_TARGET_MAX_INCREASE,
                                                 "pass": inc <= PPL_TARGET_MAX_INCREASE}
    else:
        targets["ppl_increase_at_2048_on_8k"] = {"value": None, "pass": None, "note": "not measured in these settings"}
    for b in PASSKEY_TARGET_BUDGETS:
        key = budget_label(b)
        name = f"passkey_{b}_matches_dense"
        if key in summary["passkey_accuracy"]:
            targets[name] = {"pass": summary["passkey_accuracy"][key]["matches_dense_where_dense_correct"],
                             "dense_correct_cases": sum(c["correct"] for c in dense_pk), "cases": len(dense_pk),
                             "vacuous": not any(c["correct"] for c in dense_pk)}
        else:
            targets[name] = {"pass": None, "note": "budget not measured in these settings"}

    return summary, targets


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
    for budget in configs:
        label = budget_label(budget)
        t0 = time.perf_counter()
        llm = make_llm(loaded, settings, budget, in_flight)  # one engine per configuration, reused by phase
        selection[label] = {}
        # perplexity, per window (all documents of a window batched together)
        ppl[label] = {}
        for window, docs in ppl_docs.items():
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
        # greedy
        reset_counters(llm)
        outs = llm.generate(greedy_prompts, SamplingParams(max_tokens=settings.greedy_tokens, ignore_eos=True))
        greedy[label] = [o.token_ids for o in outs]
        selection[label]["greedy"] = selection_ratio(llm)
        # passkey
        reset_counters(llm)
        outs = llm.generate([c["prompt"] for c in passkey_cases],
                            SamplingParams(max_tokens=settings.passkey_tokens, ignore_eos=True))
        passkey[label] = [
            {"context": c["context"], "prompt_tokens": len(c["prompt"]), "depth": c["depth"], "key": c["key"],
             "answer": o.text, "correct": passkey_correct(o.text, c["key"])}
            for c, o in zip(passkey_cases, outs)
        ]
        selection[label]["passkey"] = selection_ratio(llm)
        del llm
        timings[label] = time.perf_counter() - t0
        print(f"[{label}] done in {timings[label]:.1f}s", flush=True)

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
    _plot(result, out_dir / "sparse_quality.png")
    return result


def _plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install -e '.[bench]'): skipping the plot")
        return
    budgets = result["settings"]["budgets"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for window in result["settings"]["ppl_windows"]:
        ys = [100 * result["summary"]["perplexity_increase"][budget_label(b)][str(window)] for b in budgets]
        ax1.plot(budgets, ys, marker="o", label=f"{window}-token context")
    ax1.axhline(100 * PPL_TARGET_MAX_INCREASE, color="gray", linestyle="--", label="target (2%)")
    ax1.axhline(0, color="black", linewidth=0.5)
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(budgets, [str(b) for b in budgets])
    ax1.set_xlabel("top-k budget (tokens)")
    ax1.set_ylabel("perplexity increase vs dense (%)")
    ax1.set_title("Teacher-forced decode perplexity")
    ax1.legend()
    labels = ["dense"] + [budget_label(b) for b in budgets]
    contexts = result["settings"]["passkey_contexts"]
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        acc = result["summary"]["passkey_accuracy"][label]["by_context"]
        ax2.bar([j + i * width for j in range(len(contexts))], [acc[str(c)] for c in contexts], width=width, label=label)
    ax2.set_xticks([j + 0.4 - width / 2 for j in range(len(contexts))], [str(c) for c in contexts])
    ax2.set_xlabel("context (tokens)")
    ax2.set_ylabel("passkey accuracy")
    ax2.set_ylim(0, 1.05)
    ax2.set_title("Passkey retrieval")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_report(result: dict) -> None:
    s = result["settings"]
    print(f"model {result['model']}  threads {s['threads']}  total {result['timings_s']['total']:.1f}s")
    print("perplexity (teacher-forced decode over the last "
          f"{s['ppl_scored_tokens']} tokens of {s['ppl_documents']} documents)")
    header = f"{'config':>12s}" + "".join(f"{'ppl@' + str(w):>12s}{'incr':>8s}" for w in s["ppl_windows"])
    print(header)
    for label, per_window in result["perplexity"].items():
        row = f"{label:>12s}"
        for w in s["ppl_windows"]:
            p = per_window[str(w)]["perplexity"]
            inc = result["summary"]["perplexity_increase"].get(label, {}).get(str(w), 0.0)
            row += f"{p:12.4f}{100 * inc:7.2f}%"
        print(row)
    print(f"greedy agreement vs dense ({s['greedy_tokens']} tokens, {s['greedy_documents']} documents)")
    for label, g in result["summary"]["greedy_agreement"].items():
        print(f"{label:>12s}  prefix {g['mean_prefix_match']:.1f}  positionwise {100 * g['mean_positionwise']:.1f}%")
    print("passkey accuracy")
    for label, a in result["summary"]["passkey_accuracy"].items():
        by = "  ".join(f"{c}:{v:.2f}" for c, v in a["by_context"].items())
        print(f"{label:>12s}  overall {a['overall']:.2f}  {by}  matches dense where dense correct: "
              f"{a['matches_dense_where_dense_correct']}")
    print("targets")
    for name, t in result["targets"].items():
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        print(f"  {name:32s} {verdict}  {({k: v for k, v in t.items() if k != 'pass'})}")


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
    parser.add_argument("--out", default=None, help="output folder (default results/<date>-<machine>/)")
    args = parser.parse_args([a for a in (argv or []) if a != "--"] if argv is not None else None)
    settings = Settings(**(QUICK if args.quick else {}))
    for name in ("budgets", "ppl_windows", "ppl_documents", "ppl_scored_tokens", "greedy_window", "greedy_documents",
                 "greedy_tokens", "passkey_contexts", "passkey_depths", "threads"):
        value = getattr(args, name)
        if value is not None:
            setattr(settings, name, value)
    result = run(settings, args.quick, args.out, args.model)
    print_report(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
