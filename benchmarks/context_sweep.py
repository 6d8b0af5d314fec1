"""Decode throughput vs context length, dense vs sparse attention, batch 1, one run.

The context is not prefilled token by token: a dense prefill of 32K tokens takes minutes on two
cores and measures prefill, not decode. Instead one real 1,024-token prompt is prefilled, and
its K/V pages are replicated into the measured request's pages up to the target length (digests
sealed for sparse attention), then the request decodes. Decode cost depends on how many pages
are read, not on their values, so this measures decode throughput faithfully; the tokens it
produces are meaningless, and beyond the model's trained context (8K for SmolLM2) RoPE
positions are out of range anyway: throughput only.

llama.cpp (optional extra, ``benchmarks/peers/llama_cpp.py``) decodes the same token sequence
after a real prefill, on the GGUF's quantized weights: its dense decode is the peer row.

Run: ``python -m benchmarks.context_sweep`` (writes ``context_sweep.json`` / ``.png``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.peers.llama_cpp import PeerUnavailable
from benchmarks.plotting import pyplot
from benchmarks.progress import echo, phase, progress

SOURCE_TOKENS = 1024


def _fill_context(engine, source_slots: list[int], prompt_ids: list[int], decode_tokens: int) -> str:
    """Queues a request whose first ``len(prompt_ids) - 1`` tokens are already "computed": its
    pages hold copies of the source pages. Returns its request id."""
    from dhisparse import SamplingParams
    from services.decoder.engine.request import RequestStatus

    rid = engine.add_request(prompt_ids, SamplingParams(max_tokens=decode_tokens, ignore_eos=True))
    request = engine.requests[rid]
    scheduler = engine.scheduler
    scheduler.waiting.remove(request)
    num_pages = -(-len(prompt_ids) // engine.config.page_size)
    request.slots = engine.allocator.allocate(num_pages)
    src = torch.tensor([source_slots[i % len(source_slots)] for i in range(num_pages)])
    dst = torch.tensor(request.slots)
    pool = engine.pool
    digests = engine.runner.attention.digests
    num_full = (len(prompt_ids) - 1) // engine.config.page_size
    if digests is not None:
        request.digest_rows = digests.allocate(num_pages)
    for layer in range(pool.num_layers):
        pool.k[layer][dst] = pool.k[layer][src]
        pool.v[layer][dst] = pool.v[layer][src]
        if digests is not None:
            digests.seal(layer, pool.k[layer], dst[:num_full], torch.tensor(request.digest_rows[:num_full]))
    request.num_computed_tokens = len(prompt_ids) - 1
    request.status = RequestStatus.RUNNING
    scheduler.running.append(request)
    return rid


def measure(loaded, attention: str, context_len: int, decode_tokens: int, top_k_tokens: int,
            page_score: str = "center") -> float:
    """Decode tok/s of one request at ``context_len`` (first step excluded)."""
    from dhisparse import LLM, SamplingParams

    capacity = -(-(context_len + decode_tokens + 2 * SOURCE_TOKENS) // 16) * 16
    llm = LLM(loaded=loaded, attention=attention, top_k_tokens=top_k_tokens, page_score=page_score, max_model_len=capacity,
              kv_cache_tokens=capacity, allow_long_context=True, max_num_batched_tokens=SOURCE_TOKENS)
    engine = llm.engine
    source_ids = _source_ids(loaded)
    source_rid = engine.add_request(source_ids, SamplingParams(max_tokens=decode_tokens + context_len, ignore_eos=True))
    engine.step()  # one step: the whole source prompt is prefilled (budget = SOURCE_TOKENS)
    source_slots = list(engine.requests[source_rid].slots)[: SOURCE_TOKENS // engine.config.page_size]
    prompt_ids = _context_ids(source_ids, context_len)
    rid = _fill_context(engine, source_slots, prompt_ids, decode_tokens)
    engine.abort(source_rid)  # frees its pages only after the copies were made
    engine.step()  # first decode step (warm-up)
    t0 = time.perf_counter()
    steps = 0
    while not engine.requests[rid].is_finished:
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - t0
    assert engine.check_integrity()
    return steps / elapsed


def measure_llama_cpp(model_path, prompt_ids: list[int], decode_tokens: int, threads: int) -> float:
    """llama.cpp's batch-1 decode tok/s after prefilling ``prompt_ids`` (raises PeerUnavailable)."""
    from benchmarks.peers.llama_cpp import LlamaCppPeer

    with LlamaCppPeer(model_path, len(prompt_ids) + decode_tokens + 16, threads=threads) as peer:
        return peer.decode_tokens_per_s([prompt_ids], decode_tokens + 1)


def _source_ids(loaded) -> list[int]:
    """The real prompt (``SOURCE_TOKENS`` tokens) whose pages fill every context."""
    words = ["river", "stone", "signal", "paper", "orbit", "lantern", "maple", "copper", "cloud", "alpha"]
    text = " ".join(f"{words[(i * 7) % len(words)]}{i % 17}" for i in range(2 * SOURCE_TOKENS))
    return loaded.tokenizer.encode(text)[:SOURCE_TOKENS]


