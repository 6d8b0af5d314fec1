"""Concurrency at a fixed hot budget: how the residency policies share a hot pool too small for
the requests' KV (real kvtier process, real weights, real text).

For each policy (``always-full``, ``adaptive``, ``always-sparse``) and each concurrency c, c
requests of ``--prompt-tokens`` tokens of CPython stdlib source arrive together and generate
``--max-tokens`` tokens each (greedy). Reported per run: wall time, aggregate output tok/s, mean
TPOT, most requests running at once, SPARSE buffer hit rate, bytes copied host -> hot per output
token (buffer misses, swap-ins), demotions / promotions / preemptions. Writes
``results/<date>-<machine>/residency.json`` and ``residency.png``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.machine import machine_info, results_dir, write_json
from benchmarks.plotting import pyplot
from benchmarks.progress import echo, progress
from benchmarks.sparse_quality.tasks import stdlib_documents
from services.metadata.redis_server import RedisServer

POLICIES = ("always-full", "adaptive", "always-sparse")
LAYOUT = {"num-layers": 30, "num-kv-heads": 3, "head-dim": 64, "page-size": 16, "dtype": "float32"}


class Kvtier:
    """``python -m services.kvtier`` on a free port over an embedded Redis, for one run."""

    def __init__(self, redis_url: str, host_pool_pages: int, instance: str):
        args = [sys.executable, "-m", "services.kvtier", "--instance", instance, "--namespace", f"bench{os.getpid()}",
                "--port", "0", "--redis-url", redis_url, "--host-pool-pages", str(host_pool_pages)]
        for name, value in LAYOUT.items():
            args += [f"--{name}", str(value)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().split()
        if line[:2] != ["kvtier", "ready"]:
            self.proc.kill()
            raise RuntimeError(f"kvtier did not start: {line}")
        self.address = line[3]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def run_one(loaded, kvtier: Kvtier, policy: str, prompts: list[list[int]], args) -> dict:
    from dhisparse import LLM, SamplingParams

    llm = LLM(loaded=loaded, kvtier_address=kvtier.address, decoder_id=f"bench-{policy}-{len(prompts)}",
              residency=policy, attention="sparse", top_k_tokens=args.top_k_tokens, sink_pages=1, recent_pages=2,
              kv_cache_tokens=args.hot_tokens, max_model_len=args.prompt_tokens + args.max_tokens + 16,
              max_num_batched_tokens=512, max_num_seqs=64)
    engine = llm.engine
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    # warm-up (not timed): the decode batch sizes of this run pack their GEMM weights once
    llm.generate([p[:64] for p in prompts], SamplingParams(max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    max_running = 0
    while engine.has_unfinished():
        engine.step()
        max_running = max(max_running, len(engine.scheduler.running))
    wall_s = time.perf_counter() - start
    requests = [engine.pop_finished(i) for i in ids]
    stats = [r.stats.as_dict(len(r.output_ids)) for r in requests]
    out_tokens = sum(len(r.output_ids) for r in requests)
    hits = sum(s["num_buffer_hits"] for s in stats)
    misses = sum(s["num_buffer_misses"] for s in stats)
    page_layer_bytes = 2 * 16 * 3 * 64 * 4  # K and V of one page of one layer, fp32
    fetched = misses * page_layer_bytes + sum(s["num_swapped_in_pages"] for s in stats) * 30 * page_layer_bytes
    fetched += engine.controller.num_fetched_pages * 30 * page_layer_bytes
    engine.check_integrity()
    engine.close()
    tpots = [1 / s["decode_tokens_per_s"] for s in stats if s["decode_tokens_per_s"] > 0]
    return {
        "policy": policy, "concurrency": len(prompts), "wall_s": round(wall_s, 2),
        "output_tokens_per_s": round(out_tokens / wall_s, 2),
        "mean_tpot_ms": round(1e3 * sum(tpots) / len(tpots), 1) if tpots else None,
        "max_running": max_running,
        "buffer_hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
        "host_to_hot_bytes_per_output_token": round(fetched / out_tokens),
        "demotions": sum(s["num_demotions"] for s in stats), "promotions": sum(s["num_promotions"] for s in stats),
        "preemptions": sum(s["num_preemptions"] for s in stats),
    }


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy in POLICIES:
        mine = [r for r in rows if r["policy"] == policy]
        conc = [r["concurrency"] for r in mine]
        axes[0].plot(conc, [r["output_tokens_per_s"] for r in mine], marker="o", label=policy)
        axes[1].plot(conc, [r["max_running"] for r in mine], marker="o", label=policy)
    axes[0].set(xlabel="requests submitted together", ylabel="aggregate output tok/s", xscale="log", title="throughput")
    axes[1].set(xlabel="requests submitted together", ylabel="most running at once", xscale="log",
                title="admission (fixed hot budget)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.residency", description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--hot-tokens", type=int, default=10240, help="hot pool (the fixed budget), tokens")
    parser.add_argument("--top-k-tokens", type=int, default=512)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    loaded = load_model(resolve_model_path(None))
    docs = stdlib_documents(loaded.tokenizer, args.prompt_tokens, max(args.concurrency))
    if len(docs) < max(args.concurrency):
        parser.error(f"only {len(docs)} stdlib documents have {args.prompt_tokens} tokens")
    host_pages = max(args.concurrency) * -(-(args.prompt_tokens + args.max_tokens) // 16) + 64
    # SIGTERM unwinds like Ctrl-C, so the `finally` blocks stop kvtier and Redis (no stray process or segment)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = []
    bar = progress(desc="residency", total=len(POLICIES) * len(args.concurrency), unit="run")
    with tempfile.TemporaryDirectory(prefix="dhs-bench-redis-") as directory:
        redis = RedisServer(directory=directory).start()
        try:
            for policy in POLICIES:
                for conc in args.concurrency:
                    bar.set_postfix_str(f"{policy} c={conc}")
                    kvtier = Kvtier(redis.url, host_pages, f"{policy}-{conc}")
                    try:
                        row = run_one(loaded, kvtier, policy, [ids for _, ids in docs[:conc]], args)
                    finally:
                        kvtier.stop()
                    rows.append(row)
                    bar.update()
                    echo(str(row))
        finally:
            bar.close()
            redis.stop()

    def tput(policy: str, conc: int) -> float:
        return next(r["output_tokens_per_s"] for r in rows if r["policy"] == policy and r["concurrency"] == conc)

    low = [c for c in args.concurrency if c <= 2]
    high = max(args.concurrency)
    targets = {
        "adaptive_vs_full_at_low_load": {c: round(tput("adaptive", c) / tput("always-full", c), 3) for c in low},
        "adaptive_vs_sparse_at_high_load": round(tput("adaptive", high) / tput("always-sparse", high), 3),
        "full_admission_wall": max(r["max_running"] for r in rows if r["policy"] == "always-full"),
    }
    result = {"benchmark": "residency", "machine": machine_info(), "settings": vars(args) | {"host_pages": host_pages},
              "runs": rows, "targets": targets}
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "residency.json", result)
    plot(rows, out_dir / "residency.png")
    print(targets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
