"""The ``dhisparse`` command line: thin argument parsing over the services' own entry points."""

from __future__ import annotations

import argparse
import json
import sys

from services.decoder.spec.drafter import SPEC_METHODS


def _cmd_models_pull(args: argparse.Namespace) -> int:
    from services.decoder.model.model_store import pull_default_model

    path = pull_default_model(force=args.force)
    print(path)
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from dhisparse import LLM, SamplingParams

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop or ()),
    )
    fields = {
        "dtype": args.dtype,
        "gemm_dtype": args.gemm_dtype,
        "attention": args.attention,
        "top_k_tokens": args.top_k_tokens,
        "sink_pages": args.sink_pages,
        "recent_pages": args.recent_pages,
        "page_score": args.page_score,
        "spec": args.spec,
        "spec_tokens": args.spec_tokens,
        "verify_budget": args.verify_budget,
        "draft_model": args.draft_model,
        "device": args.device,
    }
    if args.threads:
        fields["num_threads"] = args.threads
    llm = LLM(model=args.model, **fields)
    streaming = not args.json and sys.stdout.isatty()

    def on_event(event):
        print(event.text_delta, end="", flush=True)

    out = llm.generate(args.prompt, params, chat=args.chat, on_event=on_event if streaming else None)[0]
    if args.json:
        print(json.dumps({
            "prompt_token_ids": out.prompt_token_ids,
            "token_ids": out.token_ids,
            "text": out.text,
            "finish_reason": out.finish_reason,
            "stats": out.stats,
        }))
    elif streaming:
        print()
    else:
        print(out.text)
    return 0


BENCHMARKS = {  # name -> module with main(argv) -> int
    "decode": "benchmarks.decode",
    "context_sweep": "benchmarks.context_sweep",
    "sparse_quality": "benchmarks.sparse_quality.run",
    "spec": "benchmarks.spec",
    "spec_peer": "benchmarks.spec_peer",
    "spec_trace": "benchmarks.spec_trace",
    "serve": "benchmarks.serve.run",
    "h200_projection": "benchmarks.h200_projection.run",
    "transfer": "benchmarks.transfer",
    "linear_rows": "benchmarks.linear_rows",
    "residency": "benchmarks.residency",
    "selection_trace": "benchmarks.selection_trace",
    "gpu_kernels": "benchmarks.gpu_kernels",
    "soak": "benchmarks.soak.__main__",
    "report": "benchmarks.report",
}
ALL_ON_CPU = ("decode", "context_sweep", "sparse_quality", "spec", "spec_peer", "serve", "transfer", "residency",
              "selection_trace", "h200_projection", "report")  # `bench all`: every CPU benchmark, then report.md
# (selection_trace before h200_projection: the projection reads the trace it writes)


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib
    import time

    from benchmarks.progress import note

    rest = [a for a in args.rest if a != "--"]
    if args.which != "all":
        return importlib.import_module(BENCHMARKS[args.which]).main(rest)
    failed = []
    started = time.monotonic()
    for i, name in enumerate(ALL_ON_CPU, start=1):  # each writes its JSON/PNG into results/<date>-<machine>/
        # progress: one "[i/n]" line per benchmark on stderr (an outer bar would fight their own bars and prints)
        note(f"[{i}/{len(ALL_ON_CPU)}] {name} ({(time.monotonic() - started) / 60:.1f} min elapsed)")
        print(f"== bench {name}", flush=True)
        if importlib.import_module(BENCHMARKS[name]).main([]) != 0:
            failed.append(name)
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}")
    return 1 if failed else 0


def _cmd_kvtier(args: argparse.Namespace) -> int:
    import logging

    from services.kvtier.cli_args import config_from_namespace
    from services.kvtier.server import serve

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s kvtier %(levelname)s %(message)s")
    return serve(config_from_namespace(args))


def _cmd_service(args: argparse.Namespace) -> int:
    if args.service == "decoder":
        from services.decoder.service.__main__ import main as service_main
    elif args.service == "gateway":
        from services.gateway.__main__ import main as service_main
    else:
        from dhisparse.stack import main as service_main
    return service_main(args.rest, prog=f"dhisparse {args.service}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dhisparse", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    models = sub.add_parser("models", help="manage model files")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    pull = models_sub.add_parser("pull", help="download the default model into the cache (idempotent)")
    pull.add_argument("--force", action="store_true", help="download again even if cached")
    pull.set_defaults(func=_cmd_models_pull)

    gen = sub.add_parser("generate", help="generate from a prompt with the in-process engine")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--model", default=None, help=".gguf file or HF-style directory (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    gen.add_argument("--gemm-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                     help="projection weights and matmul precision (default: --dtype); bfloat16 with fp32 --dtype "
                     "runs the matmuls on oneDNN bf16 kernels, everything else in fp32")
    gen.add_argument("--threads", type=int, default=None)
    gen.add_argument("--device", default="cpu", help="cpu or cuda[:N] (dense attention only on CUDA so far)")
    gen.add_argument("--attention", default="dense", choices=["dense", "sparse"],
                     help="sparse: each decode token attends over sink + top-k + recent pages")
    gen.add_argument("--top-k-tokens", type=int, default=2048, help="sparse top-k budget (rounded up to pages)")
    gen.add_argument("--sink-pages", type=int, default=1)
    gen.add_argument("--recent-pages", type=int, default=4)
    gen.add_argument("--page-score", default="center", choices=["center", "quest"],
                     help="sparse page ranking: estimated attention mass (center) or the Quest bound")
    gen.add_argument("--spec", default="none", choices=SPEC_METHODS,
                     help="speculative decoding drafter")
    gen.add_argument("--draft-model", default=None,
                     help="dflash/dspark checkpoint directory (default: the one shipped for SmolLM2-135M-Instruct)")
    gen.add_argument("--spec-tokens", type=int, default=4, help="draft tokens verified per step")
    gen.add_argument("--verify-budget", "--spec-budget", default="fixed", choices=["fixed", "adaptive"],
                     help="adaptive: per-request draft length from acceptance vs profiled step costs")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.set_defaults(func=_cmd_generate)

    bench = sub.add_parser("bench", help="run a benchmark (writes JSON under results/)")
    bench.add_argument("which", choices=sorted(BENCHMARKS) + ["all"])
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    bench.set_defaults(func=_cmd_bench)

    from services.kvtier.cli_args import add_arguments as add_kvtier_arguments

    kvtier = sub.add_parser("kvtier", help="run the kvtier service (host KV pool in shared memory)")
    add_kvtier_arguments(kvtier).set_defaults(func=_cmd_kvtier)

    for name, help_text in (("decoder", "run a decoder gRPC service (flags: dhisparse decoder --help)"),
                            ("gateway", "run the OpenAI-compatible HTTP gateway (flags: dhisparse gateway --help)"),
                            ("up", "run the whole local stack: Redis, kvtier, decoder, gateway (Ctrl-C stops)")):
        service = sub.add_parser(name, help=help_text, add_help=False)
        service.add_argument("rest", nargs=argparse.REMAINDER)
        service.set_defaults(func=_cmd_service, service=name)
    from dhisparse.train_cli import add_eval_parser as add_eval_drafter_parser
    from dhisparse.train_cli import add_export_parser as add_export_distilled_parser
    from dhisparse.train_cli import add_parser as add_train_drafter_parser

    add_train_drafter_parser(sub)
    add_eval_drafter_parser(sub)
    add_export_distilled_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("decoder", "gateway", "up"):  # their own parsers take every flag, --help too
        return _cmd_service(argparse.Namespace(service=argv[0], rest=argv[1:]))
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # invalid input and model load errors: a clear message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
