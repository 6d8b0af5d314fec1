"""On the device machine: ``train-drafter --device cuda`` for a shipped drafter, warm-started from
it, with the training budget fitted to a deadline once the target's features are extracted.

The default GGUF (98 MB) is larger than what one device call carries (64 MiB with the tree), so
it travels xz-compressed in two parts over two calls on one warm machine (how stage 8 of the
DFlash drafter ran; ``results/2026-12-04-h200/``):

1. here: ``xz -T2 -6 -c <gguf> | split -b 50500000 -d -a 1 - .device/gguf.xz.part``, wheels in
   ``.whl/`` (the device README); move the shipped drafters' ``model.safetensors`` (except the one
   to train, copied into ``.device/``) and ``results/`` out of the tree for the two calls;
2. call 1 (carry ``.device/gguf.xz.part0``, ``.whl``): install the wheels into ``/root/site`` and
   copy the part to ``/root/stash/``;
3. call 2, within the machine's 30 s warm window (carry ``.device/gguf.xz.part1`` and the
   drafter's weights): join and unpack the parts into ``$DHISPARSE_CACHE_DIR/models/``, put the
   weights back, then ``python3 scripts/device_train_drafter.py DEADLINE_S OUT_DIR [options]``.

With ``--distill-s`` the call first distils a new round of chat answers on the device (our engine,
fp32 like the CPU's serving path, ``--concurrency`` requests in flight; training-split prompts
only, so the held-out set stays the one the card's figures are on), writes the round as a shard
(``--shard``) beside the weights, and trains on it and the shipped rounds. ``--device cpu``
rehearses the whole call on a small budget before device time is spent on it.
"""

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.decoder.engine.llm import LLM  # noqa: E402
from services.decoder.spec.training.archive import export_shard, shipped_shards  # noqa: E402
from services.decoder.spec.training.pipeline import (  # noqa: E402
    PipelineOptions,
    prepare_data,
    run_pipeline,
)
from services.decoder.spec.training.trainer import TrainOptions  # noqa: E402

DRAFTERS = Path(__file__).resolve().parent.parent / "services/decoder/spec/drafters"
ANSWER_TOKENS = 256  # at most, per distilled answer (the shipped rounds' setting)
MAX_LEN = 1024  # a chat prompt and its answer fit (prompts are a few dozen tokens)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("deadline_s", type=float, help="seconds from start to the written checkpoint")
    p.add_argument("out", type=Path)
    p.add_argument("--kind", default="dflash")
    p.add_argument("--device", default="cuda")
    p.add_argument("--seqs-per-step", type=int, default=8)
    p.add_argument("--anchors-per-seq", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--eval-reserve-s", type=float, default=60.0, help="kept for evaluation and writing")
    p.add_argument("--distill-s", type=float, default=0.0, help="seconds of new chat distillation (0: none)")
    p.add_argument("--concurrency", type=int, default=256, help="requests in flight while distilling")
    p.add_argument("--num-prompts", type=int, default=None, help="a prefix of the built-in prompt order (default: all)")
    p.add_argument("--shard", default="new-round.jsonl.xz", help="file name of the distilled round's shard")
    p.add_argument("--shipped-like", default="", help="seed with the shipped shards whose names contain this only "
                                                      "(a rehearsal's smaller data)")
    return p.parse_args(argv)


def main(argv: list[str]) -> None:
    start = time.time()
    args = parse(argv)
    deadline, out = start + args.deadline_s, args.out
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True,
                        handlers=[logging.StreamHandler(sys.stderr), logging.FileHandler(out / "train.log")])
    log = logging.getLogger("device")
    train = TrainOptions(minutes=1.0, lr=args.lr, seqs_per_step=args.seqs_per_step, anchors_per_seq=args.anchors_per_seq,
                         seed=9, dtype="bfloat16", validate_every_s=45.0, log_every_s=20.0)
    shipped = [path for path in shipped_shards() if args.shipped_like in path.name]
    opts = PipelineOptions(kind=args.kind, out=out / args.kind, data_dir=out.parent / "drafter-data",
                           distill_minutes=args.distill_s / 60 if args.distill_s > 0 else 0, distilled=shipped,
                           num_prompts=args.num_prompts, distill_kinds=("chat",), distill_heldout=False,
                           concurrency=args.concurrency, max_new_tokens=ANSWER_TOKENS,
                           init_from=DRAFTERS / f"smollm2-135m-instruct-{args.kind}", ship_weights="best",
                           progress=False, device=args.device, train=train)
    # every in-flight answer's K/V fits at once; a step takes one token of each plus prompt chunks
    llm = LLM(device=args.device, max_num_seqs=args.concurrency, max_model_len=MAX_LEN,
              kv_cache_tokens=max(args.concurrency, 4) * MAX_LEN // 2, max_num_batched_tokens=max(2048, 2 * args.concurrency))
    log.info("target on %s in %.1f s", args.device, time.time() - start)
    started = time.time()
    log.info("data: %s (%.1f s)", prepare_data(llm, opts), time.time() - started)
    if args.distill_s > 0:
        new = export_shard(opts.data_dir, out / args.shard, shipped, llm.engine.model.config.vocab_size)
        log.info("new round: %d records in %s", new, out / args.shard)
    opts.distill_minutes = 0  # the pipeline's own prepare_data finds everything cached
    train.minutes = max(0.2, (deadline - time.time() - args.eval_reserve_s) / 60)  # what is left
    log.info("training budget %.2f min", train.minutes)
    run_pipeline(opts, llm=llm)
    log.info("done in %.1f s", time.time() - start)


if __name__ == "__main__":
    main(sys.argv[1:])
