"""Speculative decoding: acceptance and speed per drafter vs no speculation, one run.

Prompt kinds (held-out, built in: ``benchmarks/spec_prompts.py``): ``code_edit`` (copy-heavy),
``chat`` and ``long_doc_qa`` (a 4K-8K-token document and a question about it).
For each kind and concurrency (1, 4, 16 requests at once) and each setting (no speculation,
n-gram with 4 and 8 draft tokens), greedy decoding of ``--max-tokens`` tokens: aggregate output
tokens/s (over the summed wall time of the engine steps that decode the batch, prefill
included, since speculation must pay for itself end to end) and mean acceptance length
(tokens committed per verify step, bonus token included). Speculation is lossless here (greedy), so outputs are identical: checked.
With ``--schedule interleave`` or ``lockstep`` every setting's engine is alive at once and the
repeats pair up (``repeat_runs``); speedups are then medians of per-repeat ratios.
Writes ``results/<date>-<machine>/spec.json`` and ``spec.png``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import statistics
import time
from pathlib import Path

import torch

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.plotting import pyplot
from benchmarks.progress import echo, progress
from benchmarks.spec_prompts import build_prompts
from benchmarks.spec_targets import paired_ratios, spec_targets, speedup
from services.decoder.spec.drafter import SPEC_METHODS

DEFAULT_SETTINGS = "none,ngram:4,ngram:8,ngram:8:adaptive"
SPARSE = dict(attention="sparse", top_k_tokens=1024, sink_pages=1, recent_pages=2)


def parse_settings(text: str) -> list[tuple[str, int, str]]:
    """``"none,ngram:4,dflash:7:adaptive"`` -> ``[(spec, spec_tokens, budget), ...]``; the first
    must be ``none`` (the baseline every speedup and the lossless check refer to)."""
    settings = []
    for item in text.split(","):
        parts = item.strip().split(":")
        spec = parts[0]
        tokens = int(parts[1]) if len(parts) > 1 else (0 if spec == "none" else 4)
        budget = parts[2] if len(parts) > 2 else "fixed"
        if spec not in SPEC_METHODS or budget not in ("fixed", "adaptive"):
            raise ValueError(f"bad setting {item!r}: want spec[:tokens[:fixed|adaptive]]")
        settings.append((spec, tokens, budget))
    if not settings or settings[0][0] != "none":
        raise ValueError("the first setting must be 'none' (the baseline)")
    return settings


class SettingRun:
    """One setting's engine for one batch of prompts. Each ``run()`` decodes the prompts once on
    the same engine (as a server would: the adaptive budget's estimates and calibration carry
    over); ``figures()`` sums them up, with tok/s of the median run. ``batch_size``: at most that
    many prompts are in flight, the next one starting as soon as one finishes (a server under a
    fixed concurrency; 1: one after another), instead of all together."""

    def __init__(self, loaded, prompts: list[list[int]], max_tokens: int, spec: str, spec_tokens: int,
                 budget: str = "fixed", attention: str = "dense", batch_size: int | None = None,
                 gemm_dtype: str | None = None, draft_gemm_dtype: str = "auto"):
        from dhisparse import LLM, SamplingParams

        self.name = f"{spec}:{spec_tokens}:{budget}"
        self.prompts = prompts
        self.batch_size = batch_size or len(prompts)
        # pool sized for this batch only: each LLM preallocates (and touches) its whole hot pool
        needed = sum(len(p) + max_tokens + 2 * 16 + spec_tokens for p in prompts)
        capacity = max(-(-needed // 16) * 16, 8192)
        self.llm = LLM(loaded=loaded, spec=spec, spec_tokens=spec_tokens, max_num_batched_tokens=1024,
                       verify_budget=budget, kv_cache_tokens=capacity, gemm_dtype=gemm_dtype,
                       draft_gemm_dtype=draft_gemm_dtype,
                       max_model_len=min(capacity, loaded.config.max_position_embeddings),
                       **(SPARSE if attention == "sparse" else {}))
        self.params = SamplingParams(max_tokens=max_tokens)
        # warm-up: builds the weight copies of the GEMM kernels verify steps use (lazy, see model/linear.py)
        self.llm.generate([prompts[0]] * min(len(prompts), 4), SamplingParams(max_tokens=8))
        if self.llm.engine.speculator is not None:
            # measured decodes start where a started server does, not from the warm-up's one prompt
            self.llm.engine.speculator.reset_estimates()
        self.rates: list[float] = []
        self.decode_rates: list[float] = []  # per run: tokens over seconds of the steps where every request decoded
        self.accepted = self.verify_steps = 0
        self.outputs: list[list[int]] | None = None
        self._in_flight: dict[str, int] = {}

    def run(self) -> None:
        """Decodes the prompts once (``begin``, then ``advance`` until done)."""
        self.begin()
        while self.decoding:
            self.advance()

    def begin(self) -> None:
        """Starts one decode of the prompts: the first ``batch_size`` are queued; ``advance``
        steps them."""
        self._elapsed_s = 0.0
        # tokens and seconds of the steps in which no in-flight prompt was prefilling
        self._decode_tokens, self._decode_s = 0, 0.0
        self._finished: dict[int, object] = {}  # prompt index -> its finished request
        self._in_flight: dict[str, int] = {}  # request id -> prompt index
        self._next = 0
        self._fill()

    @property
    def decoding(self) -> bool:
        """Whether a decode started by ``begin`` has steps left."""
        return bool(self._in_flight)

    def _fill(self) -> None:
        while self._next < len(self.prompts) and len(self._in_flight) < self.batch_size:
            self._in_flight[self.llm.engine.add_request(self.prompts[self._next], self.params)] = self._next
            self._next += 1

    def advance(self) -> None:
        """One engine step, timed with the bookkeeping around it: each request that finished is
        kept and the next prompt queued in its place (``batch_size`` in flight while prompts are
        left, as under a server's fixed concurrency). When the last one finishes the decode's
        tok/s (output tokens over the summed seconds of its steps, prefill included) and its
        decode-phase tok/s (the tokens and seconds of the steps that began with every in-flight
        request past its prefill) are recorded and ``decoding`` turns false."""
        engine = self.llm.engine
        in_flight = [engine.requests[r] for r in self._in_flight]
        # a request has output once its prefill is done: a step of only such requests decodes
        outputs_before = [len(r.output_ids) for r in in_flight]
        t0 = time.perf_counter()
        engine.step()
        if all(outputs_before):
            self._decode_tokens += sum(len(r.output_ids) for r in in_flight) - sum(outputs_before)
            self._decode_s += time.perf_counter() - t0
        for request_id in [r for r in self._in_flight if engine.requests[r].is_finished]:
            self._finished[self._in_flight.pop(request_id)] = engine.pop_finished(request_id)
        self._fill()
        if not self._in_flight and engine.host_tier is not None:
            engine.host_tier.flush()  # what ``run_until_done`` ends with
        self._elapsed_s += time.perf_counter() - t0
        if self._in_flight:
            return
        finished = [self._finished[i] for i in range(len(self.prompts))]
        self.decode_rates.append(self._decode_tokens / self._decode_s if self._decode_s else 0.0)
        self._record([r.output_ids for r in finished], [r.stats.as_dict(len(r.output_ids)) for r in finished],
                     self._elapsed_s)

    def _record(self, outputs: list[list[int]], stats: list[dict], seconds: float) -> None:
        self.rates.append(sum(len(o) for o in outputs) / seconds)
        self.accepted += sum(s["accepted_tokens"] for s in stats)
        self.verify_steps += sum(s["num_verify_steps"] for s in stats)
        if self.outputs is not None and outputs != self.outputs:
            raise RuntimeError(f"{self.name}: greedy outputs differ between repeats")
        self.outputs = outputs

    def figures(self) -> dict:
        steps = self.verify_steps
        return {
            "tokens": sum(len(o) for o in self.outputs),
            "tokens_per_s": statistics.median(self.rates),
            "tokens_per_s_runs": self.rates,
            # decode-phase tok/s (steps where no prompt was being prefilled): what end-to-end tok/s
            # hides where prefill dominates (long_doc_qa: 4K-8K-token prompts, 64 tokens out)
            "decode_tokens_per_s": statistics.median(self.decode_rates),
            "decode_tokens_per_s_runs": self.decode_rates,
            # tokens committed per verify step, bonus included (0 when nothing was verified)
            "mean_acceptance_length": (self.accepted + steps) / steps if steps else 0.0,
            "outputs": self.outputs,
        }

    def close(self) -> None:
        """Frees the engine now: its hot pool and packed weights are GiBs, and the engine's
        reference cycles would otherwise wait for a garbage collection that large tensors do
        not trigger (interleaved runs of several kinds were OOM-killed that way); glibc keeps
        the freed arenas unless trimmed (five c=16 engines after the c=1 and c=4 ones reached
        the machine's 24 GB and were OOM-killed)."""
        self.llm = None
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)


SCHEDULES = ("sequential", "interleave", "lockstep")


def run_settings(loaded, prompts: list[list[int]], max_tokens: int, settings: list[tuple[str, int, str]],
                 attention: str = "dense", repeats: int = 1, schedule: str = "sequential",
                 batch_size: int | None = None, gemm_dtype: str | None = None, draft_gemm_dtype: str = "auto"):
    """Yields ``(setting, figures)`` per setting, in order. ``schedule``:

    - ``sequential``: each setting's engine is built, run ``repeats`` times and dropped before
      the next;
    - ``interleave`` and ``lockstep``: every setting's engine is built first (all held at once)
      and ``repeat_runs`` goes round them.

    ``batch_size``, ``gemm_dtype``, ``draft_gemm_dtype``: see ``SettingRun`` and ``DecoderConfig``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, not {schedule!r}")

    def build(setting):
        spec, spec_tokens, budget = setting
        return SettingRun(loaded, prompts, max_tokens, spec, max(spec_tokens, 1), budget, attention, batch_size,
                          gemm_dtype, draft_gemm_dtype)

    if schedule == "sequential":
        for setting in settings:
            run = build(setting)
            for _ in range(repeats):
                run.run()
            run.close()
            yield setting, run.figures()
        return
    runs = [build(setting) for setting in settings]
    repeat_runs(runs, repeats, lockstep=schedule == "lockstep")
    for setting, run in zip(settings, runs):
        run.close()
        yield setting, run.figures()


def repeat_runs(runs: list[SettingRun], repeats: int, lockstep: bool = False) -> None:
    """Each run decodes its prompts ``repeats`` times, the runs taking turns, forwards and
    backwards in turn (none, a, b, b, a, none, ...: a drift that builds up over a round puts
    setting j after the baseline once and before it the next time, so it moves paired ratios
    both ways instead of always the same way for the last settings).

    Interleaved (``lockstep`` false), the turn is a whole decode: the machine's drift slower than
    one decode (seconds) falls on every setting alike. In ``lockstep`` the turn is one engine
    step: every run's decode starts together and the engines step by turns, one step each, so
    anything that slows the machine for longer than a few steps (tens of ms) slows every setting
    alike. An A/A run (``--settings none,none,none``) shows what either leaves: on a shared 2-core
    VM, identical engines decoding by turns read up to 20% apart."""
    for repeat in range(repeats):
        order = runs if repeat % 2 == 0 else runs[::-1]
        if not lockstep:
            for run in order:
                run.run()
            continue
        for run in order:
            run.begin()
        turn = 0
        while any(run.decoding for run in runs):
            for run in order if turn % 2 == 0 else order[::-1]:
                if run.decoding:
                    run.advance()
            turn += 1


def main(argv: list[str] | None = None) -> int:
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.spec", description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default="code_edit,chat,long_doc_qa")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--prompts", type=int, default=0,
                        help="prompts per kind, CONCURRENCY in flight at a time, the next starting as one "
                             "finishes (default: CONCURRENCY, one batch); chat prompts beyond the 4 hand-written "
                             "ones come from the drafters' held-out split")
    parser.add_argument("--rounds", type=int, default=1,
                        help="prompts per in-flight slot: ROUNDS x CONCURRENCY prompts per kind and concurrency, "
                             "the next starting as one finishes (--prompts, when larger, wins)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--settings", default=DEFAULT_SETTINGS,
                        help="comma list of spec[:draft tokens[:fixed|adaptive]], the first 'none'")
    parser.add_argument("--attention", default="dense", help="dense, sparse or dense,sparse")
    parser.add_argument("--repeats", type=int, default=1, help="runs per setting on one engine; median tok/s")
    parser.add_argument("--schedule", default="sequential", choices=SCHEDULES,
                        help="sequential: one engine at a time; interleave: every setting's engine built first and "
                             "the repeats go round them, whole decodes in turn; lockstep: the same, the engines "
                             "taking turns step by step (holds them all at once: GiBs each)")
    parser.add_argument("--interleave", action="store_const", const="interleave", dest="schedule",
                        help="--schedule interleave")
    parser.add_argument("--lockstep", action="store_const", const="lockstep", dest="schedule",
                        help="--schedule lockstep")
    parser.add_argument("--gemm-dtype", default=None, choices=["float32", "bfloat16"],
                        help="projection matmul precision (DecoderConfig.gemm_dtype; default: fp32 like the model)")
    parser.add_argument("--draft-gemm-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="the learned drafters' matmul precision (DecoderConfig.draft_gemm_dtype)")
    parser.add_argument("--name", default="spec", help="output file stem")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    loaded = load_model(resolve_model_path(None))
    settings = parse_settings(args.settings)
    paired = args.schedule != "sequential"  # repeat i of every setting ran together
    rows = []
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    bar = progress(desc="spec", unit="run",
                   total=len(args.attention.split(",")) * len(args.kinds.split(",")) * len(concurrencies) * len(settings))
    for attention in args.attention.split(","):
        for kind in args.kinds.split(","):
            for concurrency in concurrencies:
                prompts = build_prompts(loaded.tokenizer, kind, max(args.prompts, args.rounds * concurrency))
                base = None
                for (spec, spec_tokens, budget), figures in run_settings(loaded, prompts, args.max_tokens, settings,
                                                                         attention, args.repeats, args.schedule,
                                                                         batch_size=concurrency,
                                                                         gemm_dtype=args.gemm_dtype,
                                                                         draft_gemm_dtype=args.draft_gemm_dtype):
                    outputs = figures.pop("outputs")
                    if base is None:
                        base = (figures, outputs)
                    row = {"attention": attention, "kind": kind, "concurrency": concurrency, "prompts": len(prompts),
                           "spec": spec,
                           "spec_tokens": spec_tokens, "verify_budget": budget, **figures, "paired": paired,
                           "speedup_vs_none": speedup(figures, base[0], paired),
                           "speedup_runs": paired_ratios(figures, base[0]) if paired else None,
                           "decode_speedup_vs_none": speedup(figures, base[0], paired, "decode_tokens_per_s"),
                           "decode_speedup_runs": (paired_ratios(figures, base[0], "decode_tokens_per_s")
                                                   if paired else None),
                           "lossless": outputs == base[1]}
                    rows.append(row)
                    bar.update()
                    spread = (f" [{min(row['speedup_runs']):.2f}-{max(row['speedup_runs']):.2f}]"
                              if row["speedup_runs"] else "")
                    echo(f"{attention:6s} {kind:12s} c={concurrency:2d} {spec:6s} k={spec_tokens} {budget:8s}: "
                         f"{figures['tokens_per_s']:7.1f} tok/s x{row['speedup_vs_none']:.2f}{spread}  "
                         f"decode {figures['decode_tokens_per_s']:6.1f} tok/s x{row['decode_speedup_vs_none']:.2f}  "
                         f"acc.len {figures['mean_acceptance_length']:.2f}  lossless={row['lossless']}")
                write_results(args, loaded, rows)
    bar.close()
    targets = write_results(args, loaded, rows)
    for name, ok in targets.items():
        print(f"{name}: {'PASS' if ok else 'FAIL'}")
    return 0


def write_results(args, loaded, rows: list[dict]) -> dict[str, bool]:
    """Targets over ``rows`` so far; writes ``<name>.json`` and ``.png`` (called after every
    group of settings, so a run killed part-way, e.g. out of memory, keeps what it measured)."""
    targets = spec_targets(rows)
    result = {"benchmark": "spec", "machine": machine_info(), "model": str(loaded.source),
              "settings": {"max_tokens": args.max_tokens, "dtype": "float32",
                           "gemm_dtype": args.gemm_dtype or "float32", "draft_gemm_dtype": args.draft_gemm_dtype,
                           "attention": args.attention,
                           "sparse": SPARSE, "drafter_settings": args.settings, "threads": torch.get_num_threads(),
                           "repeats": args.repeats, "schedule": args.schedule,
                           "prompts_per_kind": args.prompts or f"{args.rounds} x concurrency"},
              "rows": rows, "targets": targets}
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / f"{args.name}.json", result)
    _plot(rows, out_dir / f"{args.name}.png")
    return targets


def _plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()

    panels = sorted({(r.get("attention", "dense"), r["kind"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (attention, kind) in zip(axes[0], panels):
        for spec, spec_tokens, budget in sorted({(r["spec"], r["spec_tokens"], r["verify_budget"]) for r in rows}):
            sel = [r for r in rows if (r.get("attention", "dense"), r["kind"]) == (attention, kind)
                   and (r["spec"], r["spec_tokens"], r["verify_budget"]) == (spec, spec_tokens, budget)]
            label = "no speculation" if spec == "none" else f"{spec} k={spec_tokens} {budget}"
            ax.plot([r["concurrency"] for r in sel], [r["tokens_per_s"] for r in sel], "o-", label=label)
        ax.set_title(f"{kind} ({attention})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent requests")
        ax.set_ylabel("output tokens/s")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
