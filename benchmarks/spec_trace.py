"""Per-step trace of speculative decoding: where a setting's time goes, and what the adaptive
budget predicted for each step against what the step then took.

For one prompt kind and concurrency, each setting (``none`` first, then e.g. ``dspark:1`` and
``dspark:7:adaptive``) gets its own engine; its ``--rounds`` x concurrency prompts (concurrency in
flight, the next starting as one finishes) are decoded ``--repeats`` times per engine, the engines
stepping by turns (``--schedule lockstep``, the default) or decoding by turns.
Every engine step records: decoding requests, batch tokens, drafted and committed tokens, the
target pass's measured seconds and the seconds the speculator priced that step at just before
(step table + attention per key row), the proposal's seconds (drafter call included) and the
rest of the step (scheduling, bookkeeping, feature hand-off).

Summary per setting: committed tokens per second of step time, the split of that time, the
step table's error (measured / predicted, per batch-token count), and, for a setting that
drafts, its realized gain per step over a non-drafting step with the same requests priced by
the same table. Writes ``results/<date>-<machine>/<name>.json`` (with ``--steps``, every step's
record too).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.progress import echo
from benchmarks.spec import SettingRun, parse_settings, repeat_runs
from benchmarks.spec_prompts import build_prompts
from benchmarks.spec_targets import speedup
from services.decoder.engine.scheduler import ScheduledRequest


class StepTrace:
    """Wraps one engine's ``step``, its runner's ``execute`` and its speculator's ``propose`` and
    appends one dict per engine step to ``steps``."""

    def __init__(self, engine):
        self.steps: list[dict] = []
        self._current: dict = {}
        runner, speculator = engine.runner, engine.speculator
        step, execute = engine.step, runner.execute
        propose = speculator.propose if speculator is not None else None

        def traced_propose(running, prefill_tokens=0):
            start = time.perf_counter()
            calls = speculator.num_drafter_calls
            propose(running, prefill_tokens)
            self._current["propose_s"] = time.perf_counter() - start
            self._current["drafter_ran"] = speculator.num_drafter_calls > calls
            plan = speculator.plan
            if plan is not None:
                self._current.update(plan_committed=plan.expected_committed, plan_s=plan.seconds, plan_gain=plan.gain)
            promise = speculator.promise  # the gate's, before the drafter ran (its cost included)
            if promise is not None:
                self._current.update(gate_committed=promise.expected_committed, gate_s=promise.seconds,
                                     gate_gain=promise.gain, gate_plain_s=len(running) / promise.base_rate)
            self._current["realized_factor"] = speculator.realized.factor

        def traced_execute(batch):
            tokens = sum(s.num_query_tokens for s in batch)
            plain = [ScheduledRequest(s.request, s.num_new_tokens) for s in batch]  # the same step without drafts
            prices = speculator.prices if speculator is not None else None  # None without a profile
            price = prices.batch_s if prices is not None else lambda _: None
            self._current.update(
                tokens=tokens, num_decoding=sum(1 for s in batch if s.num_new_tokens == 1),
                drafted=sum(len(s.draft) for s in batch),
                predicted_exec_s=price(batch), predicted_plain_s=price(plain))
            start = time.perf_counter()
            output = execute(batch)
            self._current["exec_s"] = time.perf_counter() - start
            self._current["committed"] = sum(len(t) for t in output.committed.values())
            return output

        def traced_step():
            self._current = {"propose_s": 0.0, "drafter_ran": False}
            start = time.perf_counter()
            events = step()
            if "exec_s" in self._current:
                self._current["step_s"] = time.perf_counter() - start
                self.steps.append(self._current)
            return events

        engine.step = traced_step
        runner.execute = traced_execute
        if speculator is not None:
            speculator.propose = traced_propose


def summarize(steps: list[dict]) -> dict:
    """Totals and per-count means of ``StepTrace.steps`` (decode steps only: no prefill chunk)."""
    decode = [s for s in steps if s["num_decoding"] and s["tokens"] == s["num_decoding"] + s["drafted"]]
    total_s = sum(s["step_s"] for s in decode) or 1e-12
    committed = sum(s["committed"] for s in decode)
    out = {"decode_steps": len(decode), "committed": committed, "committed_per_s": committed / total_s,
           "exec_share": sum(s["exec_s"] for s in decode) / total_s,
           "propose_share": sum(s["propose_s"] for s in decode) / total_s,
           "drafter_steps": sum(s["drafter_ran"] for s in decode),
           "verify_steps": sum(1 for s in decode if s["drafted"])}
    by_tokens = defaultdict(list)
    for s in decode:
        by_tokens[s["tokens"]].append(s)
    out["by_tokens"] = {
        n: {"steps": len(group), "exec_ms": 1e3 * statistics.median(s["exec_s"] for s in group),
            "predicted_ms": (1e3 * statistics.median(s["predicted_exec_s"] for s in group)
                             if group[0]["predicted_exec_s"] is not None else None),
            "rest_ms": 1e3 * statistics.median(s["step_s"] - s["exec_s"] - s["propose_s"] for s in group),
            "propose_ms": 1e3 * statistics.median(s["propose_s"] for s in group),
            "committed": statistics.mean(s["committed"] for s in group)}
        for n, group in sorted(by_tokens.items())}
    # per count of decoding requests: committed tokens per second of the steps that verified drafts
    # and of those that did not, side by side (what drafting delivered where it ran, measured; a
    # batch's tail, 1-2 requests left, gains where 4 lose), and what the gate promised the former
    by_requests = defaultdict(lambda: ([], []))
    for s in decode:
        by_requests[s["num_decoding"]][bool(s["drafted"])].append(s)

    def rate(group: list[dict]) -> float | None:
        return sum(s["committed"] for s in group) / sum(s["step_s"] for s in group) if group else None

    out["by_requests"] = {
        n: {"plain_steps": len(plain), "plain_committed_per_s": rate(plain), "drafting_steps": len(drafting),
            "drafting_committed_per_s": rate(drafting),
            "mean_promised_gain": (statistics.mean(s["gate_gain"] for s in drafting if "gate_gain" in s)
                                   if any("gate_gain" in s for s in drafting) else None)}
        for n, (plain, drafting) in sorted(by_requests.items())}
    # realized gain of a drafting step: its committed tokens per second of step time over a
    # non-drafting step with the same requests (one token each), priced by the same table
    gains = [(s["committed"] / s["step_s"]) / (s["num_decoding"] / (s["predicted_plain_s"] + s["step_s"]
                                                                     - s["exec_s"] - s["propose_s"]))
             for s in decode if s["drafted"] and s["predicted_plain_s"]]
    out["drafting_step_gain"] = {"steps": len(gains), "median": statistics.median(gains) if gains else None,
                                 "mean": statistics.mean(gains) if gains else None}
    planned = [s for s in decode if "plan_gain" in s and s["drafted"]]
    if planned:
        # the adaptive budget's promise per verify step against what the step did (sums over steps)
        out["plan"] = {"steps": len(planned),
                       "expected_committed": sum(s["plan_committed"] for s in planned),
                       "committed": sum(s["committed"] for s in planned),
                       "predicted_exec_s": sum(s["plan_s"] for s in planned),
                       "exec_s": sum(s["exec_s"] for s in planned),
                       "propose_s": sum(s["propose_s"] for s in planned),  # the drafter's call and the budget
                       "mean_predicted_gain": statistics.mean(s["plan_gain"] for s in planned)}
    gated = [s for s in decode if "gate_s" in s and s["drafted"]]
    if gated:
        # the gate's promise, before the drafter ran: the step (drafter included) against what the
        # step's pass and proposal took, and the price of the same step without drafts
        out["gate"] = {"steps": len(gated), "expected_committed": sum(s["gate_committed"] for s in gated),
                       "committed": sum(s["committed"] for s in gated),
                       "promised_s": sum(s["gate_s"] for s in gated),
                       "exec_and_propose_s": sum(s["exec_s"] + s["propose_s"] for s in gated),
                       "mean_plain_ms": 1e3 * statistics.mean(s["gate_plain_s"] for s in gated),
                       "mean_gain": statistics.mean(s["gate_gain"] for s in gated)}
    return out


def main(argv: list[str] | None = None) -> int:
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.spec_trace", description=__doc__.split("\n")[0])
    parser.add_argument("--kind", default="chat")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1,
                        help="prompts per in-flight slot: ROUNDS x CONCURRENCY prompts, the next starting as one "
                             "finishes (as benchmarks.spec --rounds)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--settings", default="none,dspark:1,dspark:7:adaptive")
    parser.add_argument("--attention", default="dense", choices=["dense", "sparse"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--schedule", default="lockstep", choices=["interleave", "lockstep"],
                        help="the engines take turns step by step (lockstep) or whole decodes (interleave)")
    parser.add_argument("--steps", action="store_true", help="also write every step's record (StepTrace.steps)")
    parser.add_argument("--name", default="spec_trace")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    loaded = load_model(resolve_model_path(None))
    prompts = build_prompts(loaded.tokenizer, args.kind, args.rounds * args.concurrency)
    runs = []
    for spec, spec_tokens, budget in parse_settings(args.settings):
        run = SettingRun(loaded, prompts, args.max_tokens, spec, max(spec_tokens, 1), budget, args.attention,
                         batch_size=args.concurrency)
        runs.append((f"{spec}:{spec_tokens}:{budget}", run, StepTrace(run.llm.engine)))  # traced after the warm-up
    repeat_runs([run for _name, run, _trace in runs], args.repeats, lockstep=args.schedule == "lockstep")
    rows = []
    base = runs[0][1].figures()
    for name, run, trace in runs:
        figures = run.figures()
        row = {"setting": name, "tokens_per_s": figures["tokens_per_s"], "tokens_per_s_runs": figures["tokens_per_s_runs"],
               "speedup_vs_none": speedup(figures, base, paired=True), **summarize(trace.steps)}  # repeats paired
        if args.steps:
            row["steps"] = trace.steps
        run.close()
        rows.append(row)
        echo(f"{name:20s} {row['tokens_per_s']:6.1f} tok/s x{row['speedup_vs_none']:.2f}  "
             f"committed/s {row['committed_per_s']:.1f}  exec {row['exec_share']:.0%} propose "
             f"{row['propose_share']:.0%}  drafter steps {row['drafter_steps']}/{row['decode_steps']}  "
             f"gain/step {row['drafting_step_gain']['median']}")
        if "plan" in row:
            p = row["plan"]
            echo(f"   plan over {p['steps']} verify steps: committed {p['committed']} (expected "
                 f"{p['expected_committed']:.1f}), exec {p['exec_s']:.2f} s (priced {p['predicted_exec_s']:.2f} s), "
                 f"proposals {p['propose_s']:.2f} s, mean promised gain {p['mean_predicted_gain']:.3f}")
        if "gate" in row:
            q = row["gate"]
            echo(f"   gate over {q['steps']} verify steps: committed {q['committed']} (expected "
                 f"{q['expected_committed']:.1f}), exec + propose {q['exec_and_propose_s']:.2f} s (promised "
                 f"{q['promised_s']:.2f} s), plain step priced {q['mean_plain_ms']:.1f} ms, mean promised gain "
                 f"{q['mean_gain']:.3f}")
        for n, g in row["by_requests"].items():
            plain, drafting = g["plain_committed_per_s"], g["drafting_committed_per_s"]
            promised = f" (promised x{g['mean_promised_gain']:.3f})" if g["mean_promised_gain"] else ""
            echo(f"   {n:3d} requests: plain {g['plain_steps']:4d} steps "
                 f"{plain or 0:6.1f} committed/s, drafting {g['drafting_steps']:4d} steps {drafting or 0:6.1f}"
                 f"{f' = x{drafting / plain:.3f}' if plain and drafting else ''}{promised}")
        for n, g in row["by_tokens"].items():
            predicted = f"{g['predicted_ms']:6.1f}" if g["predicted_ms"] is not None else "   n/a"
            echo(f"   {n:3d} tokens x{g['steps']:4d}: exec {g['exec_ms']:6.1f} ms (priced {predicted}) "
                 f"propose {g['propose_ms']:5.1f} rest {g['rest_ms']:5.1f}  committed {g['committed']:.2f}")
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{args.name}.json"
    write_json(out, {"machine": machine_info(), "args": vars(args), "rows": rows})
    echo(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
