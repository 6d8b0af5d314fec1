"""What the model's projections cost per row count, per CPU GEMM kernel, on the real weights.

A decode step at concurrency c runs every projection (q|k|v, o, gate|up, down, the LM head) on c
rows; a verify step on c x (draft tokens + 1). ``model/linear.py`` has several kernels for that
product and ``model/gemm_plan.py`` picks one per row count, measured on this machine at start-up.
This benchmark times, over all of the model's projections in model order (weights streamed from
DRAM as in a step), side by side in one run:

- ``planned``: the project's ``Linear`` as the model runs it (its measured plan);
- ``f_linear``, ``mm_w_xt``, ``mkl_pack`` (4-64 rows, padded to its bucket), ``onednn``: each
  kernel on its own (``model/linear.py``);

and records each one's largest deviation from ``F.linear`` on the LM head (fp32 summation order
only), and the plan.

    python -m benchmarks.linear_rows [--rows 1,2,3,4,8,16] [--repeats 7] [--name NAME]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from benchmarks.machine import machine_info, results_dir, write_json
from services.decoder.model.gemm_plan import pass_inputs, pass_seconds
from services.decoder.model.linear import KERNELS, available_kernels

CANDIDATES = ("planned", *KERNELS)


def _kernel(name: str) -> str | None:
    """The kernel a candidate runs (None: the layer's own plan)."""
    return None if name == "planned" else name


def time_candidates(layers: list, rows: list[int], repeats: int, seed: int = 0) -> list[dict]:
    """``[{rows, <candidate>_ms, <candidate>_max_abs_diff}]``: median ms of one pass over ``layers``
    at each row count (candidates that can run there), and the deviation from ``F.linear`` on the
    last layer; inputs ``[rows, in_features]`` drawn once per row count."""
    gen = torch.Generator().manual_seed(seed)
    results = []
    for num_rows in rows:
        inputs = pass_inputs(layers, num_rows, gen)
        row = {"rows": num_rows}
        runnable = set.intersection(*(set(available_kernels(lyr.weight, num_rows)) for lyr in layers)) | {"planned"}
        for name in (c for c in CANDIDATES if c in runnable):
            kernel = _kernel(name)
            pass_seconds(layers, inputs, kernel)  # warm-up: weight copies built, pages touched
            row[f"{name}_ms"] = statistics.median(pass_seconds(layers, inputs, kernel) for _ in range(repeats)) * 1e3
            probe = layers[-1]
            x = inputs[probe.weight.shape[1]]
            y = probe(x) if kernel is None else probe.run(x, kernel)
            row[f"{name}_max_abs_diff"] = float((y - F.linear(x, probe.weight, probe.bias)).abs().max())
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
    model = LlamaModel(loaded.config, loaded.weights)  # its GEMM plan measured (or read) for this machine
    projections = model.projections
    rows = time_candidates(projections, [int(r) for r in args.rows.split(",")], args.repeats)
    for r in rows:
        print(f"rows {r['rows']:3d}: " + "  ".join(f"{n} {r[f'{n}_ms']:6.1f} ms" for n in CANDIDATES if f"{n}_ms" in r))
    print(f"plan: {model.gemm_plan.describe()}")
    path = write_json(results_dir() / f"{args.name}.json",
                      {"benchmark": "linear_rows", "machine": machine_info(), "model": str(loaded.source),
                       "weight_bytes": sum(lyr.weight_bytes for lyr in projections),
                       "threads": args.threads, "repeats": args.repeats, "gemm_plan": model.gemm_plan.to_json(),
                       "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
