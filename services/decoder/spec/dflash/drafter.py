"""The engine's DFlash / DFlash2 / DSpark drafter.

Per request it keeps a ``DraftContext``: the draft layers' keys/values of the last
``context_window`` committed positions (a ring; see ``model.py``). That bounds the drafter's
own cache: at 100K tokens it still holds ``window`` positions per request, and the target's
tiered KV is what carries the long context. One forward pass drafts a block for every request
of the step at once.

Observation is lazy: ``observe`` only keeps the committed positions' target features (at most
``window`` rows per request, the ones the ring would keep: ``PendingFeatures``); they are
projected into the ring when the request next drafts (``propose_batch``, all pending requests in
one pass). While the adaptive verify budget finds that no draft pays, the drafter then costs one
copy of the step's committed feature rows, not a pass through its context projection.
"""

from __future__ import annotations

from pathlib import Path

import torch

from services.decoder.model.gemm_plan import GemmPlan
from services.decoder.model.linear import Linear
from services.decoder.spec.dflash.checkpoint import (
    load_checkpoint,
    read_draft_vocab,
    read_heldout_acceptance_length,
)
from services.decoder.spec.dflash.config import DraftCheckpointError
from services.decoder.spec.dflash.layers import pack_linears
from services.decoder.spec.dflash.model import DraftContext, DraftNet
from services.decoder.spec.dflash.pending_features import PendingFeatures
from services.decoder.spec.drafter import Draft, Drafter, DraftRequest
from services.decoder.spec.verify_budget import survival_from_acceptance_length

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "drafters"


DEFAULT_TARGET = "smollm2-135m-instruct"  # the only target with shipped drafters


# checkpoint kinds each --spec method loads (--spec dflash takes a DFlash2 checkpoint too: its
# config switches the additions on)
SERVES = {"dflash": ("dflash", "dflash2"), "dflash2": ("dflash2",), "dspark": ("dspark",)}


def shipped_checkpoint(kind: str) -> Path:
    """The ``dflash``, ``dflash2`` or ``dspark`` checkpoint this repository ships for the default model
    (``from_checkpoint`` refuses it, naming the mismatch, for any other target)."""
    return SHIPPED_DIR / f"{DEFAULT_TARGET}-{kind}"


