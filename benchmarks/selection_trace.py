"""Selection trace: the hit-rate, working-set-union and acceptance inputs of the H200 projection,
recorded from real runs of our decoder (real weights, real kvtier, real text).

Two runs over ``--requests`` CPython stdlib documents of ``--prompt-tokens`` tokens, every request
SPARSE (``residency=always-sparse``) from its first decode step on:

- plain decoding: every decode step's working set (the unpinned pages its token selected) of every
  request in every layer is recorded (``ModelRunner.selection_observer``);
- block verification with a drafter (``--spec``, ``--spec-tokens`` draft tokens per block): the same
  record, plus the mean acceptance length from the requests' stats.

From the records:

- **hit-rate curve**: the plain run's working sets are replayed through the decoder's own residency
  resolution (``kernels.resolve_residency`` on ``SparseBuffer`` state, LRU) for hot buffers of
  several sizes. Selection does not depend on residency, so the replay is exact; the replay at the
  run's real buffer size must reproduce the hits the engine counted (``replay_check``). ``hit_rate``
  leaves out each request's first decode step (its empty buffer's first fill; a projected step is
  a steady-state one); ``hit_rate_with_first_fill`` counts it. Buffer sizes
  are written as multiples of the mean working set (``hit_rate_curve_over_working_set``): the
  projection applies the same multiple at 100K tokens (its stated scaling rule).
- **working-set union factor**: per verify block and layer, |union of the block's selections| over
  the mean |one token's selection|, summed over blocks. Only top-k pages count: sink and recent
  pages are pinned, the same for every token of a block, so leaving them out overstates the
  factor (the conservative side).
- **mean acceptance length** (tokens committed per verify step, bonus included) of the spec run.

Writes ``results/<date>-<machine>/selection_trace.json``: the format
``python -m benchmarks.h200_projection --trace`` reads (``benchmarks/h200_projection/traces.py``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.progress import echo, progress
from benchmarks.residency import Kvtier
from benchmarks.sparse_quality.tasks import stdlib_documents
from kernels import resolve_residency
from services.decoder.kv.sparse_buffer import SparseBuffer
from services.decoder.spec.drafter import SPEC_METHODS
from services.metadata.redis_server import RedisServer

BUFFER_OVER_WORKING_SET = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


class SelectionRecorder:
    """``ModelRunner.selection_observer`` that keeps, per request, the working set of every layer of
    every decode step (prefill chunks are left out: they are not what a decode step fetches)."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.steps: dict[str, list[list[torch.Tensor]]] = defaultdict(list)  # request -> step -> layer -> [W]
        self.union_pages = 0  # sum over verify blocks and layers of |union|
        self.token_pages = 0.0  # sum over the same of the mean |one token's selection|
        self.num_blocks = 0  # (block, layer) pairs with more than one query token

    def __call__(self, request, layer: int, working: torch.Tensor, token_pages: torch.Tensor) -> None:
        if not request.output_ids:
            return
        steps = self.steps[request.request_id]
        if layer == 0:
            steps.append([])
        steps[-1].append(working.clone())
        if token_pages.numel() > 1:
            self.union_pages += working.numel()
            self.token_pages += float(token_pages.float().mean())
            self.num_blocks += 1

    def mean_working_set(self) -> float:
        sizes = [ws.numel() for steps in self.steps.values() for step in steps for ws in step]
        return sum(sizes) / len(sizes)

    def max_working_set(self) -> int:
        return max(ws.numel() for steps in self.steps.values() for step in steps for ws in step)

    def union_factor(self) -> float | None:
        return self.union_pages / self.token_pages if self.token_pages else None


def replay_hits(steps: list[list[torch.Tensor]], capacity: int, max_pages: int,
                warmup_steps: int = 0) -> tuple[int, int]:
    """Hits and misses of one request's recorded working sets ``steps[step][layer]: [W]`` through
    an LRU hot buffer of ``capacity`` pages per layer (all layers resolved at once, one row each),
    counted from step ``warmup_steps`` on (the buffer starts empty: its first fill misses)."""
    num_layers = len(steps[0])
    buffer = SparseBuffer(list(range(capacity)), num_layers, max_pages)
    hits = misses = 0
    for i, step in enumerate(steps):
        width = max(max(ws.numel() for ws in step), 1)
        working = torch.full((num_layers, width), -1, dtype=torch.int64)
        for layer, ws in enumerate(step):
            working[layer, : ws.numel()] = ws
        plan = resolve_residency(working, buffer.slot_of_page, buffer.lru, buffer.free)
        buffer.slot_of_page, buffer.lru, buffer.free = plan.new_slot_of_page, plan.new_lru_pages, plan.new_free_slots
        if i >= warmup_steps:
            hits += int((plan.hit & (working >= 0)).sum())
            misses += int(plan.num_misses.sum())
    return hits, misses


def hit_curve(recorder: SelectionRecorder, max_pages: int) -> list[dict]:
    mean_ws, max_ws = recorder.mean_working_set(), recorder.max_working_set()
    capacities = sorted({max(max_ws, round(r * mean_ws)) for r in BUFFER_OVER_WORKING_SET})
    curve = []
    for capacity in capacities:
        point = {"buffer_pages": capacity, "buffer_over_working_set": round(capacity / mean_ws, 3)}
        for key, warmup in (("hit_rate", 1), ("hit_rate_with_first_fill", 0)):
            counts = [replay_hits(steps, capacity, max_pages, warmup) for steps in recorder.steps.values()]
            hits, misses = sum(h for h, _ in counts), sum(m for _, m in counts)
            point[key] = round(hits / (hits + misses), 4)
        curve.append(point)
    return curve


