"""Speculative decoding side by side with transformers, one run: our n-gram drafter vs
transformers' prompt-lookup assisted decoding.

transformers' assisted generation takes one sequence at a time, so both engines decode the same
prompts one after another (batch 1), greedy, up to ``--max-tokens`` new tokens (stopping at the
model's eos ids), from the same GGUF in fp32, end to end (prefill included). For each prompt kind
(``benchmarks.spec``'s held-out ``code_edit`` and ``chat`` prompts), tok/s of:

- ours without speculation, with n-gram drafts of each ``--lookup-tokens`` length, and with the
  adaptive verify budget (longest length);
- transformers without speculation and with prompt lookup of each of those lengths;

each engine's speedup over itself without speculation, and ours vs transformers per setting.
Greedy speculation changes no token: checked per engine. The two engines' outputs are compared
too (token agreement, recorded rather than required: two fp32 implementations may part at a
near-tie). Writes ``spec_peer.json`` / ``spec_peer.png``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.peers.transformers_hf import greedy, load_transformers
from benchmarks.plotting import pyplot
from benchmarks.progress import echo
from benchmarks.spec import parse_settings, run_settings
from benchmarks.spec_prompts import build_prompts


def _strip_eos(ids: list[int], eos: tuple[int, ...]) -> list[int]:
    return ids[:-1] if ids and ids[-1] in eos else ids


def bench_transformers(hf, prompts: list[list[int]], max_tokens: int, eos: tuple[int, ...],
                       lookup_tokens: int | None, repeats: int) -> dict:
    """The prompts one after another through ``hf.generate``, ``repeats`` times; tok/s of the
    median run (new tokens over the wall time of all prompts; a stopping eos counts, as it does in
    our engine's outputs). ``outputs`` have the eos removed, for comparisons."""
    greedy(hf, prompts[0], 8, eos, lookup_tokens)  # warm-up
    rates, outputs = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        run = [greedy(hf, p, max_tokens, eos, lookup_tokens) for p in prompts]
        rates.append(sum(len(o) for o in run) / (time.perf_counter() - t0))
        if outputs is not None and run != outputs:
            raise RuntimeError(f"transformers lookup={lookup_tokens}: greedy outputs differ between repeats")
        outputs = run
    return {"tokens": sum(len(o) for o in outputs), "tokens_per_s": statistics.median(rates),
            "tokens_per_s_runs": rates, "outputs": [_strip_eos(o, eos) for o in outputs]}


def run(loaded, hf, kinds: list[str], lookup_tokens: list[int], num_prompts: int, max_tokens: int,
        repeats: int) -> list[dict]:
    """One row per (kind, engine, setting); ``speedup_vs_own_none`` and ``lossless`` refer to the
    same engine without speculation."""
    eos = tuple(loaded.config.eos_token_ids)
    ours_settings = parse_settings(",".join(["none"] + [f"ngram:{k}" for k in lookup_tokens]
                                            + [f"ngram:{max(lookup_tokens)}:adaptive"]))
    rows = []
    for kind in kinds:
        prompts = build_prompts(loaded.tokenizer, kind, num_prompts)
        kind_rows = []
        for (spec, k, budget), figures in run_settings(loaded, prompts, max_tokens, ours_settings, repeats=repeats,
                                                       batch_size=1):
            figures["outputs"] = [_strip_eos(o, eos) for o in figures["outputs"]]
            setting = "none" if spec == "none" else f"ngram:{k}" + (":adaptive" if budget == "adaptive" else "")
            kind_rows.append({"kind": kind, "engine": "ours", "setting": setting, "draft_tokens": k, **figures})
        for k in [None] + lookup_tokens:
            figures = bench_transformers(hf, prompts, max_tokens, eos, k, repeats)
            kind_rows.append({"kind": kind, "engine": "transformers", "setting": f"lookup:{k}" if k else "none",
                              "draft_tokens": k or 0, **figures})
        base = {r["engine"]: r for r in kind_rows if r["setting"] == "none"}
        agreement = sum(a == b for a, b in zip(base["ours"]["outputs"], base["transformers"]["outputs"])) / len(prompts)
        for r in kind_rows:
            r["speedup_vs_own_none"] = r["tokens_per_s"] / base[r["engine"]]["tokens_per_s"]
            r["lossless"] = r["outputs"] == base[r["engine"]]["outputs"]
            r["outputs_equal_across_engines"] = agreement
        for r in kind_rows:  # outputs dropped only once every row is compared
            echo(f"{kind:10s} {r['engine']:12s} {r['setting']:16s} {r['tokens_per_s']:7.1f} tok/s "
                 f"x{r['speedup_vs_own_none']:.2f} lossless={r['lossless']}")
            r.pop("outputs")
        rows.extend(kind_rows)
    return rows


def comparisons(rows: list[dict]) -> list[dict]:
    """Ours vs transformers per kind: no speculation, each draft length (n-gram vs prompt
    lookup), and each engine's best speculative setting."""
    out = []
    for kind in sorted({r["kind"] for r in rows}):
        ours = {r["setting"]: r for r in rows if r["kind"] == kind and r["engine"] == "ours"}
        theirs = {r["setting"]: r for r in rows if r["kind"] == kind and r["engine"] == "transformers"}
        pairs = [("none", ours["none"], theirs["none"])]
        pairs += [(f"k={r['draft_tokens']}", ours[f"ngram:{r['draft_tokens']}"], r)
                  for s, r in theirs.items() if s != "none"]
        best_ours = max((r for s, r in ours.items() if s != "none"), key=lambda r: r["tokens_per_s"])
        best_theirs = max((r for s, r in theirs.items() if s != "none"), key=lambda r: r["tokens_per_s"])
        pairs.append(("best", best_ours, best_theirs))
        for label, a, b in pairs:
            out.append({"kind": kind, "compare": label, "ours_setting": a["setting"], "transformers_setting": b["setting"],
                        "ours_tokens_per_s": a["tokens_per_s"], "transformers_tokens_per_s": b["tokens_per_s"],
                        "ratio": a["tokens_per_s"] / b["tokens_per_s"], "ours_speedup": a["speedup_vs_own_none"],
                        "transformers_speedup": b["speedup_vs_own_none"]})
    return out


def main(argv: list[str] | None = None) -> int:
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.spec_peer", description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default="code_edit,chat")
    parser.add_argument("--lookup-tokens", default="4,8", help="draft lengths, for both engines")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per kind, decoded one after another")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=2, help="runs per setting; median tok/s")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    model_path = resolve_model_path(None)
    loaded = load_model(model_path)
    hf = load_transformers(model_path, "float32")
    lookup = [int(k) for k in args.lookup_tokens.split(",")]
    rows = run(loaded, hf, args.kinds.split(","), lookup, args.prompts, args.max_tokens, args.repeats)
    result = {"benchmark": "spec_peer", "machine": machine_info(), "model": str(model_path),
              "settings": {"max_tokens": args.max_tokens, "dtype": "float32", "batch": 1, "prompts_per_kind": args.prompts,
                           "lookup_tokens": lookup, "repeats": args.repeats, "threads": torch.get_num_threads(),
                           "transformers_lookup": "generate(prompt_lookup_num_tokens=k), max_matching_ngram_size default"},
              "rows": rows, "comparisons": comparisons(rows),
              "targets": {"all_lossless": all(r["lossless"] for r in rows)}}
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "spec_peer.json", result)
    _plot(rows, out_dir / "spec_peer.png")
    for c in result["comparisons"]:
        print(f"{c['kind']:10s} {c['compare']:5s} ours {c['ours_tokens_per_s']:6.1f} ({c['ours_setting']}) vs "
              f"transformers {c['transformers_tokens_per_s']:6.1f} ({c['transformers_setting']}): {c['ratio']:.2f}x")
    return 0 if result["targets"]["all_lossless"] else 1


def _plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    kinds = sorted({r["kind"] for r in rows})
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        sel = [r for r in rows if r["kind"] == kind]
        labels = [f"{r['engine']}\n{r['setting']}" for r in sel]
        ax.bar(range(len(sel)), [r["tokens_per_s"] for r in sel],
               color=["tab:blue" if r["engine"] == "ours" else "tab:orange" for r in sel])
        ax.set_xticks(range(len(sel)), labels, fontsize=7, rotation=45, ha="right")
        ax.set_title(f"{kind}, batch 1")
        ax.set_ylabel("output tokens/s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
