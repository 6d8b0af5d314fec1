"""``dhisparse train-drafter``: argument wiring for ``services/decoder/spec/training/pipeline.py``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def _layers(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices, got {text!r}") from None
    if not layers or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative layer indices, got {text!r}")
    return layers


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train-drafter", help="train a DFlash/DFlash2/DSpark drafter on self-distillation data",
                       description="Distil the target's greedy answers to built-in prompts (plus text files), "
                                   "extract target features once, train, evaluate held-out acceptance, write "
                                   "config.json + model.safetensors + README.md. Resumable at every stage.")
    p.add_argument("--kind", required=True, choices=["dflash", "dflash2", "dspark"])
    p.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    p.add_argument("--data-dir", type=Path, default=Path("drafter-data"),
                   help="distillation cache and features (shared between runs)")
    p.add_argument("--run-dir", type=Path, default=None, help="training state (default: DATA_DIR/runs/<out name>)")
    p.add_argument("--text-files", nargs="*", default=[], help="plain text files added as training sequences")
    p.add_argument("--distilled", nargs="*", type=Path, default=None,
                   help="distillation shards (.jsonl.xz) to seed the cache with (default: the shards this repository "
                        "ships for the default model; give the flag alone for none)")
    p.add_argument("--num-prompts", type=int, default=4000, help="built-in prompts to distil (prefix of a fixed order)")
    p.add_argument("--distill-kinds", type=lambda t: tuple(k for k in t.split(",") if k), default=None,
                   help="distil only these built-in prompt kinds, comma-separated (chat, code, doc)")
    p.add_argument("--no-distill-heldout", action="store_true",
                   help="distil training-split prompts only: the held-out set (and figures measured on it) stays fixed")
    p.add_argument("--distill-minutes", type=float, default=None,
                   help="stop queueing prompts after this long (0: use the cache only; default: all prompts)")
    p.add_argument("--concurrency", type=int, default=16, help="requests generated together while distilling")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--layers", type=int, default=2, help="draft layers")
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--target-layers", type=_layers, default=None, help="e.g. 2,15,28")
    p.add_argument("--intermediate-size", type=int, default=1536)
    p.add_argument("--markov-rank", type=int, default=64, help="rank of DSpark's Markov head and DFlash2's candidate selector")
    p.add_argument("--context-window", type=int, default=1024)
    p.add_argument("--init-from", type=Path, default=None, help="warm-start matching tensors from a trained checkpoint")
    p.add_argument("--init-target-layers", action="store_true",
                   help="start the draft layers as copies of the target's last layers (needs the target's dims)")
    p.add_argument("--minutes", type=float, default=None, help="training time budget")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: fill --minutes)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--seqs-per-step", type=int, default=4)
    p.add_argument("--anchors-per-seq", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="the training forward's matmul precision (bfloat16: autocast over fp32 weights; "
                        "auto: bfloat16 on a GPU or where the CPU has bf16 kernels)")
    p.add_argument("--device", default="cpu", help="where the target's feature extraction and the training run: "
                   "cpu or cuda[:N] (the shipped figures of a GPU run say which GPU)")
    p.add_argument("--validation-percent", type=float, default=2.0,
                   help="share of the training sequences kept out of training to choose the shipped weights (0: none)")
    p.add_argument("--validate-every-minutes", type=float, default=10.0,
                   help="score the drafter on the validation sequences this often (the best weights are shipped)")
    p.add_argument("--ship-weights", choices=["best", "last"], default="best",
                   help="the validation-best step's weights, or the last step's (e.g. when the validation "
                        "sequences may be in a warm start's training data)")
    p.add_argument("--resume", action="store_true", help="continue training from the run's saved state")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (log lines only)")
    p.add_argument("--log-file", type=Path, default=None)
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from services.decoder.spec.training.pipeline import (
        DEFAULT_TARGET_LAYERS,
        PipelineOptions,
        run_pipeline,
    )
    from services.decoder.spec.training.trainer import TrainOptions

    handlers = [logging.StreamHandler(sys.stderr)]
    if args.log_file:
        args.log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(args.log_file))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", handlers=handlers, force=True)
    if args.steps is None and args.minutes is None:
        raise ValueError("give --minutes (a training time budget) or --steps")
    train = TrainOptions(steps=args.steps, minutes=args.minutes, lr=args.lr, seqs_per_step=args.seqs_per_step,
                         anchors_per_seq=args.anchors_per_seq, seed=args.seed, dtype=args.train_dtype,
                         validate_every_s=args.validate_every_minutes * 60)
    opts = PipelineOptions(
        kind=args.kind, out=args.out, data_dir=args.data_dir, run_dir=args.run_dir, num_prompts=args.num_prompts,
        distill_minutes=args.distill_minutes, concurrency=args.concurrency, max_new_tokens=args.max_new_tokens,
        text_files=list(args.text_files), distilled=_distilled(args.distilled), num_layers=args.layers, block_size=args.block_size,
        target_layers=args.target_layers or DEFAULT_TARGET_LAYERS, intermediate_size=args.intermediate_size,
        markov_rank=args.markov_rank, context_window=args.context_window, init_from=args.init_from,
        init_target=args.init_target_layers, resume=args.resume, validation_percent=args.validation_percent,
        ship_weights=args.ship_weights, distill_kinds=args.distill_kinds, distill_heldout=not args.no_distill_heldout,
        progress=not args.no_progress, device=args.device, train=train,
    )
    run_pipeline(opts)
    return 0


def _distilled(paths: list[Path] | None) -> list[Path]:
    from services.decoder.spec.training.archive import shipped_shards

    return shipped_shards() if paths is None else list(paths)


def add_export_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("export-distilled", help="write a distillation cache's new records as a shard to ship",
                       description="Writes the records of DATA_DIR's distillation cache that no shipped shard holds "
                                   "to a new xz-compressed shard (default: the repository's shard folder for the "
                                   "default model), so the next machine's train-drafter starts from them.")
    p.add_argument("--data-dir", type=Path, default=Path("drafter-data"), help="distillation cache")
    p.add_argument("--name", required=True, help="the shard's name (one per data round, e.g. 2026-12-01-chat)")
    p.add_argument("--shard-dir", type=Path, default=None, help="where shards live (default: the shipped folder)")
    p.set_defaults(func=run_export)
    return p


def run_export(args: argparse.Namespace) -> int:
    from services.decoder.engine.llm import LLM
    from services.decoder.spec.training.archive import (
        SHARD_SUFFIX,
        SHIPPED_DATA_DIR,
        export_shard,
        shipped_shards,
    )

    shard_dir = args.shard_dir or SHIPPED_DATA_DIR
    vocab_size = LLM(max_num_seqs=1).engine.model.config.vocab_size
    out = shard_dir / (args.name + SHARD_SUFFIX)
    written = export_shard(args.data_dir, out, shipped_shards(shard_dir), vocab_size)
    print(f"{written} records written to {out}" if written else "no records new to the shipped shards")
    return 0


def add_eval_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("eval-drafter", help="score a trained drafter's held-out acceptance",
                       description="Held-out mean acceptance length (along the decoding walk, and per anchor) of a "
                                   "DFlash/DSpark checkpoint and of n-gram prompt lookup, by prompt kind, on a "
                                   "distillation cache's held-out sequences. --write records it in the checkpoint.")
    p.add_argument("--checkpoint", required=True, type=Path)
    p.add_argument("--data-dir", type=Path, default=Path("drafter-data"), help="distillation cache and features")
    p.add_argument("--write", action="store_true",
                   help="replace the checkpoint's recorded held-out figures (config.json) and its card's table")
    p.set_defaults(func=run_eval)
    return p


def run_eval(args: argparse.Namespace) -> int:
    import json

    from services.decoder.engine.llm import LLM
    from services.decoder.spec.training.rescore import (
        rescore_checkpoint,
        write_rescored,
    )

    embed = LLM(max_num_seqs=1).engine.model.embed_tokens
    acceptance = rescore_checkpoint(args.checkpoint, args.data_dir, embed)
    if args.write:
        write_rescored(args.checkpoint, acceptance)
    print(json.dumps(acceptance, indent=2))
    return 0
