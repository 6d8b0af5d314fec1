"""Runs the soak: starts the stack, runs the workload, samples RSS, checks, stops the stack, plots."""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from benchmarks.soak.probes import (
    SERVICES,
    gateway_metric,
    rss_mib,
    service_pids,
    wait_idle,
)
from benchmarks.soak.workload import SoakConfig, Tally, client, warm_up

__all__ = ["SoakConfig", "plot", "rss_growth", "run_soak"]


def _sample_rss(pids: dict[str, int], t0: float, series: dict, stop: threading.Event, interval_s: float) -> None:
    while not stop.is_set():
        t = round(time.monotonic() - t0, 2)
        for name, pid in pids.items():
            try:
                vm, private = rss_mib(pid)
            except (OSError, KeyError):
                continue
            series.setdefault(name, []).append((t, round(vm, 2), round(private, 2)))
        stop.wait(interval_s)


def rss_growth(series: list, warmup_s: float, window_s: float, end_s: float) -> dict:
    """Median private RSS of the last ``window_s`` minus that of ``[warmup_s, warmup_s + window_s]``."""
    base = [p for t, _, p in series if warmup_s <= t <= warmup_s + window_s]
    last = [p for t, _, p in series if t >= end_s - window_s]
    if not base or not last:
        return {"baseline_mib": None, "end_mib": None, "growth_mib": None, "peak_mib": None}
    b, e = statistics.median(base), statistics.median(last)
    return {"baseline_mib": round(b, 2), "end_mib": round(e, 2), "growth_mib": round(e - b, 2),
            "peak_mib": max(p for _, _, p in series), "peak_vmrss_mib": max(v for _, v, _ in series)}


