"""``train-drafter`` end to end: seed the cache from shipped shards -> distil (capturing
features) -> extract missing features -> train -> held-out evaluation -> checkpoint + model card.
Every stage is resumable and skips work already on disk, so rerunning the same command (or
``--resume``) continues where a killed run stopped.

Files: ``<data_dir>/distill.jsonl`` and ``<data_dir>/features-*/`` (shared by runs that use the
same target layers), ``<run_dir>/train_state.pt`` (default ``<data_dir>/runs/<out name>/``), and
finally ``<out>/config.json``, ``<out>/model.safetensors`` (bf16 draft layers only) and
``<out>/README.md``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from services.decoder.spec.dflash.checkpoint import (
    load_checkpoint,
    read_facts,
    save_checkpoint,
    write_draft_vocab,
)
from services.decoder.spec.dflash.config import DEFAULT_CONTEXT_WINDOW, DraftConfig
from services.decoder.spec.dflash.model import DraftNet
from services.decoder.spec.drafter import LEARNED_DRAFTERS
from services.decoder.spec.ngram import NgramDrafter
from services.decoder.spec.training.archive import import_shards
from services.decoder.spec.training.dataset import load_dataset
from services.decoder.spec.training.distill import (
    add_text_files,
    distill,
    read_records,
    summary,
)
from services.decoder.spec.training.draft_vocab import draft_vocabulary
from services.decoder.spec.training.evaluate import draft_acceptance, ngram_acceptance
from services.decoder.spec.training.features import FeatureStore, extract_features
from services.decoder.spec.training.prompts import PROMPT_KINDS, Prompt, build_prompts
from services.decoder.spec.training.target_init import init_from_target
from services.decoder.spec.training.trainer import (
    DraftVocabulary,
    Trainer,
    TrainOptions,
    init_trainable,
)
from services.decoder.spec.training.validation import split_validation

log = logging.getLogger("dhisparse.train_drafter")

DEFAULT_TARGET_LAYERS = (2, 15, 28)
MASK_TOKEN_ID = 16  # SmolLM2's <empty_output>: never produced in chat

DFLASH2_CONV_KERNEL = 4  # block positions a DFlash2 convolution spans
DFLASH2_CONV_GROUP = 64  # channels sharing one dynamic kernel
DFLASH2_TOP_K = 8  # candidates per position the DFlash2 selector re-scores

DRAFT_VOCAB_SIZE = 16384  # draft_vocab.json: a third of SmolLM2's head rows per drafted position


@dataclass
class PipelineOptions:
    kind: str
    out: Path
    data_dir: Path
    num_prompts: int = 4000
    distill_minutes: float | None = None  # None: distil every prompt; 0: use the cache only
    concurrency: int = 16
    max_new_tokens: int = 256
    text_files: list[str] = field(default_factory=list)
    distilled: list[Path] = field(default_factory=list)  # shipped shards seeding the cache (archive.py)
    num_layers: int = 2
    block_size: int = 8
    target_layers: tuple[int, ...] = DEFAULT_TARGET_LAYERS
    intermediate_size: int = 1536
    markov_rank: int = 64  # DSpark's Markov head; DFlash2's candidate selector has the same rank
    context_window: int = DEFAULT_CONTEXT_WINDOW
    init_from: Path | None = None  # warm-start the backbone from a trained draft checkpoint
    init_target: bool = False  # start the draft layers as copies of the target's last layers
    run_dir: Path | None = None  # training state; default <data_dir>/runs/<out folder name>
    resume: bool = False
    validation_percent: float = 2.0  # of the training sequences, held out of training to pick the weights
    distill_kinds: tuple[str, ...] | None = None  # built-in prompt kinds to distil (None: all)
    distill_heldout: bool = True  # False: distil training-split prompts only (the held-out set stays as it is)
    ship_weights: str = "best"  # "best": the validation-best step's weights; "last": the last step's
    progress: bool = True
    device: str = "cpu"  # where the target (features), the drafter and its training live
    train: TrainOptions = field(default_factory=TrainOptions)


def default_config(kind: str, target_cfg, *, num_layers: int = 2, block_size: int = 8,
                   target_layers: tuple[int, ...] = DEFAULT_TARGET_LAYERS, intermediate_size: int = 1536,
                   markov_rank: int = 64, context_window: int = DEFAULT_CONTEXT_WINDOW,
                   mask_token_id: int = MASK_TOKEN_ID) -> DraftConfig:
    """A draft config matching the target: its hidden size, heads, head_dim, RoPE theta, norm
    eps and vocabulary (the draft shares the target's embeddings and LM head). ``markov_rank``:
    the low-rank transition's rank (DSpark's Markov head, DFlash2's candidate selector); DFlash2
    convolves over ``DFLASH2_CONV_KERNEL`` positions in channel groups of ``DFLASH2_CONV_GROUP``
    and picks among the top ``DFLASH2_TOP_K`` candidates."""
    if kind not in LEARNED_DRAFTERS:
        raise ValueError(f"--kind must be one of {LEARNED_DRAFTERS}, got {kind!r}")
    dflash2 = kind == "dflash2"
    cfg = DraftConfig(
        hidden_size=target_cfg.hidden_size, num_layers=num_layers, num_heads=target_cfg.num_heads,
        num_kv_heads=target_cfg.num_kv_heads, head_dim=target_cfg.head_dim, intermediate_size=intermediate_size,
        rms_norm_eps=target_cfg.rms_norm_eps, rope_theta=target_cfg.rope_theta, vocab_size=target_cfg.vocab_size,
        block_size=block_size, mask_token_id=mask_token_id, target_layer_ids=tuple(target_layers),
        context_window=context_window, num_target_layers=target_cfg.num_layers,
        markov_rank=markov_rank if kind == "dspark" else None, confidence_head=kind == "dspark",
        conv_kernel_size=DFLASH2_CONV_KERNEL if dflash2 else None, conv_group_size=DFLASH2_CONV_GROUP if dflash2 else None,
        selector_rank=markov_rank if dflash2 else None, selector_top_k=DFLASH2_TOP_K if dflash2 else None,
    )
    cfg.validate()
    cfg.check_target(target_cfg.num_layers, target_cfg.hidden_size, target_cfg.vocab_size)
    return cfg


def distill_prompts(num_prompts: int | None, kinds: tuple[str, ...] | None = None) -> list[Prompt]:
    """The first ``num_prompts`` built-in prompts, of ``kinds`` only when given (e.g. ``("chat",)``:
    more chat answers without re-queueing code and doc prompts)."""
    if kinds is not None and not set(kinds) <= set(PROMPT_KINDS):
        raise ValueError(f"unknown prompt kinds {sorted(set(kinds) - set(PROMPT_KINDS))} (known: {list(PROMPT_KINDS)})")
    prompts = build_prompts(num_prompts)
    return prompts if kinds is None else [p for p in prompts if p.kind in kinds]


def prepare_data(llm, opts: PipelineOptions) -> dict:
    """Distils the prompts not yet cached (capturing their features), adds text-file chunks,
    then extracts the features still missing with a dense prefill."""
    opts.data_dir.mkdir(parents=True, exist_ok=True)
    if opts.distilled:
        added = import_shards(opts.data_dir, opts.distilled, llm.engine.model.config.vocab_size)
        log.info("distillation shards %s: %d records new to the cache", [p.name for p in opts.distilled], added)
    if opts.text_files:
        added = add_text_files(opts.data_dir, opts.text_files, llm.tokenizer.encode)
        log.info("text files: %d new chunks", added)
    if opts.distill_minutes != 0:
        prompts = distill_prompts(opts.num_prompts, opts.distill_kinds)
        if not opts.distill_heldout:
            prompts = [p for p in prompts if p.split == "train"]
        started = time.monotonic()
        store = FeatureStore(opts.data_dir, opts.target_layers)  # features captured while generating
        stats = distill(llm, prompts, opts.data_dir, concurrency=opts.concurrency, max_new_tokens=opts.max_new_tokens,
                        minutes=opts.distill_minutes, progress=opts.progress, features=store)
        log.info("distilled %s in %.1f min", stats, (time.monotonic() - started) / 60)
    records = read_records(opts.data_dir)
    if not records:
        raise ValueError(f"{opts.data_dir}: no distilled data (allow some --distill-minutes or give --text-files)")
    started = time.monotonic()
    stats = extract_features(llm.engine.model, records, opts.data_dir, opts.target_layers, progress=opts.progress)
    log.info("features: %s in %.1f min", stats, (time.monotonic() - started) / 60)
    return summary(records)


def warm_start(net: DraftNet, directory: Path) -> list[str]:
    """Copies every tensor of a trained checkpoint whose name and shape match (e.g. the DFlash
    backbone into a DSpark net); returns the names copied."""
    source = load_checkpoint(directory).state_dict()
    target = net.state_dict()
    copied = [n for n, t in source.items() if n in target and target[n].shape == t.shape]
    if not copied:
        raise ValueError(f"--init-from {directory}: no tensor matches this draft config")
    net.load_state_dict({n: source[n] for n in copied}, strict=False)
    return copied


def evaluate(net: DraftNet, embed: torch.Tensor, heldout, vocab: torch.Tensor | None = None) -> dict:
    return {"draft": draft_acceptance(net, embed, heldout, vocab=vocab),
            "ngram": ngram_acceptance(heldout, net.cfg.block_size, NgramDrafter())}


def model_card(kind: str, cfg: DraftConfig, facts: dict) -> str:
    ev = facts["heldout_acceptance"]

    def cells(figures: dict) -> str:
        per_anchor = figures.get("per_anchor_mean_acceptance_length")
        return f"{figures['mean_acceptance_length']:.2f} | " + ("-" if per_anchor is None else f"{per_anchor:.2f}")

    rows = [f"| {kind} (this) | {cells(ev['draft'])} |",
            f"| n-gram prompt lookup (min_n=1, max_n=4) | {cells(ev['ngram'])} |"]
    kinds = sorted(ev["draft"]["by_kind"])
    per_kind = "\n".join(
        f"| {k} | {ev['draft']['by_kind'][k]['anchors']} | {cells(ev['draft']['by_kind'][k])} | "
        f"{cells(ev['ngram']['by_kind'][k])} |" for k in kinds if k in ev["ngram"]["by_kind"])
    return f"""# {kind.upper()} drafter for SmolLM2-135M-Instruct

A {cfg.num_layers}-layer block drafter (block size {cfg.block_size}, hidden {cfg.hidden_size},
{cfg.num_heads}/{cfg.num_kv_heads} heads, intermediate {cfg.intermediate_size}) conditioned on the
target's hidden states after layers {list(cfg.target_layer_ids)}, context window {cfg.context_window}
positions{_extras(cfg)}.
Only the draft layers are stored (bf16); the embeddings and LM head are the target's.

Trained by `dhisparse train-drafter --kind {kind}` (`services/decoder/spec/training/`) on
self-distillation data: the target's own greedy answers (chat template, at most 256 new tokens)
to the built-in prompt set (chat / code / stdlib-doc prompts).

- Data: {facts['train_sequences']} training sequences, {facts['train_answer_tokens']} answer tokens
  ({facts['train_tokens']} tokens with prompts); held out by prompt source: {facts['heldout_sequences']} sequences.
- Training: {facts['steps']} steps, {facts['train_minutes']:.1f} min on {facts['device']}
  ({facts['drafted_positions_seen']} drafted positions seen); initialisation: {facts['init']}.
- Weights: {_selection_line(facts)}

## Held-out acceptance (greedy, block {cfg.block_size}, {ev['draft']['anchors']} answer anchors)

At each answer anchor the acceptance length is 1 + the leading drafted tokens equal to the
target's greedy continuation (bonus token included). **Decoding** is their mean along the walk
greedy decoding takes (verify at an anchor, commit what it accepts, verify at the next one):
tokens committed per verify step, as DFlash and DSpark report it and as the engine measures it.
**Per anchor** weights every anchor alike and reads higher wherever acceptance varies (the
figure earlier cards reported). Both drafters on the same anchors:

| drafter | decoding | per anchor |
|---|---|---|
{chr(10).join(rows)}

| prompt kind | anchors | {kind}: decoding | per anchor | n-gram: decoding | per anchor |
|---|---|---|---|---|---|
{per_kind}
"""


def _extras(cfg: DraftConfig) -> str:
    if cfg.kind == "dspark":
        return f", Markov head rank {cfg.markov_rank} and a confidence head"
    if cfg.kind == "dflash2":
        return (f", dynamic convolutions over {cfg.conv_kernel_size} positions (channel groups of "
                f"{cfg.conv_group_size}) and a top-{cfg.selector_top_k} candidate selector of rank {cfg.selector_rank}")
    return ""


def _selection_line(facts: dict) -> str:
    v = facts.get("validation") or {}
    if v.get("step") is None:
        return "the last step's (no validation sequences)."
    caveat = (" The warm start was trained with a smaller validation split or none and may have seen them, "
              "which favours early steps." if v.get("init_may_have_trained_on_it") else "")
    scores = f"on {v['sequences']} training-split sequences kept out of training"
    if v.get("shipped") == "last":
        best = max(v["history"], key=lambda h: h["score"])
        return (f"the last step's, as asked (validation mean acceptance length {v['score']:.3f} {scores}; the best "
                f"of {len(v['history'])} scores was {best['score']:.3f} at step {best['step']}).{caveat}")
    return (f"step {v['step']} of {facts['steps']}, the best of {len(v['history'])} validation scores "
            f"(mean acceptance length {v['score']:.3f} {scores}).{caveat}")


def device_name(device: torch.device, bf16: bool) -> str:
    """The model card's words for where training ran, e.g. ``CPU (2 threads, bf16 matmuls)``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device) + (" (bf16 matmuls)" if bf16 else "")
    return f"CPU ({torch.get_num_threads()} threads" + (", bf16 matmuls)" if bf16 else ")")


def run_pipeline(opts: PipelineOptions, llm=None) -> dict:
    """Runs every stage; returns the training facts written into the checkpoint."""
    if opts.ship_weights not in ("best", "last"):  # checked before hours of training, not after
        raise ValueError(f"ship_weights must be 'best' or 'last', not {opts.ship_weights!r}")
    if llm is None:
        from services.decoder.engine.llm import LLM

        llm = LLM(max_num_seqs=max(opts.concurrency, 1), device=opts.device)
    model = llm.engine.model
    device = model.device
    cfg = default_config(opts.kind, model.config, num_layers=opts.num_layers, block_size=opts.block_size,
                         target_layers=opts.target_layers, intermediate_size=opts.intermediate_size,
                         markov_rank=opts.markov_rank, context_window=opts.context_window)
    data = prepare_data(llm, opts)
    train, heldout = load_dataset(opts.data_dir, cfg.target_layer_ids, cfg.block_size)
    train, validation = split_validation(train, opts.validation_percent)
    train, validation, heldout = ([s.to(device) for s in part] for part in (train, validation, heldout))
    log.info("data: %s; %d train / %d validation / %d held-out sequences with anchors", data, len(train),
             len(validation), len(heldout))
    torch.manual_seed(opts.train.seed)
    net = DraftNet(cfg)
    init_trainable(net, opts.train.seed)
    init = "random"
    if opts.init_target:
        init = f"target layers {init_from_target(net, model)}"
    if opts.init_from is not None:
        init = f"warm start from {opts.init_from} ({len(warm_start(net, opts.init_from))} tensors)"
    log.info("initialisation: %s", init)
    net.to(device)
    # the split is a fixed hash of each key (a larger percent takes a superset), so a warm start
    # trained with at least this percent never saw these sequences; one trained with less or
    # none may have, and its memory of them fades as training goes on: the selection would then
    # favour the first steps
    init_saw_validation = False
    if opts.init_from is not None and validation:
        init_percent = (read_facts(opts.init_from).get("validation") or {}).get("percent_of_train", 0.0)
        init_saw_validation = init_percent < opts.validation_percent
    if init_saw_validation:
        log.warning("%s was trained with a smaller validation split or none: it may have trained on the validation "
                    "sequences, which biases the choice of weights towards early steps", opts.init_from)
    embed = model.embed_tokens.detach().float()
    # what the shipped drafter drafts from (draft_vocab.json): the training set's tokens first
    vocab = draft_vocabulary([s.token_ids.tolist() for s in train], min(DRAFT_VOCAB_SIZE, cfg.vocab_size),
                             cfg.vocab_size)
    vocab_ids = torch.tensor(vocab, device=device)

    def validate(candidate: DraftNet) -> float:
        return draft_acceptance(candidate, embed, validation, vocab=vocab_ids)["mean_acceptance_length"]

    run_dir = opts.run_dir or opts.data_dir / "runs" / Path(opts.out).name
    trainer = Trainer(net, embed, train, opts.train, run_dir, resume=opts.resume,
                      validate=validate if validation else None, vocab=DraftVocabulary(vocab_ids, cfg.vocab_size))
    metrics = trainer.train(progress=opts.progress)
    log.info("trained %d steps in %.1f min: %s", trainer.step, trainer.elapsed_s / 60, metrics)
    selection = trainer.select_best() if opts.ship_weights == "best" else trainer.keep_last()
    with torch.no_grad():  # evaluate what is shipped: the bf16-rounded weights
        for p in net.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    started = time.monotonic()
    acceptance = evaluate(net, embed, heldout, vocab_ids)
    log.info("held-out acceptance (%.1f min): draft %.3f, n-gram %.3f over %d anchors", (time.monotonic() - started) / 60,
             acceptance["draft"]["mean_acceptance_length"], acceptance["ngram"]["mean_acceptance_length"],
             acceptance["draft"]["anchors"])
    facts = {
        "train_sequences": len(train), "heldout_sequences": len(heldout),
        "train_tokens": sum(len(s.token_ids) for s in train),
        "train_answer_tokens": sum(len(s.token_ids) - s.answer_start for s in train),
        "steps": trainer.step, "train_minutes": round(trainer.elapsed_s / 60, 2),
        "drafted_positions_seen": trainer.tokens_seen, "device": device_name(device, trainer.autocast_bf16),
        "final_metrics": {k: round(v, 4) for k, v in metrics.items()},
        "init_from": str(opts.init_from) if opts.init_from else None, "init": init,
        "options": {k: v for k, v in asdict(opts.train).items()},
        "heldout_acceptance": acceptance, "draft_vocab_size": len(vocab),
        "validation": {"sequences": len(validation), "percent_of_train": opts.validation_percent,
                       "init_may_have_trained_on_it": init_saw_validation, "shipped": opts.ship_weights,
                       **(selection or {"step": None})},
    }
    save_checkpoint(net.cpu(), opts.out, dtype=torch.bfloat16, extra=facts)
    write_draft_vocab(opts.out, vocab)
    (Path(opts.out) / "README.md").write_text(model_card(opts.kind, cfg, facts))
    log.info("checkpoint written to %s", opts.out)
    print(json.dumps({"out": str(opts.out), "heldout_acceptance": {k: v["mean_acceptance_length"] for k, v in acceptance.items()}}))
    return facts
