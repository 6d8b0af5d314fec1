"""Target hidden states for drafter training: dense prefills of whole sequences through our own
model, over a scratch paged pool (the serving path's attention, no engine). A long sequence runs
alone in chunks; short ones run several to a forward (one ragged group), which is what makes
extraction fast on a GPU, where a 135M model's forward is launch-bound."""

from __future__ import annotations

import torch

from services.decoder.kv.hot_pool import HotPool
from services.decoder.model.attention import (
    AttentionMetadata,
    PagedAttention,
    build_group,
)
from services.decoder.model.llama import LlamaModel

PAGE_SIZE = 16
CHUNK_TOKENS = 512  # a longer sequence is prefilled alone, chunk by chunk


def _pages(length: int) -> int:
    return -(-length // PAGE_SIZE)


def _attention(model: LlamaModel, num_pages: int) -> PagedAttention:
    """Paged attention over a scratch pool of ``num_pages`` pages on the model's device."""
    cfg = model.config
    pool = HotPool(cfg.num_layers, num_pages, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, model.dtype,
                   device=model.device)
    return PagedAttention(pool, cfg.num_heads, model.scale)


@torch.inference_mode()
def target_features(model: LlamaModel, token_ids: list[int], layers: tuple[int, ...],
                    chunk_tokens: int = CHUNK_TOKENS) -> torch.Tensor:
    """Returns ``features: [T, len(layers) * hidden]``: the hidden states after each of
    ``layers`` at every position, as the engine's ``capture_layers`` gives them. No logits are
    computed (the LM head is ~20% of this model's prefill FLOPs, and training reads the
    distilled answers, not the target's argmax). Runs where the model's weights are (CPU or
    GPU); the features come back on the CPU."""
    length = len(token_ids)
    pages = list(range(_pages(length)))
    attention = _attention(model, len(pages))
    features = []
    for start in range(0, length, chunk_tokens):
        end = min(start + chunk_tokens, length)
        features += _forward(model, attention, [token_ids[start:end]], [start], [pages], layers)
    return torch.cat(features)


@torch.inference_mode()
def batch_target_features(model: LlamaModel, sequences: list[list[int]], layers: tuple[int, ...]) -> list[torch.Tensor]:
    """``target_features`` of several whole sequences (each at most ``CHUNK_TOKENS`` long) in one
    forward (one ragged group): sequence r's queries are its positions 0..T_r-1 and its keys its
    own pages only, so each result equals that sequence's ``target_features`` up to reduction
    order. Returns ``[T_r, len(layers) * hidden]`` per sequence, in order, on the CPU."""
    if any(not 0 < len(ids) <= CHUNK_TOKENS for ids in sequences):
        raise ValueError(f"batch_target_features takes non-empty sequences of at most {CHUNK_TOKENS} tokens")
    counts = [_pages(len(ids)) for ids in sequences]
    firsts = [sum(counts[:r]) for r in range(len(sequences))]
    pages = [list(range(first, first + n)) for first, n in zip(firsts, counts)]
    return _forward(model, _attention(model, sum(counts)), sequences, [0] * len(sequences), pages, layers)


def _forward(model: LlamaModel, attention: PagedAttention, pieces: list[list[int]], starts: list[int],
             pages: list[list[int]], layers: tuple[int, ...]) -> list[torch.Tensor]:
    """One prefill forward: request r writes ``pieces[r]`` at positions ``starts[r]`` on into its
    pool ``pages[r]`` (logical page order) and attends to everything before them there. Returns
    the captured features per piece, on the CPU."""
    positions = [list(range(start, start + len(ids))) for ids, start in zip(pieces, starts)]
    rows = [pages[r][p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for r, span in enumerate(positions) for p in span]
    meta = AttentionMetadata(
        positions=torch.tensor([p for span in positions for p in span], dtype=torch.int64),
        write_rows=torch.tensor(rows, dtype=torch.int64),
        groups=[build_group(0, positions, pages, [span[-1] + 1 for span in positions], PAGE_SIZE)],
    )
    ids = torch.tensor([t for piece in pieces for t in piece], dtype=torch.int64)
    _, feats = model.forward(ids.to(model.device), meta.to(model.device), attention,
                             logit_rows=torch.empty(0, dtype=torch.int64, device=model.device),
                             capture_layers=tuple(layers))
    return list(feats.cpu().split([len(ids) for ids in pieces]))
