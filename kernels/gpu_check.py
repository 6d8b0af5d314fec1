"""Every Triton kernel against its torch reference on production shapes, with timings.

    python -m kernels.gpu_check [--out DIR] [--dry-run]

On a CUDA machine: Llama-8B-like shapes (32 q heads, 8 kv heads, head_dim 128, page 16,
100K-token contexts, top-k 2048 tokens), batch-32 decode and batch-8 x 8-token verify. Prints
max-abs-diffs and ``triton.testing.do_bench`` timings, writes ``DIR/gpu_check.json`` and exits 1
on any mismatch. ``--dry-run`` runs the same checks on a tiny config with CPU tensors (the Triton
launchers under ``TRITON_INTERPRET=1``, single timed calls) to prove the script itself works.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    context_tokens: int = 100_000
    top_k_tokens: int = 2048
    sink_pages: int = 1
    recent_pages: int = 4
    decode_batch: int = 32
    verify_batch: int = 8
    verify_len: int = 8
    num_slots: int = 32768  # hot-pool slots per layer
    host_pages: int = 8192  # pinned host pool pages for the copy check
    copy_pages: int = 1024  # pages per copy call
    dtype: torch.dtype = torch.bfloat16

    @property
    def max_pages(self) -> int:
        return -(-self.context_tokens // self.page_size)

    @property
    def top_k_pages(self) -> int:
        return self.top_k_tokens // self.page_size


TINY = CheckConfig(
    num_heads=4, num_kv_heads=2, head_dim=32, context_tokens=700, top_k_tokens=128,
    decode_batch=3, verify_batch=2, verify_len=3, num_slots=96, host_pages=40, copy_pages=7,
)


class Checker:
    """Runs checks, times them and collects one JSON record per check."""

    def __init__(self, cfg: CheckConfig, device: torch.device, dry_run: bool):
        self.cfg, self.device, self.dry_run = cfg, device, dry_run
        self.records: list[dict] = []
        self.gen = torch.Generator(device=device).manual_seed(0)

    def bench_ms(self, fn: Callable[[], object]) -> float:
        if self.dry_run:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=50))

    def record(self, op: str, case: str, ok: bool, *, triton_fn=None, reference_fn=None, **metrics) -> None:
        rec = {"op": op, "case": case, "ok": bool(ok), **metrics}
        if triton_fn is not None:
            rec["triton_ms"] = round(self.bench_ms(triton_fn), 4)
        if reference_fn is not None:
            rec["reference_ms"] = round(self.bench_ms(reference_fn), 4)
        self.records.append(rec)
        shown = " ".join(f"{k}={v}" for k, v in rec.items() if k not in ("op", "case", "ok"))
        print(f"[{'ok' if ok else 'MISMATCH'}] {op:24s} {case:14s} {shown}", flush=True)

    def randn(self, *shape, dtype=None) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, device=self.device).to(dtype or self.cfg.dtype)

    def tokens(self, layout: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(token_req, token_pos, batch) for 'decode' or 'verify'; requests end near the context."""
        cfg = self.cfg
        batch, per_req = (cfg.decode_batch, 1) if layout == "decode" else (cfg.verify_batch, cfg.verify_len)
        last = cfg.context_tokens - 1 - torch.arange(batch, device=self.device) * 37 % cfg.page_size * 5
        req = torch.arange(batch, device=self.device).repeat_interleave(per_req)
        pos = last[req] - (per_req - 1) + torch.arange(per_req, device=self.device).repeat(batch)
        return req.to(torch.int32), pos.to(torch.int32), batch


