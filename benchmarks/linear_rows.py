"""What the model's projections cost per row count, per candidate CPU kernel, on the real weights.

A decode step at concurrency c runs every projection (q|k|v, o, gate|up, down, the LM head) on c
rows; a verify step on c x (draft tokens + 1). ``model/linear.py`` picks one kernel per row count
(plain ``F.linear`` for 1-3 rows, MKL packs for 4-64), measured on the Intel machines. This
benchmark times, over all of the model's projections in model order (weights streamed from DRAM
as in a step), each candidate at each row count, side by side in one run:

- ``linear``: the project's ``Linear`` as the model runs it;
- ``f_linear``: plain ``F.linear(x, W)``;
- ``mm_w_xt``: ``torch.mm(W, x.T).T`` (the same product laid out as a tall-skinny GEMM);
- ``mm_w_xt_min2``: the same with one row padded to two (a one-column GEMM may run as a slower GEMV);

and records each candidate's largest deviation from ``F.linear`` on the LM head (fp32 summation
order only).

    python -m benchmarks.linear_rows [--rows 1,2,3,4,8,16] [--repeats 7] [--name NAME]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.machine import machine_info, results_dir, write_json


def _mm_w_xt(layer, x: torch.Tensor, min_rows: int = 1) -> torch.Tensor:
    num_rows = x.shape[0]
    if num_rows < min_rows:
        x = F.pad(x, (0, 0, 0, min_rows - num_rows))
    y = torch.mm(layer.weight, x.t()).t()[:num_rows]
    return y if layer.bias is None else y + layer.bias


CANDIDATES: dict[str, Callable] = {
    "linear": lambda layer, x: layer(x),
    "f_linear": lambda layer, x: F.linear(x, layer.weight, layer.bias),
    "mm_w_xt": _mm_w_xt,
    "mm_w_xt_min2": lambda layer, x: _mm_w_xt(layer, x, min_rows=2),
}


def model_projections(model) -> list:
    """Every ``Linear`` of a ``LlamaModel`` in the order a step runs them (LM head last)."""
    out = []
    for layer in model.layers:
        out += [layer.qkv, layer.o_proj, layer.gate_up, layer.down]
    return out + [model.lm_head]


def time_candidates(layers: list, rows: list[int], repeats: int, seed: int = 0) -> list[dict]:
    """``[{rows, <candidate>_ms, <candidate>_max_abs_diff}]``: median ms of one pass over ``layers``
    at each row count, and the deviation from ``F.linear`` on the last layer; inputs
    ``[rows, in_features]`` drawn once per row count."""
    gen = torch.Generator().manual_seed(seed)
    results = []
    for num_rows in rows:
        inputs = {n: torch.randn(num_rows, n, generator=gen) for n in {lyr.weight.shape[1] for lyr in layers}}
        row = {"rows": num_rows}
        for name, fn in CANDIDATES.items():
            def one_pass(fn=fn):
                for lyr in layers:
                    fn(lyr, inputs[lyr.weight.shape[1]])
            one_pass()  # warm-up: packs built, pages touched
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                one_pass()
                seconds.append(time.perf_counter() - start)
            row[f"{name}_ms"] = statistics.median(seconds) * 1e3
            probe = layers[-1]
            x = inputs[probe.weight.shape[1]]
            row[f"{name}_max_abs_diff"] = float((fn(probe, x) - F.linear(x, probe.weight, probe.bias)).abs().max())
        results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.linear_rows", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,3,4,8,16")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="linear_rows")
    args = parser.parse_args(argv)
    from services.decoder.model.llama import LlamaModel
    from services.decoder.model.loader import load_model
    from services.decoder.model.model_store import resolve_model_path

    torch.set_num_threads(args.threads)
    loaded = load_model(resolve_model_path(None))
    projections = model_projections(LlamaModel(loaded.config, loaded.weights))
    rows = time_candidates(projections, [int(r) for r in args.rows.split(",")], args.repeats)
    for r in rows:
        print(f"rows {r['rows']:3d}: " + "  ".join(f"{n} {r[f'{n}_ms']:6.1f} ms" for n in CANDIDATES))
    path = write_json(results_dir() / f"{args.name}.json",
                      {"benchmark": "linear_rows", "machine": machine_info(), "model": str(loaded.source),
                       "weight_bytes": sum(lyr.weight_bytes for lyr in projections),
                       "threads": args.threads, "repeats": args.repeats, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