def run_one(loaded, kvtier: Kvtier, prompts: list[list[int]], spec: str, args) -> dict:
    from dhisparse import LLM, SamplingParams

    spec_tokens = args.spec_tokens if spec != "none" else 4
    llm = LLM(loaded=loaded, kvtier_address=kvtier.address, decoder_id=f"trace-{spec}", residency="always-sparse",
              attention="sparse", top_k_tokens=args.top_k_tokens, sink_pages=1, recent_pages=2, spec=spec,
              spec_tokens=spec_tokens, max_model_len=args.prompt_tokens + args.max_tokens + 32,
              max_num_batched_tokens=512, max_num_seqs=len(prompts))
    engine = llm.engine
    recorder = SelectionRecorder(loaded.config.num_layers)
    engine.runner.selection_observer = recorder
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    wall_s = time.perf_counter() - start
    requests = [engine.pop_finished(i) for i in ids]
    stats = [r.stats.as_dict(len(r.output_ids)) for r in requests]
    engine.check_integrity()
    buffer_pages, page_score = engine.config.buffer_pages, engine.config.page_score
    engine.close()
    max_pages = -(-(args.prompt_tokens + args.max_tokens + 32) // 16)
    counted_hits = sum(s["num_buffer_hits"] for s in stats)
    counted_misses = sum(s["num_buffer_misses"] for s in stats)
    replayed = [replay_hits(recorder.steps[i], buffer_pages, max_pages) for i in ids] if spec == "none" else []
    verify_steps = sum(s["num_verify_steps"] for s in stats)
    return {
        "spec": spec, "spec_tokens": spec_tokens if spec != "none" else 0, "page_score": page_score,
        "wall_s": round(wall_s, 2),
        "decode_steps_recorded": sum(len(recorder.steps[i]) for i in ids),
        "mean_working_set_pages": round(recorder.mean_working_set(), 2),
        "max_working_set_pages": recorder.max_working_set(),
        "union_factor": round(recorder.union_factor(), 4) if recorder.union_factor() else None,
        "num_verify_blocks_x_layers": recorder.num_blocks,
        "mean_acceptance_length": round((sum(s["accepted_tokens"] for s in stats) + verify_steps) / verify_steps, 3)
        if verify_steps else None,
        "engine_buffer_pages": buffer_pages,
        "engine_hits": counted_hits, "engine_misses": counted_misses,
        "replay_check": {"hits": sum(h for h, _ in replayed), "misses": sum(m for _, m in replayed),
                         "equal": [sum(h for h, _ in replayed), sum(m for _, m in replayed)]
                         == [counted_hits, counted_misses]} if replayed else None,
        "hit_rate_curve": hit_curve(recorder, max_pages),
    }


def trace_json(plain: dict, spec: dict, args) -> dict:
    """The keys ``benchmarks.h200_projection.traces.load_trace`` reads."""
    return {
        "source": (f"benchmarks.selection_trace: SmolLM2-135M, {args.requests} x {args.prompt_tokens}-token stdlib "
                   f"documents, top-k {args.top_k_tokens} tokens, {args.max_tokens} decode steps"),
        "context_tokens": args.prompt_tokens,
        "hit_rate_curve_over_working_set": [
            {"buffer_over_working_set": p["buffer_over_working_set"], "hit_rate": p["hit_rate"]}
            for p in plain["hit_rate_curve"]],
        **({"working_set_union_factor": spec["union_factor"]} if spec["union_factor"] else {}),
        **({"mean_acceptance_length": spec["mean_acceptance_length"]} if spec["mean_acceptance_length"] else {}),
        "gamma": spec["spec_tokens"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.selection_trace", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=8064, help="8064 + 64 + 32 fits the 8192-token trained context")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top-k-tokens", type=int, default=1024)
    parser.add_argument("--spec", choices=SPEC_METHODS[1:], default="ngram")
    parser.add_argument("--spec-tokens", type=int, default=8, help="draft tokens per verify block (gamma)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    loaded = load_model(resolve_model_path(None))
    prompts = [ids for _, ids in stdlib_documents(loaded.tokenizer, args.prompt_tokens, args.requests)]
    if len(prompts) < args.requests:
        parser.error(f"only {len(prompts)} stdlib documents have {args.prompt_tokens} tokens")
    host_pages = args.requests * -(-(args.prompt_tokens + args.max_tokens + 32) // 16) + 64
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop kvtier and Redis
    runs = {}
    bar = progress(desc="selection trace", total=2, unit="run")
    with tempfile.TemporaryDirectory(prefix="dhs-bench-redis-") as directory:
        redis = RedisServer(directory=directory).start()
        try:
            for spec in ("none", args.spec):
                bar.set_postfix_str(spec)
                kvtier = Kvtier(redis.url, host_pages, f"trace-{spec}")
                try:
                    runs[spec] = run_one(loaded, kvtier, prompts, spec, args)
                finally:
                    kvtier.stop()
                bar.update(1)
        finally:
            redis.stop()
    bar.close()
    plain, spec = runs["none"], runs[args.spec]
    result = {"benchmark": "selection_trace", "machine": machine_info(), "settings": vars(args),
              "runs": [plain, spec], "trace": trace_json(plain, spec, args)}
    out = Path(args.out) if args.out else results_dir()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "selection_trace.json", result)
    for run in (plain, spec):
        echo(f"{run['spec']:>6}: mean working set {run['mean_working_set_pages']} pages, union factor "
             f"{run['union_factor']}, acceptance {run['mean_acceptance_length']}, replay check {run['replay_check']}")
        echo("        hit rate: " + ", ".join(f"{p['buffer_over_working_set']}x {p['hit_rate']}" for p in run["hit_rate_curve"]))
    return 0 if plain["replay_check"]["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
