"""The drafter training loop.

Each step draws ``seqs_per_step`` training sequences and, in each, up to ``anchors_per_seq``
anchors inside the answer (``a + block_size - 1 < T``); one ``DraftNet.sequence_blocks`` pass per
sequence (the inference forward) gives the drafted positions' hidden states. Loss:

- DFlash / DFlash2: cross-entropy of the base logits (target's frozen LM head) against the true
  continuation, position ``k`` of the block weighted ``exp(-(k - 1) / decay)`` (early positions
  decide acceptance); with a ``DraftVocabulary`` the logits span only the ids the served
  drafter drafts from;
- DFlash2: that CE plus ``selector_weight`` x the candidate selector's CE: among the top-K
  candidates of the base logits, scored as when serving (unary + low-rank transition from the
  true previous token), the label's; positions whose label is not a candidate carry none;
- DSpark: the same CE on the Markov-corrected logits (teacher-forced: the previous token is the
  true one) plus ``bce_weight`` x BCE of the confidence head, whose target is whether the
  position's greedy draft token equals the label (the head reads detached hidden states).

AdamW, linear warmup then cosine decay to ``min_lr_ratio``, gradient clipping. The schedule's
length is ``steps``, or with a time budget, estimated from the first ``calibrate_steps`` steps and
re-fitted every ``recalibrate_steps`` to the remaining budget (step times vary on a shared CPU).
Everything needed to continue (network, optimizer, step, schedule, elapsed time, sampling RNG)
is saved atomically to ``<run_dir>/train_state.pt`` every ``save_every_s`` seconds and at the end;
``Trainer(..., resume=True)`` continues from it exactly.

With a ``validate`` scorer (``validation.py``: mean acceptance length on validation sequences
carved out of the training split) the network is scored every ``validate_every_s`` seconds of
wall time (validation time is not charged to the training budget) and the best weights are kept;
``select_best()`` scores the final weights too and restores the best.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from services.decoder.model.linear import onednn_bf16_supported
from services.decoder.spec.dflash.model import DraftNet
from services.decoder.spec.training.dataset import Sequence
from services.decoder.spec.training.validation import BestSnapshot

STATE_FILE = "train_state.pt"
log = logging.getLogger("dhisparse.train_drafter")


@dataclass
class TrainOptions:
    steps: int | None = None  # schedule length; None = from the time budget
    minutes: float | None = None  # training time budget (cumulative over resumes)
    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    warmup_steps: int = 30
    calibrate_steps: int = 10
    recalibrate_steps: int = 100  # with a time budget, re-fit the schedule's length this often
    seqs_per_step: int = 4
    anchors_per_seq: int = 16
    decay: float = 4.0  # position weight exp(-(k - 1) / decay)
    bce_weight: float = 1.0
    selector_weight: float = 1.0  # DFlash2's candidate selector CE
    grad_clip: float = 1.0
    save_every_s: float = 120.0
    log_every_s: float = 60.0
    validate_every_s: float | None = None  # with a validate scorer; None: only at the end
    seed: int = 0
    # the forward's matmul precision: "float32", or "bfloat16" (autocast: bf16 matmuls over
    # fp32 weights, optimizer state and loss; 1.5x the steps per minute on 2 AVX512-BF16 cores,
    # the loss within 1e-3 of fp32's); "auto": bfloat16 on a GPU or where oneDNN has bf16 kernels
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ValueError(f"dtype must be auto, float32 or bfloat16, not {self.dtype!r}")

    def autocast_bf16(self, device: torch.device | str = "cpu") -> bool:
        """Whether the training forward on ``device`` autocasts its matmuls to bf16."""
        if self.dtype == "auto":
            return torch.device(device).type == "cuda" or onednn_bf16_supported()
        return self.dtype == "bfloat16"


def position_weights(count: int, decay: float, device: torch.device | str = "cpu") -> torch.Tensor:
    return torch.exp(-torch.arange(count, dtype=torch.float32, device=device) / decay)


def init_trainable(net: DraftNet, seed: int = 0) -> None:
    """Fresh-training initialisation of what ``DraftNet`` leaves at zero: a bilinear head whose
    two codebooks are both zero never gets a gradient, so the predecessor codebook starts random
    (the successor one stays zero: the head starts as a no-op); DFlash2's convolutions start as
    the identity (static kernel 1 at shift 0, no dynamic part), so a DFlash2 net warm-started
    from a DFlash checkpoint starts as that DFlash."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in (net.markov_head, net.candidate_selector):
            if head is not None:
                head.predecessor_codebook.copy_(torch.randn(head.predecessor_codebook.shape, generator=gen))
        for layer in net.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                if conv is not None:
                    conv.base_kernel.zero_()
                    conv.base_kernel[:, 0] = 1.0
                    conv.kernel_projection.weight.zero_()


