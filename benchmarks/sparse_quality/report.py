"""Summary against the targets, the printed report and the plot."""

from __future__ import annotations

from pathlib import Path

from benchmarks.plotting import pyplot
from benchmarks.sparse_quality.driver import Settings
from benchmarks.sparse_quality.tasks import (
    PASSKEY_TARGET_BUDGETS,
    PPL_TARGET_BUDGET,
    PPL_TARGET_CONTEXT,
    PPL_TARGET_MAX_INCREASE,
    agreement,
    budget_label,
)


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



def plot(result: dict, path: Path) -> None:
    plt = pyplot()
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
