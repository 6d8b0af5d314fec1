"""``python -m services.gateway [--port N] [--redis-url URL] ...``: run the OpenAI-compatible gateway.

Flags override ``GatewayConfig`` fields (which env vars ``DHISPARSE_GATEWAY_*`` also set).
"""

from __future__ import annotations

import argparse
import sys


def build_parser(prog: str = "python -m services.gateway") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="run the OpenAI-compatible HTTP gateway")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--redis-url", help="decoder registry (Redis heartbeats)")
    parser.add_argument("--decoder", dest="decoder_addresses", action="append",
                        help="static decoder host:port (repeatable; used without --redis-url)")
    parser.add_argument("--model-name")
    parser.add_argument("--api-key", dest="api_keys", action="append", help="accepted Bearer key (repeatable)")
    parser.add_argument("--max-body-bytes", type=int)
    parser.add_argument("--max-prompt-tokens", type=int)
    parser.add_argument("--max-tokens-limit", type=int)
    parser.add_argument("--resume-timeout-s", type=float,
                        help="how long a stream whose decoder went away looks for one to resume it (0 = never)")
    parser.add_argument("--decoder-keepalive-s", type=float,
                        help="ping interval and timeout of decoder connections with open streams")
    parser.add_argument("--log-level")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog or "python -m services.gateway").parse_args(argv)
    import uvicorn

    from services.gateway.app import create_app
    from services.gateway.config import GatewayConfig

    config = GatewayConfig(**{k: v for k, v in vars(args).items() if v is not None})
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level=config.log_level,
                timeout_graceful_shutdown=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
