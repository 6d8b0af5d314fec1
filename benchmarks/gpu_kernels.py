"""On a CUDA machine: sparse vs dense decode attention at 100K tokens, and page transfer between a
registered shared-memory host pool and a device hot pool vs a plain memcpy, measured in one run.

    python -m benchmarks.gpu_kernels [--out DIR] [--context-tokens N] [--batch B] [--host-pages P]

Attention (Llama-3-8B shapes: 32 q heads, 8 kv heads, head_dim 128, bf16, 16-token pages), one
decode token per request, every request at ``context_tokens``:
- ``sparse``: ``page_select`` (the center score over every page's box-center digest, as the
  decoder keeps it; top-k 2048 tokens + sink + recent) plus ``sparse_paged_attention`` over the
  selected pages, i.e. one layer's decode attention;
- ``full_pages``: the same attention kernel over every page (what sparse saves);
- ``sdpa_dense``: torch SDPA (flash backend) over a contiguous [B, 8, T, 128] cache, the dense
  baseline a plain engine would run.
Transfer (the decoder's byte path, ``design.md``): pages of a POSIX shm host pool in kvtier's layout,
page-locked with cudaHostRegister, copied by ``gather_pages`` (scattered ids, one call per layer
and K/V as ``HostTier`` does) vs one contiguous ``copy_`` of the same bytes.
Writes ``DIR/gpu_kernels.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import numpy as np
import torch
import triton.testing

from kernels import gather_pages, page_select, sparse_paged_attention
from services.kvtier.host_pool import HostPool, HostPoolLayout

HEADS, KV_HEADS, HEAD_DIM, PAGE, LAYERS = 32, 8, 128, 16, 32


def _ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=10, rep=60))


def attention(batch: int, context_tokens: int, top_k_tokens: int, dev: torch.device = torch.device("cuda"),
              sweep_configs: bool = False) -> dict:
    dt = torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    pages = -(-context_tokens // PAGE)
    k_pool = torch.randn(batch * pages, PAGE, KV_HEADS, HEAD_DIM, device=dev, generator=gen, dtype=dt)
    v_pool = torch.randn(batch * pages, PAGE, KV_HEADS, HEAD_DIM, device=dev, generator=gen, dtype=dt)
    q = torch.randn(batch, HEADS, HEAD_DIM, device=dev, generator=gen, dtype=dt)
    k_view = k_pool.view(batch, pages, PAGE, KV_HEADS, HEAD_DIM)
    d_min, d_max = k_view.amin(dim=2), k_view.amax(dim=2)  # [batch, pages, kv_heads, head_dim]
    center = ((d_min.float() + d_max.float()) / 2).to(dt)  # the decoder's center digest
    req = torch.arange(batch, device=dev, dtype=torch.int32)
    pos = torch.full((batch,), context_tokens - 1, device=dev, dtype=torch.int32)
    scale = HEAD_DIM**-0.5
    # the decoder's default page score (center: estimated attention mass)
    sel_kw = dict(top_k_pages=top_k_tokens // PAGE, sink_pages=1, recent_pages=4, page_size=PAGE, score="center")

    def select():
        return page_select(q, None, None, req, pos, digest_center=center, check_indices=False, **sel_kw)[0]

    def attend(sel):
        slots = torch.where(sel >= 0, sel + req[:, None] * pages, -1)
        return sparse_paged_attention(q, k_pool, v_pool, slots, sel, pos, scale=scale, check_indices=False)

    def sparse():
        return attend(select())

    all_pages = torch.arange(pages, device=dev, dtype=torch.int32).expand(batch, pages).contiguous()
    all_slots = all_pages + req[:, None] * pages

    def full_pages():
        return sparse_paged_attention(q, k_pool, v_pool, all_slots, all_pages, pos, scale=scale, check_indices=False)

    tokens = pages * PAGE
    k_dense = k_pool.view(batch, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)  # [B, kvh, T, hd] strided
    v_dense = v_pool.view(batch, tokens, KV_HEADS, HEAD_DIM).transpose(1, 2)
    k_dense, v_dense = k_dense.contiguous(), v_dense.contiguous()
    q4 = q.view(batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)  # a kv head's query heads as its query rows

    def sdpa_dense():  # flash-decoding form: no mask, no GQA expansion, flash-eligible
        return torch.nn.functional.scaled_dot_product_attention(q4, k_dense, v_dense, scale=scale)

    # correctness on this data: full_pages == SDPA over the same keys (the cache holds exactly
    # `tokens` keys; positions beyond context_tokens are masked by the paged kernel, so use tokens)
    diff = float((full_pages().float() - sdpa_dense().view(batch, HEADS, HEAD_DIM).float()).abs().max()) \
        if tokens == context_tokens else None
    sel = select()
    times = {"sparse_ms": _ms(sparse), "select_ms": _ms(select), "attend_selected_ms": _ms(lambda: attend(sel)),
             "full_pages_ms": _ms(full_pages), "sdpa_dense_ms": _ms(sdpa_dense)}
    selected = int((sel >= 0).sum())
    sweep = _sweep_attention(q, k_pool, v_pool, sel, req, pos, pages, scale) if sweep_configs else None
    page_bytes = 2 * PAGE * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
    return {
        "batch": batch, "context_tokens": context_tokens, "top_k_tokens": top_k_tokens,
        **{k: round(v, 4) for k, v in times.items()},
        "sparse_vs_sdpa_speedup": round(times["sdpa_dense_ms"] / times["sparse_ms"], 2),
        "sparse_vs_full_pages_speedup": round(times["full_pages_ms"] / times["sparse_ms"], 2),
        "full_pages_gb_per_s": round(batch * pages * page_bytes / times["full_pages_ms"] / 1e6, 1),
        "sdpa_gb_per_s": round(batch * pages * page_bytes / times["sdpa_dense_ms"] / 1e6, 1),
        "selected_pages_per_token": selected / batch,
        "full_pages_vs_sdpa_max_abs_diff": diff,
        "sweep": sweep,
    }


SWEEP = [(4, 32, 4), (4, 16, 4), (4, 64, 4), (8, 32, 4), (8, 64, 8), (2, 16, 4), (4, 32, 8), (8, 128, 8)]


def _sweep_attention(q, k_pool, v_pool, sel, req, pos, pages: int, scale: float) -> list[dict]:
    """The Triton launcher at several (pages_per_block, pages_per_split, num_warps) on the selected
    pages and on every page; each output checked against the fp32 torch reference."""
    from kernels.sparse_paged_attention import reference, triton as tri

    slots = torch.where(sel >= 0, sel + req[:, None] * pages, -1)
    batch = q.shape[0]
    all_pages = torch.arange(pages, device=q.device, dtype=torch.int32).expand(batch, pages).contiguous()
    all_slots = all_pages + req[:, None] * pages
    cases = {"selected": (slots, sel), "all_pages": (all_slots, all_pages)}
    want = {name: reference.sparse_paged_attention(q, k_pool, v_pool, s_, p_, pos, scale=scale, page_size=PAGE)
            for name, (s_, p_) in cases.items()}
    rows = []
    for ppb, pps, warps in SWEEP:
        row = {"pages_per_block": ppb, "pages_per_split": pps, "num_warps": warps}
        for name, (s_, p_) in cases.items():
            fn = lambda s_=s_, p_=p_: tri.sparse_paged_attention(  # noqa: E731
                q, k_pool, v_pool, s_, p_, pos, scale=scale, page_size=PAGE,
                pages_per_block=ppb, pages_per_split=pps, num_warps=warps)
            try:
                row[f"{name}_max_abs_diff"] = float((fn().float() - want[name].float()).abs().max())
                row[f"{name}_ms"] = round(_ms(fn), 4)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is recorded
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def transfer(host_pages: int, pages_per_batch: int) -> dict:
    layout = HostPoolLayout("bfloat16", LAYERS, KV_HEADS, HEAD_DIM, PAGE, host_pages)
    host = HostPool.create(f"dhisparse-gpu-bench-{os.getpid()}", layout)
    raw = torch.from_numpy(np.frombuffer(host._mapped(), dtype=np.uint8))
    ptr = raw.data_ptr()
    err = int(torch.cuda.cudart().cudaHostRegister(ptr, raw.numel(), 0))
    try:
        if err != 0:
            raise RuntimeError(f"cudaHostRegister failed with error {err}")
        return _transfer(raw, layout, pages_per_batch)
    finally:
        torch.cuda.synchronize()
        if err == 0:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        del raw
        gc.collect()  # every view of the mapping must be gone before it is unmapped
        host.unlink()


def _transfer(raw: torch.Tensor, layout: HostPoolLayout, pages_per_batch: int) -> dict:
    host_pages = layout.num_host_pages
    pool = raw.view(torch.bfloat16).view(host_pages, LAYERS, 2, PAGE, KV_HEADS, HEAD_DIM)
    num_slots = 2 * pages_per_batch
    hot_k = [torch.randn(num_slots, PAGE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
             for _ in range(LAYERS)]
    hot_v = [t.clone() for t in hot_k]
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(num_slots, generator=gen)[:pages_per_batch].cuda()
    ids = torch.randperm(host_pages, generator=gen)[:pages_per_batch].cuda()

    def write_back():
        for layer in range(LAYERS):
            gather_pages(hot_k[layer], pool[:, layer, 0], slots, ids, check_indices=False)
            gather_pages(hot_v[layer], pool[:, layer, 1], slots, ids, check_indices=False)

    def fetch():
        for layer in range(LAYERS):
            gather_pages(pool[:, layer, 0], hot_k[layer], ids, slots, check_indices=False)
            gather_pages(pool[:, layer, 1], hot_v[layer], ids, slots, check_indices=False)

    num_bytes = pages_per_batch * layout.host_page_bytes
    dev_flat = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    host_flat = raw[:num_bytes]
    times = {
        "write_back_ms": _ms(write_back), "fetch_ms": _ms(fetch),
        "memcpy_d2h_ms": _ms(lambda: host_flat.copy_(dev_flat, non_blocking=True)),
        "memcpy_h2d_ms": _ms(lambda: dev_flat.copy_(host_flat, non_blocking=True)),
    }
    write_back()
    torch.cuda.synchronize()
    exact = torch.equal(pool[ids[0].item(), 5, 1], hot_v[5][slots[0].item()].cpu())
    gib = {k.replace("_ms", "_gib_per_s"): round(num_bytes / (v * 1e-3) / 2**30, 2) for k, v in times.items()}
    return {
        "host_pages": host_pages, "pages_per_batch": pages_per_batch, "bytes_per_batch": num_bytes,
        "byte_exact": exact, **{k: round(v, 4) for k, v in times.items()}, **gib,
        "write_back_vs_memcpy": round(times["memcpy_d2h_ms"] / times["write_back_ms"], 3),
        "fetch_vs_memcpy": round(times["memcpy_h2d_ms"] / times["fetch_ms"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kernels", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "results/gpu"))
    parser.add_argument("--context-tokens", type=int, nargs="+", default=[32_768, 102_400])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--top-k-tokens", type=int, default=2048)
    parser.add_argument("--host-pages", type=int, default=512, help="2 MiB host pages in the shm segment")
    parser.add_argument("--pages-per-batch", type=int, default=256)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "attention": [], "transfer": None}
    for tokens in args.context_tokens:
        row = attention(args.batch, tokens, args.top_k_tokens, sweep_configs=tokens == max(args.context_tokens))
        report["attention"].append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    try:
        report["transfer"] = transfer(args.host_pages, args.pages_per_batch)
    except Exception as exc:  # noqa: BLE001 - recorded; the attention rows still count
        report["transfer"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(report["transfer"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_kernels.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