def _context_ids(source_ids: list[int], context_len: int) -> list[int]:
    """The token sequence decoded after: the source prompt repeated to ``context_len``."""
    return [source_ids[i % SOURCE_TOKENS] for i in range(context_len)]


def main(argv: list[str] | None = None) -> int:
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    parser = argparse.ArgumentParser(prog="python -m benchmarks.context_sweep", description=__doc__.split("\n")[0])
    parser.add_argument("--contexts", default="1024,4096,8192,16384,32768")
    parser.add_argument("--decode-tokens", type=int, default=24)
    parser.add_argument("--top-k-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--page-score", choices=["center", "quest"], default="center")
    parser.add_argument("--skip-llama-cpp", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_path = resolve_model_path(None)
    loaded = load_model(model_path)
    llama_cpp = {"unavailable": "--skip-llama-cpp"} if args.skip_llama_cpp else {}
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = []
    bar = progress(desc="context_sweep", total=2 * len(contexts), unit="run")
    for context_len in contexts:
        dense = phase(bar, f"{context_len} dense", measure, loaded, "dense", context_len, args.decode_tokens,
                      args.top_k_tokens)
        sparse = phase(bar, f"{context_len} sparse", measure, loaded, "sparse", context_len, args.decode_tokens,
                       args.top_k_tokens, args.page_score)
        row = {"context_len": context_len, "dense_tokens_per_s": dense, "sparse_tokens_per_s": sparse,
               "sparse_vs_dense": sparse / dense,
               "beyond_trained_context": context_len > loaded.config.max_position_embeddings}
        if "unavailable" not in llama_cpp:
            try:
                bar.set_postfix_str(f"{context_len} llama.cpp")
                peer = measure_llama_cpp(model_path, _context_ids(_source_ids(loaded), context_len),
                                         args.decode_tokens, args.threads)
                row.update(llama_cpp_dense_tokens_per_s=peer, dense_vs_llama_cpp=dense / peer,
                           sparse_vs_llama_cpp=sparse / peer)
            except PeerUnavailable as exc:
                llama_cpp["unavailable"] = str(exc)
        rows.append(row)
        peer_s = f"  llama.cpp {row['llama_cpp_dense_tokens_per_s']:6.1f} tok/s" if "llama_cpp_dense_tokens_per_s" in row else ""
        echo(f"context {context_len:6d}: dense {dense:6.1f} tok/s  sparse {sparse:6.1f} tok/s  "
             f"ratio {sparse / dense:4.2f}x{peer_s}")
    bar.close()
    by_len = {r["context_len"]: r for r in rows}
    targets = {}
    if 32768 in by_len:
        targets["sparse_vs_dense_at_32k>=3"] = by_len[32768]["sparse_vs_dense"] >= 3.0
    if 1024 in by_len:
        targets["sparse_vs_dense_at_1k>=0.95"] = by_len[1024]["sparse_vs_dense"] >= 0.95
    result = {
        "benchmark": "context_sweep",
        "machine": machine_info(),
        "model": loaded.config.name or str(loaded.source),
        "settings": {"decode_tokens": args.decode_tokens, "top_k_tokens": args.top_k_tokens, "sink_pages": 1,
                     "recent_pages": 4, "page_score": args.page_score, "threads": args.threads, "dtype": "float32", "batch": 1,
                     "context_fill": f"pages replicated from a real {SOURCE_TOKENS}-token prefill"},
        "rows": rows,
        "llama_cpp": llama_cpp or {"weights": "the GGUF's own quantization (llama.cpp kernels)", "fill": "real prefill"},
        "targets": targets,
    }
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "context_sweep.json", result)
    _plot(rows, out_dir / "context_sweep.png", loaded.config.max_position_embeddings)
    for name, ok in targets.items():
        print(f"{name}: {'PASS' if ok else 'FAIL'}")
    return 0


def _plot(rows: list[dict], path: Path, trained_len: int) -> None:
    plt = pyplot()

    xs = [r["context_len"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(xs, [r["dense_tokens_per_s"] for r in rows], "o-", label="dense")
    ax.plot(xs, [r["sparse_tokens_per_s"] for r in rows], "s-", label="sparse (top-k 2048 tokens)")
    peer = [(r["context_len"], r["llama_cpp_dense_tokens_per_s"]) for r in rows if "llama_cpp_dense_tokens_per_s" in r]
    if peer:
        ax.plot(*zip(*peer), "^--", label="llama.cpp dense (quantized GGUF)")
    ax.axvline(trained_len, color="gray", linestyle=":", label="trained context (beyond: throughput only)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens")
    ax.set_ylabel("batch-1 decode tokens/s")
    ax.set_title("Decode throughput vs context, dense vs sparse (fp32, CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