class DFlashDrafter(Drafter):
    # every kind scores its picks: DSpark with its confidence head, DFlash / DFlash2 with the
    # pick's own softmax probability. On code_edit (DFlash, one-token drafts, 324 verified)
    # picks below 0.5 survived 15 of 240 times, those above 48 of 84: what the budget, once
    # calibrated, keeps or cuts after the call, and pools without a request's own grudge
    has_confidences = True
    OBSERVE_EVERY = 8  # steps whose features are kept whole before ``pending`` takes their rows
    OBSERVE_ROWS = 512  # ... or fewer steps when their features reach this many rows

    def __init__(self, net: DraftNet, embed: torch.Tensor, lm_head: torch.Tensor, vocab: torch.Tensor | None = None,
                 gemm_dtype: torch.dtype | None = None, gemm_plan: GemmPlan | None = None,
                 target_head: Linear | None = None):
        """``embed: [V, H]`` and ``lm_head: [V, H]``: the target's (shared, not copied). With a
        draft vocabulary ``vocab: [N]`` the drafter keeps a copy of just those head rows.
        ``gemm_dtype``: the draft layers' and the head's matmul precision (default: ``lm_head``'s);
        ``gemm_plan``: their kernel per row count (the target's, measured on the same CPU and input
        widths; pass it only for the target's matmul precision); ``target_head``: the target's LM
        head ``Linear`` (over ``lm_head``), which the drafter then shares without a draft
        vocabulary, in the same precision, instead of keeping a second set of its kernels' copies."""
        self.net = net
        pack_linears(net, gemm_dtype, gemm_plan)  # a block's rows through the planned kernels (served, not trained, here)
        self.cfg = net.cfg
        self.name = net.cfg.kind
        self.embed = embed
        self.vocab = vocab
        self.lm_head = lm_head if vocab is None else lm_head[vocab].contiguous()
        head_dtype = gemm_dtype or lm_head.dtype
        if vocab is None and target_head is not None and head_dtype == lm_head.dtype:
            if target_head.weight is not lm_head:
                raise ValueError("target_head must be the Linear over lm_head")
            self.head = target_head
        else:
            self.head = Linear(self.lm_head.to(head_dtype), plan=gemm_plan)
        markov = net.markov_head
        with torch.no_grad():  # the Markov head's successor rows of the draft vocabulary, gathered once
            self.successors = None if markov is None or vocab is None else markov.successor_codebook[vocab].contiguous()
        self.feature_layers = tuple(net.cfg.target_layer_ids)
        self.dtype = net.fc.weight.dtype
        self.contexts: dict[str, DraftContext] = {}
        self.pending = PendingFeatures(net.cfg.context_window)  # observed features not yet in the ring
        self._unstored: list[tuple[torch.Tensor, list]] = []  # steps observed, not yet in ``pending``
        self._unstored_rows = 0

    @classmethod
    def from_checkpoint(cls, directory: str | Path, target, expected_kind: str,
                        gemm_dtype: torch.dtype | None = None) -> DFlashDrafter:
        """The drafter in ``directory`` for ``target`` (a ``LlamaModel``), its matmuls in
        ``gemm_dtype`` (None: the target's; another precision runs its default kernels, the
        target's GEMM plan being measured for the target's)."""
        net = load_checkpoint(directory, dtype=target.dtype)
        kind = net.cfg.kind
        if kind not in SERVES[expected_kind]:
            raise DraftCheckpointError(f"{directory} holds a {kind} drafter, not {expected_kind}")
        cfg = target.config
        net.cfg.check_target(cfg.num_layers, cfg.hidden_size, cfg.vocab_size)
        gemm_dtype = gemm_dtype or target.gemm_dtype
        drafter = cls(net, target.embed_tokens, target.lm_head.weight, read_draft_vocab(directory, cfg.vocab_size),
                      gemm_dtype, target.gemm_plan if gemm_dtype == target.gemm_dtype else None, target.lm_head)
        heldout = read_heldout_acceptance_length(directory)
        if heldout is not None:
            try:
                drafter.prior_acceptance = survival_from_acceptance_length(heldout, drafter.max_draft_tokens)
            except ValueError as exc:
                raise DraftCheckpointError(f"{directory}: {exc}") from None
        return drafter

    @property
    def max_draft_tokens(self) -> int:
        return self.cfg.block_size - 1

    def observe(self, request_id: str, start: int, features: torch.Tensor) -> None:
        self.observe_batch(features, [(request_id, start, 0, len(features))])

    def observe_batch(self, features: torch.Tensor, items: list[tuple[str, int, int, int]]) -> None:
        """Keeps the step's ``features`` (a tensor the step made: the model's concatenated
        capture) as they are; the store takes their committed rows every ``OBSERVE_EVERY`` steps
        (or ``OBSERVE_ROWS`` rows), or before anything reads it. After a step's forward every
        Python and tensor operation runs cold (a 16-item loop and a copy took ~230 us there against
        ~40 alone), so one pass per few steps, not per step, is what a resting drafter costs."""
        self._unstored.append((features, items))
        self._unstored_rows += len(features)
        if len(self._unstored) >= self.OBSERVE_EVERY or self._unstored_rows >= self.OBSERVE_ROWS:
            self._store()

    def _store(self) -> None:
        """Hands the kept steps' committed rows to ``pending`` (one copy per step: a decode
        step's features go in whole, where gathering the steps into one tensor first read and
        wrote every row twice more)."""
        steps, self._unstored, self._unstored_rows = self._unstored, [], 0
        for features, items in steps:
            for request_id, *_ in items:
                if request_id not in self.contexts:
                    self.contexts[request_id] = DraftContext(self.cfg, self.dtype)
            for request_id, start, replaced in self.pending.add_step(features, [item for item in items if item[3]]):
                context = self.contexts[request_id]
                if replaced or start != context.end:
                    context.end = -1  # a jump (recompute, resume): the ring is rebuilt at the flush

    def context(self, request_id: str) -> DraftContext:
        """The request's ring with every observed position in it (flushes what is pending)."""
        self._flush([request_id])
        return self.contexts[request_id]

    def prepare(self, request_ids: list[str]) -> int:
        return self._flush(request_ids)

    def _flush(self, request_ids: list[str]) -> int:
        """Projects the requests' pending features into their rings; returns the positions
        projected (the ring keeps at most its window of each)."""
        self._store()
        items = []
        for request_id in request_ids:
            held = self.pending.take(request_id)
            if held is not None:
                items.append((self.contexts[request_id], *held))
        if items:
            with torch.inference_mode():
                DraftContext.append_all(self.net, items)
        return sum(min(len(rows), context.slot_pos.shape[0]) for context, _, rows in items)

    def release(self, request_id: str) -> None:
        self._store()
        self.contexts.pop(request_id, None)
        self.pending.drop(request_id)

    @torch.inference_mode()
    def propose_batch(self, requests: list[DraftRequest]) -> list[Draft]:
        drafts = [Draft([]) for _ in requests]
        self._store()
        rows = [i for i, r in enumerate(requests) if r.max_tokens > 0 and r.request_id in self.contexts]
        if not rows:
            return drafts
        self._flush([requests[i].request_id for i in rows])
        cfg = self.cfg
        size = cfg.block_size
        contexts = [self.contexts[requests[i].request_id] for i in rows]
        anchors = torch.tensor([requests[i].anchor_position for i in rows], dtype=torch.int64)
        used = max(c.num_used_slots for c in contexts)  # slots beyond it are empty in every ring
        slot_pos = torch.stack([c.slot_pos[:used] for c in contexts])  # [R, used]
        ctx_visible = (slot_pos >= 0) & (slot_pos < anchors[:, None]) & (slot_pos >= anchors[:, None] - cfg.context_window)
        mask = torch.cat([ctx_visible[:, None, :].expand(-1, size, -1), torch.ones(len(rows), size, size, dtype=torch.bool)], dim=2)
        ctx_kv = [(torch.stack([c.k[layer, :used] for c in contexts]), torch.stack([c.v[layer, :used] for c in contexts]))
                  for layer in range(cfg.num_layers)]
        anchor_ids = torch.tensor([requests[i].token_ids[-1] for i in rows], dtype=torch.int64)
        x = self.net.block_embeddings(anchor_ids, self.embed)
        hidden = self.net.blocks_hidden(x, anchors[:, None] + torch.arange(size), ctx_kv, mask)
        # the heads pick left to right, so the positions no request asked for need no head rows
        # (the block itself stays whole: its attention is bidirectional)
        hidden = hidden[:, : min(size - 1, max(requests[i].max_tokens for i in rows))]
        raw = self.head(hidden.reshape(-1, hidden.shape[-1])).view(*hidden.shape[:2], -1)  # [R, P, N]
        tokens, confidences = self.net.choose_from_logits(hidden, self.net.scale_logits(raw), anchor_ids, self.vocab,
                                                          self.successors)
        for row, i in enumerate(rows):
            n = min(requests[i].max_tokens, size - 1)
            drafts[i] = Draft(tokens[row, :n].tolist(), confidences[row, :n].tolist())
        return drafts
