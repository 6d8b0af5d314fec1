"""Target hidden states for drafter training: one dense prefill of a whole sequence through our
own model, in chunks, over a scratch paged pool (the serving path's attention, no engine)."""

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


@torch.inference_mode()
def target_features(model: LlamaModel, token_ids: list[int], layers: tuple[int, ...], chunk_tokens: int = 512) -> torch.Tensor:
    """Returns ``features: [T, len(layers) * hidden]``: the hidden states after each of
    ``layers`` at every position, as the engine's ``capture_layers`` gives them. No logits are
    computed (the LM head is ~20% of this model's prefill FLOPs, and training reads the
    distilled answers, not the target's argmax). Runs where the model's weights are (CPU or
    GPU); the features come back on the CPU."""
    cfg = model.config
    length = len(token_ids)
    num_pages = -(-length // PAGE_SIZE)
    pool = HotPool(cfg.num_layers, num_pages, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, model.dtype,
                   device=model.device)
    attention = PagedAttention(pool, cfg.num_heads, model.scale)
    slots = list(range(num_pages))
    features = []
    no_logits = torch.empty(0, dtype=torch.int64, device=model.device)
    for start in range(0, length, chunk_tokens):
        end = min(start + chunk_tokens, length)
        positions = list(range(start, end))
        meta = AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.int64),
            write_rows=torch.tensor(positions, dtype=torch.int64),  # slot s holds rows s*16 ..
            groups=[build_group(0, [positions], [slots], [end], PAGE_SIZE)],
        )
        ids = torch.tensor(token_ids[start:end], dtype=torch.int64)
        _, feats = model.forward(ids.to(model.device), meta.to(model.device), attention,
                                 logit_rows=no_logits, capture_layers=tuple(layers))
        features.append(feats.cpu())
    return torch.cat(features)
