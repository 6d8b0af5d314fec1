"""``python -m benchmarks.soak``: see ``benchmarks/soak/__init__.py``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.soak import __doc__ as DOC
from benchmarks.soak.run import SoakConfig, plot, run_soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=DOC.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=SoakConfig.num_clients)
    parser.add_argument("--max-rss-growth-mib", type=float, default=SoakConfig.max_rss_growth_mib)
    parser.add_argument("--max-decoder-rss-growth-mib", type=float, default=SoakConfig.max_decoder_rss_growth_mib)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="output folder (default results/<date>-<machine>/soak)")
    args = parser.parse_args(argv)
    duration_s = args.minutes * 60
    cfg = SoakConfig(duration_s=duration_s, num_clients=args.clients, max_rss_growth_mib=args.max_rss_growth_mib,
                     max_decoder_rss_growth_mib=args.max_decoder_rss_growth_mib,
                     seed=args.seed, warmup_s=min(60.0, duration_s / 5), window_s=min(60.0, duration_s / 5))
    from benchmarks.machine import machine_info, results_dir, write_json

    out_dir = Path(args.out) if args.out else results_dir() / "soak"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_soak(cfg)
    result["machine"] = machine_info()
    write_json(out_dir / "soak.json", result)
    plot(result, out_dir / "soak.png")
    for name, check in result["checks"].items():
        print(f"{'ok  ' if check['ok'] else 'FAIL'} {name}")
    print(f"requests {result['requests']}, tokens {result['tokens']}; "
          f"RSS growth (MiB) { {n: g['growth_mib'] for n, g in result['rss_growth'].items()} }; wrote {out_dir}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
