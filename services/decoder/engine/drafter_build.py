"""The engine's drafter, built from the decoder's config: which drafter, which checkpoint, and the
precision of its matmuls."""

from __future__ import annotations

import torch

from services.decoder.config import DTYPES, DecoderConfig
from services.decoder.model.linear import onednn_bf16_supported
from services.decoder.model.llama import LlamaModel
from services.decoder.spec.dflash.drafter import shipped_checkpoint
from services.decoder.spec.drafter import LEARNED_DRAFTERS, Drafter, make_drafter


def draft_gemm_dtype(option: str, target_gemm_dtype: torch.dtype) -> torch.dtype:
    """The drafter's matmul precision for the config option ``draft_gemm_dtype``."""
    if option == "auto":
        return torch.bfloat16 if onednn_bf16_supported() else target_gemm_dtype
    return DTYPES[option]


def build_drafter(config: DecoderConfig, target: LlamaModel) -> Drafter | None:
    if config.spec == "ngram":
        return make_drafter("ngram", min_n=config.ngram_min_n, max_n=config.ngram_max_n)
    if config.spec in LEARNED_DRAFTERS:
        checkpoint = config.draft_model or shipped_checkpoint(config.spec)
        return make_drafter(config.spec, target=target, checkpoint=checkpoint,
                            gemm_dtype=draft_gemm_dtype(config.draft_gemm_dtype, target.gemm_dtype))
    return make_drafter(config.spec)
