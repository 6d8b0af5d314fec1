"""Decode throughput: our runtime vs transformers and llama.cpp on the same GGUF, same machine, one run.

Figures (all greedy, fp32 unless --dtype / --gemm-dtype say otherwise):
- batch-1 decode tok/s with a ~128-token and a ~2,000-token prompt (prefill excluded);
- aggregate decode tok/s with 8 concurrent requests (window in which all 8 are decoding);
- the memory-bandwidth bound: measured read bandwidth / weight bytes read per step;
- our measured GEMM plan with and without its row padding (``GemmPlan.pad_to``), interleaved.
llama.cpp (optional extra, ``benchmarks/peers/llama_cpp.py``) runs the GGUF's quantized weights;
without it the JSON records why it was not measured.
Writes ``results/<date>-<machine>/decode.json`` and ``decode.png``.

Run: ``python -m benchmarks.decode`` or ``dhisparse bench decode [-- --decode-tokens 64]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.machine import (
    machine_info,
    measured_read_bandwidth_bytes_per_s,
    results_dir,
    write_json,
)
from benchmarks.plotting import pyplot
from benchmarks.progress import phase, progress


def _prompts(tokenizer, count: int, target_len: int) -> list[list[int]]:
    words = ["alpha", "river", "stone", "cloud", "signal", "paper", "orbit", "lantern", "maple", "copper"]
    prompts = []
    for r in range(count):
        text = " ".join(f"{words[(i * 7 + r) % len(words)]}{i % 13}" for i in range(target_len * 2))
        prompts.append(tokenizer.encode(text)[:target_len])
    return prompts


def bench_ours(llm, prompt: list[int], decode_tokens: int, repeats: int) -> float:
    from dhisparse import SamplingParams

    best = 0.0
    for _ in range(repeats):
        out = llm.generate([prompt], SamplingParams(max_tokens=decode_tokens, ignore_eos=True))[0]
        best = max(best, out.stats["decode_tokens_per_s"])
    return best


def bench_ours_concurrent(llm, prompts: list[list[int]], decode_tokens: int) -> dict:
    """Aggregate decode tok/s over the window where every request has its first token."""
    from dhisparse import SamplingParams

    first_token_s: dict[str, float] = {}
    finish_s: dict[str, float] = {}
    token_times: list[float] = []

    def on_event(event):
        now = time.perf_counter()
        token_times.append(now)
        first_token_s.setdefault(event.request_id, now)
        if event.finished:
            finish_s[event.request_id] = now

    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=decode_tokens, ignore_eos=True), on_event=on_event)
    wall = time.perf_counter() - t0
    window_start = max(first_token_s.values())
    window_end = min(finish_s.values())
    in_window = sum(1 for t in token_times if window_start < t <= window_end)
    return {
        "aggregate_decode_tokens_per_s": in_window / (window_end - window_start),
        "wall_tokens_per_s_incl_prefill": sum(len(o.token_ids) for o in outs) / wall,
    }


def bench_plan_padding(llm, short: list[int], concurrent: list[list[int]], decode_tokens: int, repeats: int) -> dict:
    """Our decode with the measured GEMM plan against the same plan without its pads
    (``GemmPlan.pad_to``), interleaved ``repeats`` times: batch-1 tok/s (best of each) and the
    aggregate of 4 and 8 concurrent requests (median of each), and the ratios padded / unpadded."""
    import statistics

    from services.decoder.model.gemm_plan import apply_plan

    model = llm.engine.model
    padded = model.gemm_plan
    if padded is None or not padded.pad_to:
        return {"unavailable": "the measured GEMM plan pads no row count on this machine"}
    plans = {"padded": padded, "unpadded": padded.unpadded()}
    figures = {name: {"batch1": [], "concurrent4": [], "concurrent8": []} for name in plans}
    try:
        for _ in range(repeats):
            for name, plan in plans.items():
                apply_plan(model.projections, plan)
                figures[name]["batch1"].append(bench_ours(llm, short, decode_tokens, 1))
                for n in (4, 8):
                    figures[name][f"concurrent{n}"].append(
                        bench_ours_concurrent(llm, concurrent[:n], decode_tokens)["aggregate_decode_tokens_per_s"])
    finally:
        apply_plan(model.projections, padded)
    out = {"plan": padded.describe(), "repeats": repeats}
    for name in plans:
        out[name] = {"batch1_tokens_per_s": max(figures[name]["batch1"]),
                     **{f"{k}_tokens_per_s": statistics.median(v) for k, v in figures[name].items() if k != "batch1"},
                     "runs": figures[name]}
    out["ratios"] = {k: out["padded"][k] / out["unpadded"][k] for k in out["padded"] if k.endswith("_tokens_per_s")}
    return out


def bench_transformers(hf, prompts: list[list[int]], decode_tokens: int, repeats: int) -> float:
    """Decode tok/s of ``hf.generate`` for a (left-padded) batch: (T(N) - T(1)) over N - 1 steps."""
    batch = torch.tensor(prompts, device=hf.device)
    mask = torch.ones_like(batch)

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(batch, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0)
        out.tolist()  # waits for the device
        return time.perf_counter() - t0

    timed(2)
    best = 0.0
    for _ in range(repeats):
        prefill = timed(1)
        total = timed(decode_tokens)
        best = max(best, len(prompts) * (decode_tokens - 1) / max(total - prefill, 1e-9))
    return best


def bench_llama_cpp(model_path, short: list[int], long_: list[int], concurrent: list[list[int]], args) -> dict:
    """The same three figures from llama.cpp on the same GGUF (best of ``repeats``), or
    ``{"unavailable": reason}``."""
    from benchmarks.peers.llama_cpp import LlamaCppPeer, PeerUnavailable

    try:
        with LlamaCppPeer(model_path, 4096, n_seq=len(concurrent), threads=args.threads) as peer:
            best = {}
            for key, prompts in (("batch1_prompt128_tokens_per_s", [short]),
                                 ("batch1_prompt2000_tokens_per_s", [long_]),
                                 ("concurrent8_aggregate_decode_tokens_per_s", concurrent)):
                best[key] = max(peer.decode_tokens_per_s(prompts, args.decode_tokens) for _ in range(args.repeats))
            best["version"] = peer.version
            best["weights"] = "the GGUF's own quantization (llama.cpp kernels)"
            return best
    except PeerUnavailable as exc:
        return {"unavailable": str(exc)}


def run(args: argparse.Namespace) -> dict:
    from dhisparse import LLM
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    torch.set_num_threads(args.threads)
    model_path = resolve_model_path(args.model)
    loaded = load_model(model_path)
    on_gpu = args.device != "cpu"
    skip_llama_cpp = args.skip_llama_cpp or on_gpu  # llama-cpp-python here is the CPU build
    llm = LLM(loaded=loaded, dtype=args.dtype, gemm_dtype=args.gemm_dtype, kv_cache_tokens=16384,
              max_num_batched_tokens=2048, device=args.device)
    weight_bytes = llm.engine.model.weight_bytes_per_step
    bar = progress(desc="decode", unit="phase",
                   total=6 + (0 if args.skip_transformers else 4) + (0 if skip_llama_cpp else 1))
    read_bw = phase(bar, "read bandwidth", measured_read_bandwidth_bytes_per_s, args.device)
    bound = read_bw / weight_bytes
    short, long_ = _prompts(llm.tokenizer, 1, 128)[0], _prompts(llm.tokenizer, 1, 2000)[0]
    concurrent = _prompts(llm.tokenizer, 8, 128)

    phase(bar, "warm-up", bench_ours, llm, short, 8, 1)
    ours = {
        "batch1_prompt128_tokens_per_s": phase(bar, "ours batch-1 prompt 128", bench_ours, llm, short,
                                               args.decode_tokens, args.repeats),
        "batch1_prompt2000_tokens_per_s": phase(bar, "ours batch-1 prompt 2000", bench_ours, llm, long_,
                                                args.decode_tokens, args.repeats),
    }
    ours.update({f"concurrent8_{k}": v for k, v in phase(bar, "ours 8 concurrent", bench_ours_concurrent, llm,
                                                          concurrent, args.decode_tokens).items()})

    padding = phase(bar, "ours: GEMM plan padded vs unpadded", bench_plan_padding, llm, short, concurrent,
                    args.decode_tokens, args.repeats)
    peer = {}
    if not args.skip_transformers:
        from benchmarks.peers.transformers_hf import load_transformers

        hf = phase(bar, "transformers load", load_transformers, model_path, args.dtype, args.device)
        peer = {
            "batch1_prompt128_tokens_per_s": phase(bar, "transformers batch-1 prompt 128", bench_transformers, hf,
                                                   [short], args.decode_tokens, args.repeats),
            "batch1_prompt2000_tokens_per_s": phase(bar, "transformers batch-1 prompt 2000", bench_transformers, hf,
                                                    [long_], args.decode_tokens, args.repeats),
            "concurrent8_aggregate_decode_tokens_per_s": phase(bar, "transformers 8 concurrent", bench_transformers,
                                                               hf, concurrent, args.decode_tokens, 1),
        }
    llama_cpp = {} if skip_llama_cpp else phase(bar, "llama.cpp", bench_llama_cpp, model_path, short, long_,
                                                     concurrent, args)
    bar.close()
    ratios = {k: ours[k] / peer[k] for k in peer if k in ours and peer[k] > 0}
    ratios.update({f"{k}_vs_llama_cpp": ours[k] / v for k, v in llama_cpp.items()
                   if k in ours and isinstance(v, float) and v > 0})
    ratios["concurrent8_vs_our_batch1"] = ours["concurrent8_aggregate_decode_tokens_per_s"] / ours["batch1_prompt128_tokens_per_s"]
    ratios["batch1_prompt128_fraction_of_bandwidth_bound"] = ours["batch1_prompt128_tokens_per_s"] / bound
    result = {
        "benchmark": "decode",
        "machine": machine_info(),
        "model": str(model_path),
        "settings": {"dtype": args.dtype, "gemm_dtype": args.gemm_dtype or args.dtype, "decode_tokens": args.decode_tokens, "repeats": args.repeats, "threads": args.threads,
                     "device": args.device},
        "weight_bytes_per_step": weight_bytes,
        "measured_read_bandwidth_gib_per_s": read_bw / 2**30,
        "bandwidth_bound_tokens_per_s": bound,
        "ours": ours,
        "gemm_plan_padding": padding,
        "transformers": peer,
        "llama_cpp": llama_cpp,
        "ratios": ratios,
        "targets": {"batch1_vs_transformers": 2.0, "concurrent8_vs_our_batch1": 4.0},
    }
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "decode.json", result)
    _plot(result, out_dir / "decode.png")
    return result


def _plot(result: dict, path: Path) -> None:
    plt = pyplot()
    keys = [k for k in result["ours"] if k in result["transformers"]] or list(result["ours"])
    labels = [k.replace("_tokens_per_s", "").replace("_", "\n") for k in keys]
    xs = range(len(keys))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    peers = [(name, result[key]) for name, key in (("transformers", "transformers"), ("llama.cpp", "llama_cpp"))
             if any(isinstance(result.get(key, {}).get(k), float) for k in keys)]
    width = 0.8 / (1 + len(peers))
    ax.bar([x - 0.4 + width / 2 for x in xs], [result["ours"][k] for k in keys], width=width, label="dhisparse")
    for i, (name, figures) in enumerate(peers, start=1):
        ax.bar([x - 0.4 + width * (i + 0.5) for x in xs], [figures.get(k, 0) for k in keys], width=width, label=name)
    ax.axhline(result["bandwidth_bound_tokens_per_s"], color="gray", linestyle="--", label="batch-1 bandwidth bound")
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("decode tokens/s")
    gemm = result["settings"].get("gemm_dtype", result["settings"]["dtype"])
    ax.set_title(f"Decode throughput ({result['settings']['dtype']}, {gemm} matmuls, {result['machine']['cpu_count']} cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dhisparse bench decode", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--gemm-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="our projections' matmul precision (default: --dtype); transformers stays at --dtype")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]: ours and transformers on that device")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--skip-llama-cpp", action="store_true")
    parser.add_argument("--out", default=None, help="output folder (default results/<date>-<machine>/)")
    args = parser.parse_args([a for a in (argv or []) if a != "--"] if argv is not None else None)
    result = run(args)
    print(f"bandwidth bound {result['bandwidth_bound_tokens_per_s']:.1f} tok/s "
          f"({result['measured_read_bandwidth_gib_per_s']:.1f} GiB/s read, {result['weight_bytes_per_step'] / 2**20:.0f} MiB/step)")
    for key, value in result["ours"].items():
        peer = result["transformers"].get(key)
        peer_s = f"  transformers {peer:7.1f}  ratio {value / peer:4.2f}x" if peer else ""
        lcpp = result["llama_cpp"].get(key)
        lcpp_s = f"  llama.cpp {lcpp:7.1f}  ratio {value / lcpp:4.2f}x" if isinstance(lcpp, float) else ""
        print(f"{key:50s} ours {value:7.1f}{peer_s}{lcpp_s}")
    if "unavailable" in result["llama_cpp"]:
        print(f"llama.cpp not measured: {result['llama_cpp']['unavailable']}")
    for key, value in result["ratios"].items():
        print(f"{key:50s} {value:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