def run_soak(cfg: SoakConfig, workdir: Path | None = None, log=print) -> dict:
    """Starts the stack, runs the workload, checks, stops the stack; returns the result dict."""
    from dhisparse.stack import LocalStack, StackOptions, free_port

    instance = f"soak-{uuid.uuid4().hex[:8]}"
    options = StackOptions(instance=instance, gateway_port=free_port(), decoder_port=free_port(),
                           kvtier_port=free_port(), kvtier=True, kvtier_pool_gib=cfg.kvtier_pool_gib,
                           workdir=workdir, env={"DHISPARSE_DECODER_MAX_NUM_WAITING": str(cfg.max_num_waiting),  # no CLI flags
                                "DHISPARSE_DECODER_MAX_MODEL_LEN": str(cfg.max_model_len)},
                           decoder_args=["--threads", "1", "--kv-cache-tokens", str(cfg.kv_cache_tokens),
                                         "--max-num-seqs", str(cfg.max_num_seqs)])
    stack = LocalStack(options).start(log=lambda _m: None)
    checks: dict[str, dict] = {}
    tally, series, stop_sampling = Tally(), {}, threading.Event()
    try:
        pids = service_pids(stack)
        warm_up_s = warm_up(stack.url, cfg)
        t0 = time.monotonic()
        sampler = threading.Thread(target=_sample_rss, args=(pids, t0, series, stop_sampling, cfg.sample_interval_s),
                                   daemon=True)
        sampler.start()
        stop_at = t0 + cfg.duration_s
        clients = [threading.Thread(target=client, args=(stack.url, cfg, i, t0, stop_at, tally), daemon=True)
                   for i in range(cfg.num_clients)]
        for c in clients:
            c.start()
        for c in clients:
            c.join(timeout=cfg.duration_s + 600)
        checks["clients_finished"] = {"ok": not any(c.is_alive() for c in clients)}
        end_s = time.monotonic() - t0
        stop_sampling.set()
        sampler.join()
        log(f"workload done after {end_s:.0f} s: {dict(tally.counts)}")
        d, k, keys = wait_idle(stack)
        checks["kvtier_integrity"] = {"ok": k.integrity_checked and k.integrity_ok, "detail": k.integrity_detail}
        checks["decoder_idle"] = {"ok": d.num_running == 0 and d.num_waiting == 0, "num_running": d.num_running,
                                  "num_waiting": d.num_waiting}
        checks["decoder_slots_free"] = {"ok": d.num_free_slots == d.num_total_slots,
                                        "free": d.num_free_slots, "total": d.num_total_slots}
        checks["kvtier_pages_free"] = {"ok": k.num_used_pages == 0 and k.num_requests == 0
                                       and k.num_free_pages == k.num_host_pages,
                                       "used": k.num_used_pages, "free": k.num_free_pages,
                                       "total": k.num_host_pages, "requests": k.num_requests}
        checks["no_request_keys"] = {"ok": not keys, "leftover": keys[:20]}
        in_flight = gateway_metric(stack.url, "dhisparse_gateway_requests_in_flight")
        checks["gateway_idle"] = {"ok": in_flight == 0, "in_flight": in_flight}
        checks["no_unexpected_answers"] = {"ok": tally.counts["error"] == 0 and tally.counts["greedy_mismatch"] == 0,
                                           "errors": tally.counts["error"], "problems": tally.problems}
        checks["services_alive"] = {"ok": all(p.poll() is None for p in stack.processes.values()),
                                    "exit_codes": {n: p.poll() for n, p in stack.processes.items()}}
        growth = {n: rss_growth(s, cfg.warmup_s, cfg.window_s, end_s) for n, s in series.items()}
        bounds = {n: cfg.max_decoder_rss_growth_mib if n == "decoder" else cfg.max_rss_growth_mib for n in growth}
        over = {n: g["growth_mib"] for n, g in growth.items() if g["growth_mib"] is None or g["growth_mib"] >= bounds[n]}
        checks["rss_growth"] = {"ok": set(growth) == set(SERVICES) and not over, "bounds_mib": bounds, "over": over}
        decoder_summary = {"num_requests_finished": d.num_requests_finished,
                           "num_generated_tokens": d.num_generated_tokens, "num_prompt_tokens": d.num_prompt_tokens}
    finally:
        stop_sampling.set()
        stack.stop()
    leftover_shm = sorted(p.name for p in Path("/dev/shm").iterdir() if instance in p.name)
    checks["no_shm_segment"] = {"ok": not leftover_shm, "leftover": leftover_shm}
    alive = [n for n, pid in pids.items() if Path(f"/proc/{pid}").exists()
             and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]
    checks["no_service_process"] = {"ok": not alive, "alive": alive}
    return {"config": asdict(cfg), "instance": instance, "duration_s": round(end_s, 1),
            "warm_up_s": round(warm_up_s, 1),
            "requests": {k: tally.counts[k] for k in ("ok", "cancelled", "429", "error", "greedy_mismatch")},
            "tokens": {"completion": tally.completion_tokens, "prompt": tally.prompt_tokens,
                       "completion_per_s": round(tally.completion_tokens / end_s, 2)},
            "decoder": decoder_summary, "rss_growth": growth, "checks": checks,
            "ok": all(c["ok"] for c in checks.values()), "rss_series": series, "timeline": tally.timeline}


def plot(result: dict, path: Path) -> None:
    from benchmarks.plotting import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for name, points in sorted(result["rss_series"].items()):
        g = result["rss_growth"][name]
        growth = f"{g['growth_mib']:+.1f} MiB" if g["growth_mib"] is not None else "n/a"
        axes[0].plot([p[0] for p in points], [p[2] for p in points], label=f"{name} ({growth})")
    cfg = result["config"]
    axes[0].axvspan(cfg["warmup_s"], cfg["warmup_s"] + cfg["window_s"], color="grey", alpha=0.15, label="baseline")
    axes[0].set_yscale("log")
    for outcome in ("ok", "cancelled", "429"):
        times = [t for t, o in result["timeline"] if o == outcome]
        axes[1].plot(times, range(1, len(times) + 1), label=outcome)
    for ax, label in zip(axes, ("RSS without shared memory (MiB)", "requests (cumulative)")):
        ax.set_xlabel("time (s)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    verdict = "all checks passed" if result["ok"] else "FAILED: " + ", ".join(
        n for n, c in result["checks"].items() if not c["ok"])
    fig.suptitle(f"soak: {result['duration_s']:.0f} s, {cfg['num_clients']} clients, "
                 f"{result['requests']['ok']} ok / {result['requests']['cancelled']} cancelled / "
                 f"{result['requests']['429']} x 429; {verdict}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
