"""``dhisparse bench serve``: load the full stack (gateway -> decoder over gRPC) like
``vllm bench serve`` and compare its throughput with the in-process engine.

Arrivals: all at once (``--request-rate inf``, the default, closed loop at ``--concurrency``),
Poisson or fixed-rate. Prompt sets: ``short_chat`` and ``long_doc``. Reports TTFT / TPOT / ITL
p50/p90/p99, output tokens/s, goodput under a TTFT/TPOT SLO, and the gateway-overhead ratio
(stack tokens/s over in-process tokens/s at the same concurrency; target >= 0.95; with
``--repeats N`` the two phases alternate N times and the median ratio is the headline). The in-process
baseline runs the stack decoder's engine the way the decoder does (same settings, same kvtier host
tier, engine on its own thread: ``benchmarks/serve/inprocess.py``), while the started stack idles;
the load average before each phase is recorded (2 shared cores: a busy machine skews the ratio).
Writes ``results/<date>-<machine>/serve-<dataset>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.plotting import pyplot
from benchmarks.serve.load import run_load, summarize
from benchmarks.serve.workload import arrival_offsets_s, build_prompts

MODEL = "SmolLM2-135M-Instruct"


def run(args: argparse.Namespace) -> dict:
    prompts = build_prompts(args.dataset, args.num_prompts, args.doc_words, args.seed)
    offsets = arrival_offsets_s(len(prompts), args.request_rate, args.arrival, args.seed)
    result = {"settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "machine": machine_info()}
    stack = None
    base_url = args.url
    if base_url is None:
        from dhisparse.stack import LocalStack, StackOptions, free_port

        decoder_args = ["--threads", str(args.threads)] if args.threads else []
        stack = LocalStack(StackOptions(gateway_port=free_port(), decoder_port=free_port(), kvtier_port=free_port(),
                                        kvtier_pool_gib=0.25, decoder_args=decoder_args)).start()
        base_url = stack.url
    repeats = []
    try:
        warm = build_prompts("short_chat", args.concurrency, seed=args.seed)
        asyncio.run(run_load(base_url, args.model, warm, [0.0] * len(warm), 4, args.concurrency, args.api_key))
        for _ in range(args.repeats):  # in-process and stack phases alternate: drift hits both alike
            rep = {"load_avg_1min": {}}
            if args.compare_in_process:
                rep["load_avg_1min"]["in_process"] = os.getloadavg()[0]
                rep["in_process"] = _in_process(args, prompts, stack)
                print(f"in-process engine: {rep['in_process']['output_tokens_per_s']:.1f} output tok/s")
            rep["load_avg_1min"]["stack"] = os.getloadavg()[0]
            records, duration_s = asyncio.run(run_load(base_url, args.model, prompts, offsets, args.max_tokens,
                                                       args.concurrency, args.api_key, desc="serve"))
            rep["stack"] = summarize(records, duration_s, args.slo_ttft_ms, args.slo_tpot_ms)
            rep["records"] = records
            if rep.get("in_process", {}).get("output_tokens_per_s"):
                rep["ratio"] = rep["stack"]["output_tokens_per_s"] / rep["in_process"]["output_tokens_per_s"]
                print(f"stack: {rep['stack']['output_tokens_per_s']:.1f} output tok/s, ratio {rep['ratio']:.3f}")
            repeats.append(rep)
    finally:
        if stack is not None:
            stack.stop()
    # the headline figures are the repeat with the median ratio (the last one without a baseline)
    rep = sorted(repeats, key=lambda r: r.get("ratio", 0.0))[len(repeats) // 2] if "ratio" in repeats[0] else repeats[-1]
    result.update({k: rep[k] for k in ("load_avg_1min", "in_process", "stack") if k in rep})
    result["records"] = [{"ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "latency_s": r.latency_s,
                          "completion_tokens": r.completion_tokens, "ok": r.ok} for r in rep["records"]]
    if "ratio" in rep:
        result["gateway_overhead_ratio"] = rep["ratio"]
        result["repeats"] = [{"in_process_tokens_per_s": r["in_process"]["output_tokens_per_s"],
                              "stack_tokens_per_s": r["stack"]["output_tokens_per_s"], "ratio": r["ratio"],
                              "load_avg_1min": r["load_avg_1min"]} for r in repeats]
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"serve-{args.dataset}"
    write_json(out_dir / f"{name}.json", result)
    _plot(result, out_dir / f"{name}.png")
    print(f"wrote {out_dir / name}.json")
    return result


def _in_process(args: argparse.Namespace, prompts: list[list[dict]], stack) -> dict:
    """The baseline with the stack decoder's engine settings: its thread count and, when the local
    stack runs kvtier, a host tier on that same kvtier (while the stack idles)."""
    from benchmarks.serve.inprocess import in_process_baseline
    from services.decoder.config import DecoderConfig

    fields = {"num_threads": args.threads} if args.threads else {}
    if stack is not None and stack.run_kvtier:
        fields.update(kvtier_address=f"{stack.options.host}:{stack.options.kvtier_port}",
                      decoder_id=f"bench-inprocess-{stack.options.instance}", internal_token=stack.internal_token)
    return in_process_baseline(prompts, args.max_tokens, args.concurrency, DecoderConfig(**fields))


def _plot(result: dict, path: Path) -> None:
    plt = pyplot()
    ok = [r for r in result["records"] if r["ok"]]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key, label in ((axes[0], "ttft_s", "TTFT (ms)"), (axes[1], "tpot_s", "TPOT (ms)")):
        values = sorted(r[key] * 1000 for r in ok if r[key] is not None)
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))])
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    bars = {"stack": result["stack"]["output_tokens_per_s"]}
    if "in_process" in result:
        bars["in-process"] = result["in_process"]["output_tokens_per_s"]
    axes[2].bar(list(bars), list(bars.values()))
    axes[2].set_ylabel("output tokens/s")
    ratio = result.get("gateway_overhead_ratio")
    axes[2].set_title(f"ratio {ratio:.2f}" if ratio else "throughput")
    s = result["settings"]
    fig.suptitle(f"serve: {s['dataset']}, {s['num_prompts']} prompts, concurrency {s['concurrency']}, "
                 f"rate {s['request_rate']}, max_tokens {s['max_tokens']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dhisparse bench serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="a running gateway (default: start a local stack)")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--dataset", default="short_chat", choices=["short_chat", "long_doc"])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--doc-words", type=int, default=1200, help="long_doc: words per document")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (eos ignored)")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s; inf = all at once")
    parser.add_argument("--arrival", default="poisson", choices=["poisson", "fixed"])
    parser.add_argument("--concurrency", type=int, default=8, help="most requests in flight")
    parser.add_argument("--slo-ttft-ms", type=float, default=2000.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=200.0)
    parser.add_argument("--no-compare", dest="compare_in_process", action="store_false",
                        help="skip the in-process baseline")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of both engines")
    parser.add_argument("--repeats", type=int, default=1,
                        help="in-process and stack runs, alternating; the headline is the median ratio")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output folder (default results/<date>-<machine>/)")
    args = parser.parse_args([a for a in (argv or []) if a != "--"] if argv is not None else None)
    result = run(args)
    stack = result["stack"]
    print(f"stack: {stack['num_ok']}/{stack['num_requests']} ok, {stack['output_tokens_per_s']:.1f} output tok/s, "
          f"goodput {stack['goodput_requests_per_s']:.2f} req/s")
    for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
        values = stack[metric]
        if values["p50"] is not None:
            print(f"  {metric:8s} p50 {values['p50']:8.1f}  p90 {values['p90']:8.1f}  p99 {values['p99']:8.1f}")
    if "gateway_overhead_ratio" in result:
        each = ", ".join(f"{r['ratio']:.3f}" for r in result["repeats"])
        print(f"gateway overhead ratio (stack / in-process tok/s): {result['gateway_overhead_ratio']:.3f} "
              f"(median of {each})")
    return 0