class DraftVocabulary:
    """The ids a served drafter drafts from (``draft_vocab.json``) and the map from a token id
    to its row among them (``IGNORED`` outside). Training over them computes the head for a third
    of SmolLM2's rows, and a label outside them is one no draft can match anyway. Both live on
    ``ids``' device."""

    IGNORED = -100  # F.cross_entropy's ignore_index

    def __init__(self, ids: torch.Tensor, vocab_size: int):
        self.ids = ids.long()
        self.row_of = torch.full((vocab_size,), self.IGNORED, dtype=torch.long, device=ids.device)
        self.row_of[self.ids] = torch.arange(len(self.ids), device=ids.device)
        self._head: tuple[torch.Tensor, torch.Tensor] | None = None  # (embed, its rows at ids)

    def head(self, embed: torch.Tensor) -> torch.Tensor:
        """``embed[ids]``: ``[len(ids), H]``, gathered once per ``embed`` (the frozen tied head),
        not once per training sequence."""
        if self._head is None or self._head[0] is not embed:
            self._head = (embed, embed[self.ids])
        return self._head[1]


def sequence_loss(net: DraftNet, embed: torch.Tensor, seq: Sequence, anchors: torch.Tensor, options: TrainOptions,
                  vocab: DraftVocabulary | None = None) -> tuple[torch.Tensor, dict]:
    """Loss of one sequence's anchors and its metrics (``ce``, ``acc1``: first-position accuracy
    of the drafter's pick, ``selector_ce`` for DFlash2, ``bce`` for DSpark). With ``vocab`` the logits are over the draft vocabulary only
    (as served); positions whose label is outside it count as misses and carry no CE."""
    size = net.cfg.block_size
    offsets = torch.arange(1, size, device=anchors.device)
    labels = seq.token_ids[anchors[:, None] + offsets]  # [N, P]
    prev = seq.token_ids[anchors[:, None] + offsets - 1]  # teacher-forced previous tokens
    hidden = net.sequence_blocks(seq.features.to(embed.dtype), seq.token_ids, anchors, embed)  # [N, P, H]
    ids = None if vocab is None else vocab.ids
    logits = net.base_logits(hidden, embed if vocab is None else vocab.head(embed))  # [N, P, V or len(ids)]
    if net.markov_head is not None:
        logits = net.markov_head.logits(hidden, prev, logits, ids)
    if vocab is not None:
        labels = vocab.row_of[labels]
    weights = position_weights(size - 1, options.decay, logits.device)
    ce = _weighted_ce(logits, labels, weights)
    with torch.no_grad():
        top_logit, drafted = logits.max(dim=-1)
    loss, metrics = ce, {"ce": float(ce.detach())}
    if net.candidate_selector is not None:
        scores, local = net.candidate_selector.teacher_forced(hidden, prev, logits, ids)  # [N, P, K]
        is_label = local == labels[..., None]
        targets = torch.where(is_label.any(-1), is_label.float().argmax(-1), DraftVocabulary.IGNORED)
        selector_ce = _weighted_ce(scores, targets, weights)
        loss = loss + options.selector_weight * selector_ce
        metrics["selector_ce"] = float(selector_ce.detach())
        drafted = local.gather(-1, scores.detach().argmax(-1, keepdim=True))[..., 0]
    hit = (drafted == labels).float()  # the drafter's pick (teacher-forced predecessor)
    metrics["acc1"] = float(hit[:, 0].mean())
    if net.confidence_head is not None:
        top_prob = torch.exp(top_logit - torch.logsumexp(logits.detach(), dim=-1))
        conf = net.confidence_head.logit(hidden.detach(), top_prob)
        bce = F.binary_cross_entropy_with_logits(conf, hit)
        metrics["bce"] = float(bce.detach())
        loss = loss + options.bce_weight * bce
    return loss, metrics


