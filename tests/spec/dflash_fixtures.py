"""Small random draft checkpoints for the default target (hidden 576, vocab 49152, 30 layers)."""

from __future__ import annotations

import torch

from services.decoder.spec.dflash.checkpoint import save_checkpoint
from services.decoder.spec.dflash.config import DraftConfig
from services.decoder.spec.dflash.model import DraftNet

KIND_FIELDS = {
    "dflash": {},
    "dflash2": dict(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=4),
    "dspark": dict(markov_rank=16, confidence_head=True),
}


def tiny_config(kind: str = "dflash", **overrides) -> DraftConfig:
    fields = dict(hidden_size=576, num_layers=1, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=256,
                  rms_norm_eps=1e-5, rope_theta=100000.0, vocab_size=49152, block_size=8, mask_token_id=16,
                  target_layer_ids=(2, 15, 28), context_window=64)
    fields.update(KIND_FIELDS[kind])
    fields.update(overrides)
    return DraftConfig(**fields)


def random_net(cfg: DraftConfig, seed: int = 0) -> DraftNet:
    torch.manual_seed(seed)
    net = DraftNet(cfg)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0, 0.1)  # norm weights
            else:
                p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5)
    return net.eval()


def write_random_checkpoint(directory, kind: str = "dflash", seed: int = 0, **overrides):
    return save_checkpoint(random_net(tiny_config(kind, **overrides), seed), directory)
