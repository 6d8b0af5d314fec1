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
   weights back, then ``python3 scripts/device_train_drafter.py DEADLINE_S OUT_DIR``.

argv: deadline_s out_dir [kind seqs_per_step anchors_per_seq lr eval_reserve_s]
"""

import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.decoder.engine.llm import LLM  # noqa: E402
from services.decoder.spec.training.archive import shipped_shards  # noqa: E402
from services.decoder.spec.training.pipeline import (  # noqa: E402
    PipelineOptions,
    prepare_data,
    run_pipeline,
)
from services.decoder.spec.training.trainer import TrainOptions  # noqa: E402

DRAFTERS = Path(__file__).resolve().parent.parent / "services/decoder/spec/drafters"


def main(argv: list[str]) -> None:
    start = time.time()
    deadline, out = start + float(argv[0]), Path(argv[1])
    kind = argv[2] if len(argv) > 2 else "dflash"
    seqs, anchors, lr, reserve_s = (int(argv[3]), int(argv[4]), float(argv[5]), float(argv[6])) if len(argv) > 6 \
        else (8, 128, 3e-4, 80.0)
    out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", force=True,
                        handlers=[logging.StreamHandler(sys.stderr), logging.FileHandler(out / "train.log")])
    log = logging.getLogger("device")
    train = TrainOptions(minutes=1.0, lr=lr, seqs_per_step=seqs, anchors_per_seq=anchors, seed=8, dtype="bfloat16",
                         validate_every_s=45.0, log_every_s=20.0)
    opts = PipelineOptions(kind=kind, out=out / kind, data_dir=Path("/tmp/drafter-data"), distill_minutes=0,
                           distilled=shipped_shards(), init_from=DRAFTERS / f"smollm2-135m-instruct-{kind}",
                           ship_weights="best", progress=False, device="cuda", train=train)
    llm = LLM(max_num_seqs=16, device="cuda")
    log.info("target on cuda in %.1f s", time.time() - start)
    started = time.time()
    log.info("data: %s (%.1f s)", prepare_data(llm, opts), time.time() - started)
    train.minutes = max(0.5, (deadline - time.time() - reserve_s) / 60)  # what is left after the features
    log.info("training budget %.2f min", train.minutes)
    run_pipeline(opts, llm=llm)
    log.info("done in %.1f s", time.time() - start)


if __name__ == "__main__":
    main(sys.argv[1:])