def _weighted_ce(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``logits: [N, P, C]``, ``targets: [N, P]`` (``IGNORED``: none), ``weights: [P]`` -> the
    position-weighted mean CE over the counted positions."""
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none",
                         ignore_index=DraftVocabulary.IGNORED).view(targets.shape)
    counted = weights * (targets != DraftVocabulary.IGNORED)
    return (ce * counted).sum() / counted.sum().clamp_min(1e-6)


class Trainer:
    def __init__(self, net: DraftNet, embed: torch.Tensor, sequences: list[Sequence], options: TrainOptions,
                 run_dir: str | Path, resume: bool = False, validate: Callable[[DraftNet], float] | None = None,
                 vocab: DraftVocabulary | None = None):
        size = net.cfg.block_size
        self.sequences = [s for s in sequences if s.num_anchors(size) > 0]
        if not self.sequences:
            raise ValueError(f"no training sequence has an answer anchor for block_size={size}")
        if options.steps is None and options.minutes is None:
            raise ValueError("give the number of steps or a time budget in minutes")
        self.net, self.embed, self.options = net, embed.detach(), options
        self.device = self.embed.device  # the network's, the sequences' and the vocabulary's too
        self.autocast_bf16 = options.autocast_bf16(self.device)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.optim = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=options.lr,
                                       weight_decay=options.weight_decay, betas=(0.9, 0.95))
        self.gen = torch.Generator().manual_seed(options.seed)
        self.step = 0
        self.total_steps = options.steps
        self.elapsed_s = 0.0
        self.tokens_seen = 0
        self.last_metrics: dict = {}
        self.validate = validate
        self.vocab = vocab
        self.selection = BestSnapshot()
        if resume:
            self._load_state()

    # ---- state ------------------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.run_dir / STATE_FILE

    def save_state(self) -> None:
        state = {"net": self.net.state_dict(), "optim": self.optim.state_dict(), "step": self.step,
                 "total_steps": self.total_steps, "elapsed_s": self.elapsed_s, "tokens_seen": self.tokens_seen,
                 "rng": self.gen.get_state(), "config": self.net.cfg.to_json(), "options": asdict(self.options),
                 "last_metrics": self.last_metrics, "selection": self.selection.state_dict()}
        tmp = self.state_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.state_path)

    def _load_state(self) -> None:
        if not self.state_path.is_file():
            raise FileNotFoundError(f"--resume: no training state at {self.state_path}")
        state = torch.load(self.state_path, weights_only=False, map_location="cpu")  # copied to the net's device
        if state["config"] != self.net.cfg.to_json():
            raise ValueError(f"{self.state_path}: saved for a different draft config; use another --out or drop --resume")
        self.net.load_state_dict(state["net"])
        self.optim.load_state_dict(state["optim"])
        self.step, self.elapsed_s = state["step"], state["elapsed_s"]
        self.total_steps = state["total_steps"] if self.options.steps is None else self.options.steps
        self.tokens_seen = state["tokens_seen"]
        self.gen.set_state(state["rng"])
        self.last_metrics = state.get("last_metrics", {})
        if state.get("selection"):
            self.selection.load_state_dict(state["selection"])

    # ---- schedule ---------------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        opt = self.options
        if step < opt.warmup_steps:
            return opt.lr * (step + 1) / opt.warmup_steps
        if self.total_steps is None:
            return opt.lr
        progress = min(1.0, (step - opt.warmup_steps) / max(1, self.total_steps - opt.warmup_steps))
        return opt.lr * (opt.min_lr_ratio + (1 - opt.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))

    def _budget_s(self) -> float | None:
        return None if self.options.minutes is None else self.options.minutes * 60

    def _finished(self) -> bool:
        if self.total_steps is not None and self.step >= self.total_steps:
            return True
        budget = self._budget_s()
        return budget is not None and self.elapsed_s >= budget

    # ---- one step ---------------------------------------------------------------------------
    def sample_batch(self) -> list[tuple[Sequence, torch.Tensor]]:
        size = self.net.cfg.block_size
        picks = torch.randint(len(self.sequences), (self.options.seqs_per_step,), generator=self.gen).tolist()
        batch = []
        for i in picks:
            seq = self.sequences[i]
            count = seq.num_anchors(size)
            chosen = torch.randperm(count, generator=self.gen)[: self.options.anchors_per_seq]
            batch.append((seq, (torch.sort(chosen).values + max(seq.answer_start, 1)).to(self.device)))
        return batch

    def train_step(self) -> dict:
        lr = self.lr_at(self.step)
        for group in self.optim.param_groups:
            group["lr"] = lr
        self.net.train()
        self.optim.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        batch = self.sample_batch()
        for seq, anchors in batch:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast_bf16):
                loss, metrics = sequence_loss(self.net, self.embed, seq, anchors, self.options, self.vocab)
            (loss / len(batch)).backward()
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + value / len(batch)
            self.tokens_seen += len(anchors) * (self.net.cfg.block_size - 1)
        norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.options.grad_clip)
        self.optim.step()
        self.step += 1
        totals.update(lr=lr, grad_norm=float(norm))
        self.last_metrics = totals
        return totals

    def train(self, progress: bool = True, stop_after: int | None = None) -> dict:
        """Runs until the schedule or the time budget ends (or, for tests, ``stop_after`` more
        steps), saving the state periodically and at the end. Returns the last metrics."""
        opt = self.options
        bar = tqdm(total=self.total_steps, initial=self.step, desc="train", unit="step", disable=not progress,
                   dynamic_ncols=True)
        last_save = last_log = last_validation = time.monotonic()
        calib_start = (self.step, self.elapsed_s)
        done_now = 0
        try:
            while not self._finished() and (stop_after is None or done_now < stop_after):
                started = time.monotonic()
                metrics = self.train_step()
                self.elapsed_s += time.monotonic() - started
                done_now += 1
                window = self.step - calib_start[0]
                if opt.steps is None and (self.total_steps is None and window >= opt.calibrate_steps
                                          or window >= opt.recalibrate_steps):
                    # time budget: fit the schedule to the recent step time (the CPU may be shared)
                    per_step = (self.elapsed_s - calib_start[1]) / window
                    remaining = max(0.0, self._budget_s() - self.elapsed_s)
                    self.total_steps = self.step + max(1, int(remaining / per_step))
                    calib_start = (self.step, self.elapsed_s)
                    bar.reset(total=self.total_steps)
                    bar.update(self.step)
                else:
                    bar.update(1)
                bar.set_postfix({k: f"{v:.3g}" for k, v in metrics.items() if k in ("ce", "acc1", "bce", "lr")})
                if time.monotonic() - last_log >= opt.log_every_s:
                    last_log = time.monotonic()
                    eta = (self.total_steps - self.step) * self.elapsed_s / max(self.step, 1) if self.total_steps else float("nan")
                    log.info("step %d/%s %s eta %.1f min", self.step, self.total_steps,
                             " ".join(f"{k}={v:.4g}" for k, v in metrics.items()), eta / 60)
                if (self.validate is not None and opt.validate_every_s is not None
                        and time.monotonic() - last_validation >= opt.validate_every_s):
                    self._score()
                    last_validation = time.monotonic()
                if time.monotonic() - last_save >= opt.save_every_s:
                    self.save_state()
                    last_save = time.monotonic()
        finally:
            bar.close()
            self.save_state()
        return self.last_metrics

    # ---- model selection ----------------------------------------------------------------------
    def _score_current(self) -> None:
        if not self.selection.scored(self.step):
            self._score()

    def _score(self) -> None:
        score = self.validate(self.net)
        best = self.selection.offer(self.step, self.elapsed_s / 60, score, self.net)
        log.info("validation at step %d: mean acceptance length %.4f%s", self.step, score, " (best)" if best else "")

    def keep_last(self) -> dict | None:
        """Like ``select_best`` but keeps the current (last) weights: scores them unless already
        scored and returns ``{"step", "score", "history"}`` of them (None without a scorer)."""
        if self.validate is None:
            return None
        self._score_current()
        score = next(h["score"] for h in self.selection.history if h["step"] == self.step)
        return {"step": self.step, "score": score, "history": self.selection.history}

    def select_best(self) -> dict | None:
        """Scores the current weights (unless already scored at this step), restores the best
        ones and returns ``{"step", "score", "history"}`` of the choice (None without a scorer)."""
        if self.validate is None:
            return None
        self._score_current()
        self.selection.restore(self.net)
        log.info("selected the weights of step %d (validation %.4f) of %d", self.selection.best_step,
                 self.selection.best_score, self.step)
        return {"step": self.selection.best_step, "score": self.selection.best_score,
                "history": self.selection.history}
