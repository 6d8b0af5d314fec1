"""CLI: project every model x mode x speculation, print the table, write JSON and a PNG."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from benchmarks.h200_projection import constants as C
from benchmarks.h200_projection.modes import (
    curve_for,
    dense_fit,
    pcie_break_even,
    project_all,
)
from benchmarks.h200_projection.shapes import MODELS
from benchmarks.h200_projection.traces import load_trace
from benchmarks.plotting import pyplot

GB = 1e9


def all_constants() -> dict:
    """Every module-level constant of ``constants`` (the named assumptions), by name."""
    out = {}
    for name, value in vars(C).items():
        if name.isupper():
            out[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def project(hw: C.Hardware, wl: C.Workload, trace, model_keys) -> dict:
    spec_on = C.Speculation(gamma=trace.gamma, acceptance_length=trace.acceptance_length,
                            working_set_union_factor=trace.working_set_union_factor)
    rows, break_even, fits = [], {}, {}
    for key in model_keys:
        shape = MODELS[key]
        fits[shape.name] = {
            "dense_fit_concurrency": dense_fit(shape, hw, wl),
            "resident_weight_gb": shape.resident_weight_bytes / GB,
            "kv_gb_per_request": wl.context_pages * shape.kv_bytes_per_page(wl.page_size) / GB,
            "digest_gb_per_request": wl.context_pages * shape.digest_bytes_per_page(wl.digest_bytes_per_value) / GB,
        }
        for label, spec in (("off", C.NO_SPECULATION), ("on", spec_on)):
            curve = curve_for(trace, wl, spec)
            for p in project_all(shape, hw, wl, spec, curve):
                rows.append({"model": shape.name, "speculation": label, **p.as_dict(spec)})
            break_even[f"{shape.name} / spec {label}"] = pcie_break_even(shape, hw, wl, spec, curve)
    return {"rows": rows, "pcie_break_even": break_even, "fits": fits, "speculation_on": spec_on.as_dict()}


def format_table(result: dict) -> str:
    head = (f"{'model':<30} {'mode':<15} {'spec':<4} {'conc':>4} {'full':>4} {'buf':>5} {'hit':>5} "
            f"{'step ms':>8} {'bound':>7} {'tok/s':>9} {'TPOT ms':>8}")
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        tpot = f"{r['tpot_ms']:8.2f}" if r["tpot_ms"] is not None else f"{'-':>8}"
        flag = "" if r["fits_target"] else "  (target does not fit)"
        lines.append(
            f"{r['model'][:30]:<30} {r['mode']:<15} {r['speculation']:<4} {r['concurrency']:>4} {r['num_full']:>4} "
            f"{r['buffer_pages']:>5} {r['hit_rate']:>5.2f} {r['step_ms']:>8.2f} {r['bottleneck']:>7} "
            f"{r['tokens_per_s']:>9.0f} {tpot}{flag}")
    lines.append("")
    for name, be in result["pcie_break_even"].items():
        if be.get("buffer_pages") is None:
            lines.append(f"PCIe break-even, {name}: none ({be.get('reason')})")
        else:
            if not be["pcie_bound_at_working_set_buffer"]:
                lines.append(f"PCIe break-even, {name}: not PCIe-bound even at the working-set buffer "
                             f"({be['buffer_pages']} pages/request)")
                continue
            lines.append(
                f"PCIe break-even, {name}: {be['buffer_pages']} pages/request "
                f"({be['buffer_over_working_set']:.2f}x working set, hit {be['hit_rate']:.3f}); "
                f"{'fits' if be['fits'] else 'does NOT fit'} in HBM (max buffer that fits: "
                f"{be['max_buffer_pages_that_fit']} pages)")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> bool:
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    series = [(m, s) for m in ("dense-resident", "always-sparse", "adaptive") for s in ("off", "on")]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(series)
    for i, (mode, spec) in enumerate(series):
        rows = [next((r for r in result["rows"] if r["model"] == m and r["mode"] == mode and r["speculation"] == spec),
                     None) for m in models]
        ys = [r["tokens_per_s"] if r else 0 for r in rows]
        bars = ax.bar([x + (i - len(series) / 2 + 0.5) * width for x in range(len(models))], ys, width=width,
                      label=f"{mode}, spec {spec}", hatch="//" if spec == "on" else None)
        ax.bar_label(bars, [f"n={r['concurrency']}" if r else "" for r in rows], fontsize=6)
    ax.set_xticks(range(len(models)), [m.replace(" (", "\n(") for m in models], fontsize=8)
    ax.set_ylabel("tokens/s (projected, one H200; n = concurrency that fits)")
    wl = result["workload"]
    ax.set_title(f"H200 projection: {wl['context_tokens']:,}-token context x {wl['num_requests']} requests "
                 f"({'trace' if result['trace']['source'] else 'ASSUMED hit/acceptance'})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.h200_projection", description=__doc__)
    p.add_argument("--trace", default="auto",
                   help="JSON trace from CPU runs (see traces.py); 'auto' (default): selection_trace.json in the "
                        "output directory if `bench selection_trace` wrote one there; 'none': ASSUMED defaults")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {sorted(MODELS)}")
    p.add_argument("--context-tokens", type=int, default=C.CONTEXT_TOKENS)
    p.add_argument("--num-requests", type=int, default=C.NUM_REQUESTS)
    p.add_argument("--hbm-usable-fraction", type=float, default=C.HBM_USABLE_FRACTION)
    p.add_argument("--digest-bytes", type=int, default=C.DIGEST_BYTES_PER_VALUE, help="2 = bf16 digests, 1 = fp8")
    p.add_argument("--no-overlap", action="store_true", help="PCIe copies do not overlap HBM/compute work")
    p.add_argument("--out", default=None, help="output directory (default results/<date>-<machine>/)")
    p.add_argument("--no-plot", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    from benchmarks.machine import machine_info, results_dir, write_json

    args = build_parser().parse_args(argv)
    hw = C.Hardware(hbm_usable_fraction=args.hbm_usable_fraction, pcie_overlapped=not args.no_overlap)
    wl = C.Workload(context_tokens=args.context_tokens, num_requests=args.num_requests,
                    digest_bytes_per_value=args.digest_bytes)
    out = Path(args.out) if args.out else results_dir()
    trace_path = args.trace
    if trace_path == "auto":
        trace_path = out / "selection_trace.json" if (out / "selection_trace.json").is_file() else None
    elif trace_path == "none":
        trace_path = None
    trace = load_trace(trace_path, wl.context_tokens)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in MODELS]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; choose from {sorted(MODELS)}")

    result = {
        "benchmark": "h200_projection",
        "kind": "PROJECTION (first-principles model, not a measurement)",
        "machine": machine_info(),
        "constants": all_constants(),
        "hardware": hw.as_dict(),
        "workload": {**wl.as_dict(), "context_pages": wl.context_pages, "selected_pages": wl.selected_pages},
        "trace": trace.as_dict(),
        "assumed_inputs": sorted(k for k, v in trace.provenance.items() if v.startswith("ASSUMED")),
        "shapes": {MODELS[k].name: MODELS[k].as_dict() for k in keys},
        **project(hw, wl, trace, keys),
    }
    print(format_table(result))
    assumed = result["assumed_inputs"]
    if trace.source:
        print(f"\ntrace: {trace.source}; page counts: {trace.scaling or 'no hit-rate curve in the trace'}")
    if assumed:
        print(f"ASSUMED (no --trace value): {', '.join(assumed)}")
    out.mkdir(parents=True, exist_ok=True)
    path = write_json(out / "h200_projection.json", result)
    print(f"wrote {path}")
    if not args.no_plot and plot(result, out / "h200_projection.png"):
        print(f"wrote {out / 'h200_projection.png'}")
    return 0

