"""``python -m services.decoder.service [--port N] [--redis-url URL] ...``: run one decoder.

Flags override ``DecoderConfig`` fields (which env vars ``DHISPARSE_DECODER_*`` also set).
``--probe HOST:PORT`` checks a running decoder's health instead (exit 0 when serving).
"""

from __future__ import annotations

import argparse
import logging
import sys

from services.decoder.spec.drafter import SPEC_METHODS


def build_parser(prog: str = "python -m services.decoder.service") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="run a decoder (gRPC) process")
    parser.add_argument("--model", help=".gguf file or HF-style directory (default: the default model)")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--redis-url", help="register in this Redis with a heartbeat")
    parser.add_argument("--decoder-id")
    parser.add_argument("--advertise-address", help="host:port gateways dial")
    parser.add_argument("--served-model-name")
    parser.add_argument("--kv-cache-tokens", type=int)
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--attention", choices=["dense", "sparse"])
    parser.add_argument("--top-k-tokens", type=int, help="sparse top-k budget in tokens")
    parser.add_argument("--sink-pages", type=int)
    parser.add_argument("--recent-pages", type=int)
    parser.add_argument("--page-score", choices=["center", "quest"], help="sparse page ranking (default center)")
    parser.add_argument("--residency", choices=["adaptive", "always-sparse", "always-full"],
                        help="hot-tier policy (default: adaptive with kvtier and sparse attention)")
    parser.add_argument("--sparse-buffer-pages", type=int, help="LRU buffer slots per SPARSE request")
    parser.add_argument("--threads", dest="num_threads", type=int)
    parser.add_argument("--device", help="cpu (default) or cuda[:N]: dense decoding on a GPU")
    parser.add_argument("--kvtier-address", help="host:port of kvtier: write sealed pages back to its host pool")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="model and KV dtype (default fp32)")
    parser.add_argument("--gemm-dtype", choices=["float32", "bfloat16", "float16"],
                        help="projection matmul precision (default: --dtype; bfloat16: oneDNN bf16 kernels on CPU)")
    parser.add_argument("--spec", choices=SPEC_METHODS, help="speculative decoding drafter")
    parser.add_argument("--draft-model", help="dflash/dspark checkpoint directory (default: the shipped one)")
    parser.add_argument("--spec-tokens", type=int, help="draft tokens verified per step")
    parser.add_argument("--verify-budget", choices=["fixed", "adaptive"], help="draft length per request")
    parser.add_argument("--resumable-requests", action="store_true", default=None,
                        help="with kvtier: requests outlive this decoder (a gateway resumes them after a kill)")
    parser.add_argument("--drain-timeout-s", type=float,
                        help="on SIGTERM: time to finish in-flight requests before handing them off")
    parser.add_argument("--probe", metavar="HOST:PORT", help="exit 0 if the decoder there is serving")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog or "python -m services.decoder.service").parse_args(argv)
    if args.probe:
        from services.decoder.config import DecoderConfig
        from services.decoder.service.server import probe
        from services.rpc.auth import InternalSecurity

        # the token and TLS files come from the same DHISPARSE_DECODER_* variables the decoder reads
        return 0 if probe(args.probe, security=InternalSecurity.of(DecoderConfig())) else 1
    from services.decoder.config import DecoderConfig
    from services.decoder.service.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s decoder %(levelname)s %(message)s")
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "probe"}
    return serve(DecoderConfig(**overrides))


if __name__ == "__main__":
    sys.exit(main())