def _digests(ck: Checker, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = ck.cfg
    a = ck.randn(batch, cfg.max_pages, cfg.num_kv_heads, cfg.head_dim)
    b = ck.randn(batch, cfg.max_pages, cfg.num_kv_heads, cfg.head_dim)
    return torch.minimum(a, b), torch.maximum(a, b)


def check_page_digest(ck: Checker) -> None:
    from kernels.page_digest import reference, triton as tri

    cfg = ck.cfg
    k_pool = ck.randn(cfg.num_slots, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
    for case, num_pages in (("decode_seal", cfg.decode_batch), ("bulk", min(cfg.num_slots, 8192))):
        slots = torch.randperm(cfg.num_slots, generator=ck.gen, device=ck.device)[:num_pages].to(torch.int32)
        rows = torch.arange(num_pages, device=ck.device, dtype=torch.int32)
        shape = (num_pages, cfg.num_kv_heads, cfg.head_dim)
        outs = [torch.zeros(shape, dtype=cfg.dtype, device=ck.device) for _ in range(4)]
        reference.page_digest_into(k_pool, slots, outs[0], outs[1], rows)
        tri.page_digest_into(k_pool, slots, outs[2], outs[3], rows)
        ok = torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
        ck.record("page_digest", case, ok, num_pages=num_pages,
                  triton_fn=lambda: tri.page_digest_into(k_pool, slots, outs[2], outs[3], rows),
                  reference_fn=lambda: reference.page_digest_into(k_pool, slots, outs[0], outs[1], rows))


def _unexplained_mismatches(got, want, ref_scores, top_k: int) -> tuple[int, int]:
    """(#tokens whose selection differs, #of those not explained by a near-tie at the k-th score)."""
    diff_rows = (got != want).any(dim=1).nonzero().flatten().tolist()
    unexplained = 0
    for t in diff_rows:
        scores = ref_scores[t]
        finite = scores[torch.isfinite(scores)]
        kth = torch.sort(finite, descending=True).values[min(top_k, finite.numel()) - 1]
        pages = set(got[t].tolist()) ^ set(want[t].tolist())
        tol = 1e-4 * float(finite.abs().max())
        if any(abs(float(scores[p]) - float(kth)) > tol for p in pages if p >= 0):
            unexplained += 1
    return len(diff_rows), unexplained


def check_page_select(ck: Checker, layout: str, score: str) -> dict:
    from kernels.page_select import reference, triton as tri

    cfg = ck.cfg
    req, pos, batch = ck.tokens(layout)
    q = ck.randn(req.numel(), cfg.num_heads, cfg.head_dim)
    d_min, d_max = _digests(ck, batch)
    # what the decoder passes: min/max for Quest, the stored box centers for the center score
    pair, extra = (d_min, d_max), {}
    if score == "center":
        pair, extra = (None, None), {"digest_center": reference.box_center(d_min, d_max).to(d_min.dtype)}
    bounds = dict(sink_pages=cfg.sink_pages, recent_pages=cfg.recent_pages, page_size=cfg.page_size, score=score,
                  **extra)
    kw = dict(top_k_pages=cfg.top_k_pages, **bounds)
    want = reference.page_select(q, *pair, req, pos, **kw)
    got = tri.page_select(q, *pair, req, pos, **kw)
    ref_scores = reference.page_scores(q, *pair, req, pos, **bounds)
    tri_scores = tri.page_scores(q, *pair, req, pos, **bounds)
    finite = torch.isfinite(ref_scores)
    score_diff = float((ref_scores[finite] - tri_scores[finite]).abs().max())
    n_diff, n_bad = _unexplained_mismatches(got[0], want[0], ref_scores, cfg.top_k_pages)
    alone = tri.page_scores(q[-1:], *pair, req[-1:], pos[-1:], **bounds)  # batch invariance
    ok = n_bad == 0 and torch.equal(got[1], want[1]) and torch.equal(alone[0], tri_scores[-1])
    ck.record("page_select", f"{layout}/{score}", ok, num_tokens=req.numel(), max_score_diff=score_diff,
              tie_flips=n_diff, unexplained=n_bad,
              triton_fn=lambda: tri.page_select(q, *pair, req, pos, **kw),
              reference_fn=lambda: reference.page_select(q, *pair, req, pos, **kw))
    return {"req": req, "pos": pos, "batch": batch, "selected": want[0]}


def _slots_of(ck: Checker, req: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """A fixed scattered slot per (request, page); -1 on padding."""
    slots = (pages.long() * 7919 + req.long()[:, None] * 104729) % ck.cfg.num_slots
    return torch.where(pages >= 0, slots, -1).to(torch.int32)


def check_attention(ck: Checker, layout: str, sel: dict, dtype: torch.dtype) -> None:
    from kernels.sparse_paged_attention import reference, triton as tri

    cfg = ck.cfg
    k_pool = ck.randn(cfg.num_slots, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype)
    v_pool = ck.randn(cfg.num_slots, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=dtype)
    q = ck.randn(sel["req"].numel(), cfg.num_heads, cfg.head_dim, dtype=dtype)
    pages = sel["selected"]
    slots = _slots_of(ck, sel["req"], pages)
    args = (q, k_pool, v_pool, slots, pages, sel["pos"])
    kw = dict(scale=cfg.head_dim**-0.5, page_size=cfg.page_size)
    want = reference.sparse_paged_attention(*args, **kw)
    got = tri.sparse_paged_attention(*args, **kw)
    diff = float((got.float() - want.float()).abs().max())
    tol = 5e-5 if dtype == torch.float32 else 2e-2  # fp32 order of summation; bf16 output rounding
    ck.record("sparse_paged_attention", f"{layout}_{str(dtype)[6:]}", diff <= tol,
              max_abs_diff=diff, max_sel=pages.shape[1],
              triton_fn=lambda: tri.sparse_paged_attention(*args, **kw),
              reference_fn=lambda: reference.sparse_paged_attention(*args, **kw))
    del k_pool, v_pool


def _working_sets(sel: dict, max_pages: int) -> torch.Tensor:
    """[batch, max_ws] union of each request's token selections, ascending, -1 padded."""
    batch = sel["batch"]
    marks = torch.zeros(batch, max_pages + 1, dtype=torch.bool, device=sel["selected"].device)
    pages = torch.where(sel["selected"] >= 0, sel["selected"].long(), max_pages)
    marks[sel["req"].long()[:, None].expand_as(pages), pages] = True
    marks[:, max_pages] = False
    width = int(marks.sum(1).max())
    ids = torch.where(marks, torch.arange(max_pages + 1, device=marks.device), torch.iinfo(torch.int64).max)
    ws = torch.sort(ids, dim=1).values[:, :width]
    return torch.where(ws < max_pages, ws, -1).to(torch.int32)


def check_resolve_residency(ck: Checker, layout: str, sel: dict) -> None:
    from kernels.resolve_residency import reference, triton as tri

    cfg = ck.cfg
    ws = _working_sets(sel, cfg.max_pages)
    batch, max_ws = ws.shape
    capacity = 2 * max_ws
    slot_of_page = torch.full((batch, cfg.max_pages), -1, dtype=torch.int32, device=ck.device)
    lru = torch.full((batch, capacity), -1, dtype=torch.int32, device=ck.device)
    free = torch.full((batch, capacity), -1, dtype=torch.int32, device=ck.device)
    num_held = capacity - max_ws // 4  # few free slots: most misses must evict
    for r in range(batch):  # state setup only: random buffered pages, the rest of the buffer free
        held = torch.randperm(cfg.max_pages, generator=ck.gen, device=ck.device)[:num_held]
        buffer = torch.arange(r * capacity, (r + 1) * capacity, device=ck.device, dtype=torch.int32)
        lru[r, : held.numel()] = held.to(torch.int32)
        slot_of_page[r, held] = buffer[: held.numel()]
        free[r, : capacity - held.numel()] = buffer[held.numel():]
    args = (ws, slot_of_page, lru, free)
    want, want_over = reference.resolve_residency(*args)
    got, got_over = tri.resolve_residency(*args)
    ok = torch.equal(want_over, got_over) and not bool(want_over.any())
    ok = ok and all(torch.equal(a, b) for a, b in zip(want, got))
    ck.record("resolve_residency", layout, ok, batch=batch, max_ws=max_ws,
              misses=int(want.num_misses.sum()), victims=int(want.num_victims.sum()),
              triton_fn=lambda: tri.resolve_residency(*args),
              reference_fn=lambda: reference.resolve_residency(*args))


def check_gather_pages(ck: Checker) -> None:
    from kernels.gather_pages import reference, triton as tri

    cfg = ck.cfg
    page_shape = (2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)  # K and V of one layer
    host = torch.randn((cfg.host_pages, *page_shape)).to(cfg.dtype)
    if ck.device.type == "cuda":
        host = host.pin_memory()
    hot = torch.zeros((cfg.num_slots, *page_shape), dtype=cfg.dtype, device=ck.device)
    n = cfg.copy_pages
    src_idx = torch.randperm(cfg.host_pages)[:n].to(torch.int32)
    dst_idx = torch.randperm(cfg.num_slots)[:n].to(torch.int32)
    page_bytes = host[0].numel() * host.element_size()
    cases = (("host_to_hot", host, hot, src_idx, dst_idx), ("hot_to_host", hot, host, dst_idx, src_idx))
    for case, src, dst, s_idx, d_idx in cases:
        s_dev, d_dev = s_idx.to(ck.device), d_idx.to(ck.device)
        if case == "hot_to_host":
            src.copy_(torch.randn(src.shape, device=ck.device).to(cfg.dtype))
        tri.gather_pages(src, dst, s_dev, d_dev)
        want = src[s_idx.long().to(src.device)].to(dst.device)
        ok = torch.equal(reference.as_bits(dst[d_idx.long().to(dst.device)]), reference.as_bits(want))
        ms = ck.bench_ms(lambda: tri.gather_pages(src, dst, s_dev, d_dev))
        ck.record("gather_pages", case, ok, pages=n, triton_ms=round(ms, 4),
                  gib_per_s=round(n * page_bytes / (ms * 1e-3) / 2**30, 2))


def check_api_dispatch(ck: Checker) -> None:
    """Each public function on small device tensors (CUDA: the Triton path, with validation)
    against the same call on CPU copies (the reference path)."""
    import kernels

    gen = torch.Generator().manual_seed(1)
    dev = ck.device
    k_pool = torch.randn(12, 16, 2, 32, generator=gen)
    q = torch.randn(5, 4, 32, generator=gen)
    d_lo = torch.randn(2, 9, 2, 32, generator=gen)
    d_hi = d_lo + torch.rand(2, 9, 2, 32, generator=gen)
    req = torch.tensor([0, 1, 1, 0, 1], dtype=torch.int32)
    pos = torch.tensor([140, 100, 101, 60, 143], dtype=torch.int32)
    cfg = dict(top_k_pages=3, sink_pages=1, recent_pages=2)
    slots = torch.tensor([3, 0, 11], dtype=torch.int32)
    slots_dst = torch.tensor([2, 0, 3], dtype=torch.int32)
    ws = torch.tensor([[1, 4, 6, -1], [0, 2, -1, -1]], dtype=torch.int32)
    sop = torch.full((2, 9), -1, dtype=torch.int32)
    sop[0, 4], sop[0, 7], sop[1, 3] = 20, 21, 22
    lru = torch.tensor([[7, 4, -1, -1], [3, -1, -1, -1]], dtype=torch.int32)
    free = torch.tensor([[23, -1, -1, -1], [24, 25, -1, -1]], dtype=torch.int32)

    def run(device: torch.device) -> list[torch.Tensor]:
        to = lambda t: t.to(device)  # noqa: E731
        sel, num = kernels.page_select(to(q), to(d_lo), to(d_hi), to(req), to(pos), **cfg)
        pages = torch.where(sel >= 0, sel % 12, -1)
        out = kernels.sparse_paged_attention(
            to(q), to(k_pool), to(k_pool), pages, sel, to(pos), scale=32**-0.5
        )
        plan = kernels.resolve_residency(to(ws), to(sop), to(lru), to(free))
        dst = kernels.gather_pages(k_pool.pin_memory() if device.type == "cuda" else k_pool,
                                   torch.zeros(4, 16, 2, 32, device=device), to(slots), to(slots_dst))
        return [*kernels.page_digest(to(k_pool), to(slots)), sel, num, out, *plan, dst]

    got = [t.cpu() for t in run(dev)]
    want = run(torch.device("cpu"))
    diff = max(float((g.float() - w.float()).abs().max()) if g.numel() else 0.0 for g, w in zip(got, want))
    ok = all(g.shape == w.shape and g.dtype == w.dtype for g, w in zip(got, want)) and diff <= 1e-5
    ck.record("api_dispatch", str(dev), ok, max_abs_diff=diff)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernels.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "results/gpu"), help="output directory")
    parser.add_argument("--dry-run", action="store_true", help="tiny config, CPU tensors, Triton interpreter")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any triton import
        cfg, device = TINY, torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: use --dry-run on CPU", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 references stay fp32
        cfg, device = CheckConfig(), torch.device("cuda")
    ck = Checker(cfg, device, args.dry_run)
    started = time.perf_counter()

    def guarded(op: str, case: str, fn: Callable[[], object]) -> object:
        """One failing check (compile error, launch error) is recorded; the others still run."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - reported in the JSON, exit code 1
            ck.records.append({"op": op, "case": case, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            print(f"[ERROR] {op} {case}: {type(exc).__name__}: {exc}", flush=True)
            return None

    guarded("page_digest", "all", lambda: check_page_digest(ck))
    for layout in ("decode", "verify"):
        # the decoder's default score last: its selection feeds the attention and residency checks
        for score in ("quest", "center"):
            sel = guarded("page_select", f"{layout}/{score}", lambda: check_page_select(ck, layout, score))
        if sel is None:
            continue
        for dtype in (cfg.dtype, torch.float32):
            guarded("sparse_paged_attention", layout, lambda: check_attention(ck, layout, sel, dtype))
        guarded("resolve_residency", layout, lambda: check_resolve_residency(ck, layout, sel))
    guarded("gather_pages", "all", lambda: check_gather_pages(ck))
    guarded("api_dispatch", "all", lambda: check_api_dispatch(ck))
    ok = all(r["ok"] for r in ck.records)
    report = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        "dry_run": args.dry_run,
        "config": {k: str(v) for k, v in dataclasses.asdict(cfg).items()},
        "seconds": round(time.perf_counter() - started, 1),
        "ok": ok,
        "checks": ck.records,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    print(f"{'all checks passed' if ok else 'MISMATCH'} in {report['seconds']} s -> {out / 'gpu_check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
