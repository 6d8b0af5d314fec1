"""transformers on the same GGUF as a peer: its model loaded from the file (dequantized to
``dtype``), greedy ``generate`` with or without prompt-lookup assisted decoding.

Prompt lookup (``generate(prompt_lookup_num_tokens=N)``) is transformers' n-gram speculation:
it drafts the ``N`` tokens that followed the last match of the newest n-gram (at most
``max_matching_ngram_size``, default 2) in the prompt and output so far, and verifies them in one
forward. Assisted generation in transformers takes one sequence at a time.
"""

from __future__ import annotations

from pathlib import Path

import torch

from services.decoder.config import DTYPES


def load_transformers(model_path: Path, dtype: str = "float32", device: str = "cpu"):
    """``AutoModelForCausalLM`` from the GGUF file ``model_path``, in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                                dtype=DTYPES[dtype]).eval().to(device)


@torch.no_grad()
def greedy(hf, prompt: list[int], max_new_tokens: int, eos_token_ids: tuple[int, ...],
           lookup_tokens: int | None = None) -> list[int]:
    """The new token ids of one greedy generation (ending with an eos id when one stopped it);
    with ``lookup_tokens``, through prompt-lookup assisted decoding of that many draft tokens."""
    ids = torch.tensor([prompt], device=hf.device)
    extra = {"prompt_lookup_num_tokens": lookup_tokens} if lookup_tokens else {}
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                      eos_token_id=list(eos_token_ids), pad_token_id=eos_token_ids[0], **extra)
    # assisted generation may return one token past max_new_tokens (its last verify's bonus): not counted
    return out[0, len(prompt) : len(prompt) + max_new_tokens].tolist()
