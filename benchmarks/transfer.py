"""Page transfer between the decoder's hot pool and the kvtier host pool (POSIX shared memory),
against a plain memcpy of the same bytes into the same segment, measured in one run.

- write-back: sealed pages, hot pool -> their host pages (every layer, K and V), as
  ``HostTier.write_back`` does it (``kv/page_copy.py``: on CPU one strided copy per page);
- fetch: host pages -> hot slots, as a swap-in does it;
- memcpy: one contiguous ``copy_`` of the same number of bytes into / out of the segment.
Pages are scattered (random slots and host ids), as in a running engine. Layout: the default
model (30 layers, 3 kv heads, head_dim 64, fp32, 16-token pages: 737,280 bytes per page).
Writes ``results/<date>-<machine>/transfer.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.machine import machine_info, results_dir, write_json
from services.decoder.kv import page_copy
from services.decoder.kv.hot_pool import HotPool
from services.kvtier.host_pool import HostPool, HostPoolLayout


def _best_seconds(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _measure(host: HostPool, layout: HostPoolLayout, args: argparse.Namespace) -> tuple[dict, int]:
    """Best-of-N seconds of each transfer of ``args.pages`` scattered pages."""
    raw = torch.from_numpy(np.frombuffer(host._mapped(), dtype=np.uint8))
    pool = raw.view(torch.float32).view(args.host_pages, 30, 2, 16, 3, 64)
    hot = HotPool(30, args.pages * 2, 16, 3, 64)
    hot.storage.normal_()
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(args.pages * 2, generator=gen)[: args.pages].tolist()
    host_ids = torch.randperm(args.host_pages, generator=gen)[: args.pages].tolist()

    def write_back():  # as HostTier.write_back does it
        page_copy.to_host(hot.storage, pool, slots, host_ids)

    def fetch():  # as HostTier.fetch (a swap-in) does it
        page_copy.from_host(pool, hot.storage, host_ids, slots)

    num_bytes = args.pages * layout.host_page_bytes
    contiguous = torch.empty(num_bytes // 4, dtype=torch.float32).normal_()
    host_flat = raw[:num_bytes].view(torch.float32)

    def memcpy_in():
        host_flat.copy_(contiguous)

    def memcpy_out():
        contiguous.copy_(host_flat)

    seconds = {name: _best_seconds(fn, args.repeats) for name, fn in
               (("write_back", write_back), ("fetch", fetch), ("memcpy_to_shm", memcpy_in),
                ("memcpy_from_shm", memcpy_out))}
    write_back()
    assert torch.equal(pool[host_ids[0], 7, 0], hot.k[7][slots[0]]), "write-back moved the wrong bytes"
    return seconds, num_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.transfer", description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=256, help="pages moved per batch")
    parser.add_argument("--host-pages", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    layout = HostPoolLayout("float32", 30, 3, 64, 16, args.host_pages)
    segment = f"dhisparse-bench-transfer-{os.getpid()}"
    host = HostPool.create(segment, layout)
    try:
        seconds, num_bytes = _measure(host, layout, args)
    finally:
        gc.collect()  # tensor views of the mapping must be gone before it can be unmapped
        host.unlink()
    gib_s = {name: num_bytes / s / 2**30 for name, s in seconds.items()}
    ratios = {"write_back_vs_memcpy": gib_s["write_back"] / gib_s["memcpy_to_shm"],
              "fetch_vs_memcpy": gib_s["fetch"] / gib_s["memcpy_from_shm"]}
    result = {"benchmark": "transfer", "machine": machine_info(),
              "settings": {"pages": args.pages, "page_bytes": layout.host_page_bytes, "bytes_per_batch": num_bytes,
                           "repeats": args.repeats, "threads": torch.get_num_threads()},
              "gib_per_s": gib_s, "ratios": ratios, "targets": {k: v >= 0.7 for k, v in ratios.items()}}
    out_dir = Path(args.out) if args.out else results_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "transfer.json", result)
    for name, value in gib_s.items():
        print(f"{name:16s} {value:6.2f} GiB/s")
    for name, value in ratios.items():
        print(f"{name:22s} {value:.2f} ({'PASS' if value >= 0.7 else 'FAIL'} >= 0.70)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
