"""The draft network: DFlash (and DFlash2, DSpark) block drafter conditioned on target features.

Context: the target's hidden states after layers ``target_layer_ids`` at each committed
position, concatenated (``[T, F]``, ``F = len(ids) * H``), projected once by ``fc`` +
``hidden_norm`` to ``[T, H]``; every draft layer turns them into its own keys/values.
Block: the anchor (the last committed token, whose K/V the target has not computed yet) at
position ``a`` plus ``block_size - 1`` mask tokens at ``a+1 ..``, embedded with the target's
embeddings; one forward pass attends over the context window ``[a - window, a)`` and the whole
block (bidirectional), and positions ``1 ..`` predict tokens ``a+1 ..``.

The same code serves inference (``DraftContext`` rings per request, ``drafter.py``) and training
(``sequence_blocks``: many anchors of one sequence in one pass).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.decoder.spec.dflash.config import DraftConfig
from services.decoder.spec.dflash.heads import (
    CandidateSelector,
    ConfidenceHead,
    MarkovHead,
)
from services.decoder.spec.dflash.layers import DraftLayer, FusedLinear, RMSNorm, rope_tables


class DraftNet(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.fc = nn.Linear(cfg.feature_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.candidate_selector = None
        if cfg.selector_rank is not None:
            self.candidate_selector = CandidateSelector(cfg.vocab_size, cfg.hidden_size, cfg.selector_rank, cfg.selector_top_k)
        self.markov_head = None
        if cfg.markov_rank is not None:
            self.markov_head = MarkovHead(cfg.vocab_size, cfg.hidden_size, cfg.markov_rank)
        self.confidence_head = ConfidenceHead(cfg.hidden_size) if cfg.confidence_head else None
        self.context_projection: FusedLinear | None = None  # serving: every layer's context k, v in one matmul

    def fuse(self, gemm_dtype: torch.dtype | None = None, gemm_plan=None) -> None:
        """Serving (``pack_linears``): the context's keys and values of all draft layers in one matmul."""
        self.context_projection = FusedLinear([p for layer in self.layers for p in (layer.self_attn.k_proj,
                                                                                   layer.self_attn.v_proj)],
                                              gemm_dtype, gemm_plan)

    # ---- building blocks -----------------------------------------------------------------
    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta, self.fc.weight.dtype)

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``features: [..., F]`` at ``positions: [...]`` -> per layer ``(k, v)``, each
        ``[..., kv_heads, head_dim]`` (rotated keys; a request's cacheable draft context)."""
        ctx = self.hidden_norm(self.fc(features))
        cos, sin = self.rope(positions)
        if self.context_projection is None:
            return [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers]
        kv = self.context_projection(ctx)  # k, v of layer 0, then of layer 1, ...
        return [layer.self_attn.rotated_kv(kv[2 * i], kv[2 * i + 1], cos, sin) for i, layer in enumerate(self.layers)]

    def block_embeddings(self, anchor_ids: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """``anchor_ids: [B]`` -> the blocks' inputs ``[B, block_size, H]``: anchor, then masks."""
        cfg = self.cfg
        ids = torch.full((anchor_ids.shape[0], cfg.block_size), cfg.mask_token_id, dtype=torch.int64,
                         device=anchor_ids.device)
        ids[:, 0] = anchor_ids
        return F.embedding(ids, embed) * cfg.input_embedding_scale

    def blocks_hidden(self, x, positions, ctx_kv, mask) -> torch.Tensor:
        """``x: [B, S, H]`` block inputs at ``positions: [B, S]``, ``ctx_kv``: per layer
        ``(k, v): [G, C, kv_heads, head_dim]``, ``mask: [G, Q, C + Q]`` -> normed hidden of the
        drafted positions ``[B, S - 1, H]``."""
        cos, sin = self.rope(positions)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x[:, 1:])

    def base_logits(self, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """``hidden: [..., H]``, ``lm_head: [V, H]`` (the target's) -> ``[..., V]`` fp32."""
        return self.scale_logits(F.linear(hidden, lm_head))

    def scale_logits(self, raw: torch.Tensor) -> torch.Tensor:
        """The head's raw outputs ``[..., V]`` -> the draft logits, fp32 (multiplier, soft cap)."""
        logits = raw.float() * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def choose(self, hidden: torch.Tensor, anchor_ids: torch.Tensor, lm_head: torch.Tensor,
               vocab: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden: [B, P, H]`` -> draft tokens ``[B, P]`` and their confidences ``[B, P]``: the
        confidence head's survival probabilities, or without one the probability the drafter's
        own distribution gives each pick (a raw score the serving budget calibrates against
        measured survival: ``ConfidenceCalibration``). With ``vocab: [N]`` token
        ids, drafts come from those tokens only and ``lm_head`` holds just their rows
        (``[N, H]``): a smaller head matmul per drafted position; verification stays exact."""
        return self.choose_from_logits(hidden, self.base_logits(hidden, lm_head), anchor_ids, vocab)

    def choose_from_logits(self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor,
                           vocab: torch.Tensor | None = None, successors: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
        """``choose`` from the base logits ``[B, P, N]`` already computed (by a serving path's own
        head matmul); ``successors``: the Markov head's codebook rows of ``vocab``, when the caller
        keeps them (else gathered here)."""
        if self.markov_head is not None:
            tokens, top_prob = self.markov_head.select(hidden, logits, anchor_ids, vocab, successors)
        elif self.candidate_selector is not None:
            tokens, top_prob = self.candidate_selector.select(hidden, logits, anchor_ids, vocab)
        else:
            top_logit, local = logits.max(dim=-1)
            tokens = local if vocab is None else vocab[local]
            top_prob = torch.exp(top_logit - torch.logsumexp(logits, dim=-1))
        if self.confidence_head is None:
            return tokens, top_prob
        return tokens, torch.sigmoid(self.confidence_head.logit(hidden, top_prob))

    # ---- training: many anchors of one sequence in one pass ---------------------------------
    def sequence_blocks(self, features: torch.Tensor, token_ids: torch.Tensor, anchors: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
        """``features: [T, F]`` and ``token_ids: [T]`` of one sequence, ``anchors: [N]`` positions
        (each ``>= 1``) -> hidden of the drafted positions ``[N, S - 1, H]``. Block ``n``
        sees context positions ``[a_n - window, a_n)``, exactly what inference sees."""
        cfg = self.cfg
        length = features.shape[0]
        size = cfg.block_size
        device = features.device  # token_ids and anchors live there too
        key_pos = torch.arange(length, device=device)
        ctx_kv = [(k[None], v[None]) for k, v in self.context_kv(features, key_pos)]
        positions = anchors[:, None] + torch.arange(size, device=device)  # [N, S]
        ctx_visible = (key_pos[None] < anchors[:, None]) & (key_pos[None] >= anchors[:, None] - cfg.context_window)
        block_of = torch.arange(anchors.shape[0], device=device).repeat_interleave(size)  # [N * S]
        mask = torch.cat([ctx_visible.repeat_interleave(size, dim=0), block_of[:, None] == block_of[None]], dim=1)
        x = self.block_embeddings(token_ids[anchors], embed)
        return self.blocks_hidden(x, positions, ctx_kv, mask[None])


class DraftContext:
    """One request's draft context: a ring of the last ``window`` positions' per-layer keys and
    values (already rotated), so it never grows with the request. Memory per request:
    ``2 * layers * window * kv_heads * head_dim`` values."""

    def __init__(self, cfg: DraftConfig, dtype: torch.dtype):
        shape = (cfg.num_layers, cfg.context_window, cfg.num_kv_heads, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.slot_pos = torch.full((cfg.context_window,), -1, dtype=torch.int64)  # position held, -1 empty
        self.end = 0  # next position expected

    @property
    def num_used_slots(self) -> int:
        """Slots ``0 .. n`` can hold positions, the rest are empty: the ring fills slot
        ``p % window`` for position ``p``, so until a position past the window arrives only the
        slots below ``end`` do (a rebuilt ring starting past the window uses them all)."""
        return self.slot_pos.shape[0] if self.end > self.slot_pos.shape[0] or self.end < 0 else self.end

    def append(self, net: DraftNet, start: int, features: torch.Tensor) -> None:
        """Adds the features of positions ``start .. start + n``. A start other than ``end``
        (a recomputed or resumed request) drops what the ring held first."""
        DraftContext.append_all(net, [(self, start, features)])

    @staticmethod
    def append_all(net: DraftNet, items: list[tuple[DraftContext, int, torch.Tensor]]) -> None:
        """``append`` for several contexts with one ``context_kv`` pass over all their rows
        (the step's requests together: one projection instead of one per request)."""
        if not items:
            return
        kept = []
        for context, start, features in items:
            if start != context.end:
                context.slot_pos.fill_(-1)
            window = context.slot_pos.shape[0]
            count = features.shape[0]
            if count > window:
                start, features, count = start + count - window, features[count - window :], window
            kept.append((context, start, features, count))
        dtype = kept[0][0].k.dtype
        positions = torch.cat([torch.arange(start, start + count) for _, start, _, count in kept])
        rows = torch.cat([features for _, _, features, _ in kept]).to(dtype)
        per_layer = net.context_kv(rows, positions)
        offset = 0
        for context, start, _, count in kept:
            window = context.slot_pos.shape[0]
            pos = positions[offset : offset + count]
            slots = pos % window
            for layer, (k, v) in enumerate(per_layer):
                context.k[layer, slots] = k[offset : offset + count]
                context.v[layer, slots] = v[offset : offset + count]
            context.slot_pos[slots] = pos
            context.end = start + count
            offset += count
